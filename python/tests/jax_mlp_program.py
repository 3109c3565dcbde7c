"""The "user code" of the JAX capture test: a tiny MLP trained with plain SGD.

Kept in its own file so that the source lines recorded in the capture stay stable; a later
test runs memlsp on the capture and may point at these lines. Not donated on purpose (the
step writes new parameters while the old ones are still alive), like real code often is.
"""

import jax
import jax.numpy as jnp

BATCH, D_IN, HIDDEN, D_OUT = 64, 128, 256, 16


def init_params(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (D_IN, HIDDEN)) * 0.05,
        "b1": jnp.zeros((HIDDEN,)),
        "w2": jax.random.normal(k2, (HIDDEN, D_OUT)) * 0.05,
        "b2": jnp.zeros((D_OUT,)),
    }


def mlp(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])  # hidden activations
    return h @ params["w2"] + params["b2"]


def loss_fn(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
    return params, loss


train_step_jit = jax.jit(train_step)  # no donate_argnums


def batch(key):
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, (BATCH, D_IN)), jax.random.normal(ky, (BATCH, D_OUT))
