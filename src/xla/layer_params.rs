//! How many layers an unrolled JAX model has, from its repeated parameter structure.
//!
//! A Python loop over layers (`for p in params: x = layer(p, x)`) leaves no loop in the HLO,
//! and the buffers one line keeps at the peak need not repeat once per layer (a remat'd layer's
//! recomputed values are scheduled differently from the originals). Its parameters do: every
//! layer has the same leaves (`params[2]['wqkv']`, f32[256,768]): leaves whose paths differ
//! only in a list index (`[2]`, the layer) and share a shape repeat once per layer (read names
//! and shapes, inferred layers). Leaves of one block that merely share a shape (`wq`, `wk`,
//! `wv`) have different paths and do not count, nor do numbered names (flax's `Dense_0`,
//! `Dense_1` are two modules of one block as often as two layers).

use crate::xla::donation::arg_root;
use crate::xla::plan::Plan;

/// The most common repeat count of (leaf path without its numbers, shape) among the plan's
/// pytree parameters (the larger on a tie); `None` when none repeats.
pub fn count(p: &Plan) -> Option<u64> {
    let mut kinds: Vec<((String, String), u64)> = Vec::new();
    for x in &p.parameters {
        let root = arg_root(&x.op_name);
        if root.is_empty() || root.len() == x.op_name.len() {
            continue;
        }
        let _ = root;
        let path = without_indices(&x.op_name);
        let key = (path, crate::xla::hlo::without_layout(&x.shape));
        match kinds.iter_mut().find(|k| k.0 == key) {
            Some(k) => k.1 += 1,
            None => kinds.push((key, 1)),
        }
    }
    let mut freq: Vec<(u64, usize)> = Vec::new();
    for (_, c) in kinds.iter().filter(|k| k.1 >= 2) {
        match freq.iter_mut().find(|f| f.0 == *c) {
            Some(f) => f.1 += 1,
            None => freq.push((*c, 1)),
        }
    }
    freq.iter().max_by_key(|f| (f.1, f.0)).map(|f| f.0)
}

/// `params[2]['wqkv']` → `params[#]['wqkv']`: list indices out of a pytree path.
fn without_indices(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && rest[digits..].starts_with(']') {
            out.push('#');
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_list_indices_leave_a_path() {
        assert_eq!(
            super::without_indices("params[12]['wqkv']"),
            "params[#]['wqkv']"
        );
        assert_eq!(
            super::without_indices("params['Dense_0']['kernel']"),
            "params['Dense_0']['kernel']"
        );
        assert_eq!(super::without_indices("x"), "x");
    }
}
