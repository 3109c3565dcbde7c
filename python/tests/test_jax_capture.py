"""memlsp_capture.jax on a real JAX (CPU is enough): a tiny MLP, 4 steps, trace of steps 2-4.

Needs `jax` importable (CI: `pip install jax==0.10.2 jaxlib==0.10.2` into the interpreter that
runs the tests). Without it the test is skipped, unless MEMLSP_REQUIRE_SHARED=1 is set, then it
fails. MEMLSP_CAPTURE_KEEP=<dir> keeps the capture in <dir> (for running memlsp on it later);
otherwise it is written to a temporary directory and removed.
"""

import glob
import gzip
import json
import os
import shutil
import subprocess
import tempfile
import unittest
import warnings

import _support  # noqa: F401  (puts this source tree first on sys.path)
import memlsp_capture

try:
    import jax  # noqa: F401

    JAX_ERROR = None
except Exception as e:  # ImportError, or a broken install
    JAX_ERROR = f"{type(e).__name__}: {e}"

REQUIRED = os.environ.get("MEMLSP_REQUIRE_SHARED") == "1"
SIZES = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)


def need_jax(test):
    if JAX_ERROR is None:
        return
    message = (
        f"jax is not importable ({JAX_ERROR}); install it with "
        "`pip install jax==0.10.2 jaxlib==0.10.2` to run the real JAX capture test"
    )
    if REQUIRED:
        test.fail(message + " (MEMLSP_REQUIRE_SHARED=1: this is a failure, not a skip)")
    raise unittest.SkipTest(message)


class JaxCaptureTest(unittest.TestCase):
    def setUp(self):
        need_jax(self)
        keep = os.environ.get("MEMLSP_CAPTURE_KEEP")
        if keep:
            self.out = os.path.abspath(keep)
            os.makedirs(self.out, exist_ok=True)
        else:
            self.out = tempfile.mkdtemp(prefix="memlsp-capture-jax-")
            self.addCleanup(shutil.rmtree, self.out, True)

    def test_mlp_four_steps_traces_warm_steps_with_memory_analysis(self):
        import jax_mlp_program as prog

        key = jax.random.PRNGKey(0)
        params = prog.init_params(key)
        x, y = prog.batch(jax.random.PRNGKey(1))

        with warnings.catch_warnings():
            warnings.simplefilter("error", memlsp_capture.CaptureWarning)
            with memlsp_capture.jax(self.out, steps=(2, 4)) as cap:
                train_step = cap.watch(prog.train_step_jit)
                for step in range(1, 5):
                    params, loss = train_step(params, x, y)
                    self.assertEqual(cap.tracing, 2 <= step, f"tracing during step {step}")
                    cap.step(loss)
                self.assertFalse(cap.tracing, "stopped right after step 4")

        print(f"\nJAX capture: {cap.run_dir}")

        # the profiler's run folder, with the .xplane.pb memlsp reads
        runs_root = os.path.join(self.out, "plugins", "profile")
        self.assertEqual(os.path.dirname(cap.run_dir), runs_root)
        xplanes = glob.glob(os.path.join(cap.run_dir, "*.xplane.pb"))
        self.assertEqual(len(xplanes), 1, os.listdir(cap.run_dir))
        self.assertEqual(cap.xplane_files, xplanes)
        self.assertGreater(os.path.getsize(xplanes[0]), 1000)

        # the trace window: warm steps only, so no compilation inside, and the step did run
        traces = glob.glob(os.path.join(cap.run_dir, "*.trace.json.gz"))
        if traces:
            with gzip.open(traces[0], "rt") as f:
                names = {e.get("name") or "" for e in json.load(f).get("traceEvents", [])}
            self.assertIn("PjitFunction(train_step)", names)
            self.assertFalse([n for n in names if "backend_compile" in n], "step 1 compiled outside")

        # memory_analysis.json beside the capture
        with open(os.path.join(cap.run_dir, "memory_analysis.json")) as f:
            doc = json.load(f)
        self.assertEqual(doc["schema"], memlsp_capture.MEMORY_ANALYSIS_SCHEMA)
        self.assertEqual(doc["trace_steps"], [2, 4])
        self.assertEqual(doc["xplane"], [os.path.basename(xplanes[0])])
        self.assertEqual(doc["jax_version"], jax.__version__)
        (mod,) = doc["modules"]
        self.assertEqual(mod["module"], "jit_train_step")
        self.assertEqual(mod["function"], "train_step")
        self.assertEqual(os.path.basename(mod["file"]), "jax_mlp_program.py")
        for k in SIZES:
            self.assertIsInstance(mod[k], int, k)
            self.assertGreaterEqual(mod[k], 0, k)
        n_params = 128 * 256 + 256 + 256 * 16 + 16
        # arguments: params + x + y in f32; outputs: new params + the loss
        self.assertEqual(mod["argument_size_in_bytes"], 4 * (n_params + 64 * 128 + 64 * 16))
        # (XLA:CPU adds the output tuple's pointer table, 8 B per element)
        self.assertGreaterEqual(mod["output_size_in_bytes"], 4 * (n_params + 1))
        self.assertLess(mod["output_size_in_bytes"], 4 * (n_params + 1) + 1024)
        self.assertEqual(mod["alias_size_in_bytes"], 0, "nothing donated")

        # device memory profiles (gzip-compressed pprof) before and after the traced steps
        for name in ("memory_before.prof", "memory_after.prof"):
            with open(os.path.join(cap.run_dir, name), "rb") as f:
                self.assertEqual(f.read(2), b"\x1f\x8b", name)

        self.assertEqual(
            sorted(os.path.basename(p) for p in cap.files),
            sorted([os.path.basename(xplanes[0]), "memory_before.prof", "memory_after.prof",
                    "memory_analysis.json"]),
        )

        self.memlsp_reads_the_capture(cap.run_dir, mod)

    def memlsp_reads_the_capture(self, run_dir, mod):
        """memlsp on the run folder this helper wrote: the plan it reads from the .xplane.pb has
        the byte counts the compiler's own memory_analysis() gives, and the buffers land on the
        program's lines."""
        exe = os.environ.get("MEMLSP_BIN")
        if not exe or not os.path.exists(exe):
            message = f"MEMLSP_BIN={exe!r} is not a memlsp binary; `cargo build` and set it"
            if REQUIRED:
                self.fail(message + " (MEMLSP_REQUIRE_SHARED=1: this is a failure, not a skip)")
            print(f"\n(skipped running memlsp on the capture: {message})")
            return
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(
            [exe, "report", run_dir, "--format", "json"],
            cwd=here, capture_output=True, text=True, timeout=120,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        (cap,) = json.loads(out.stdout)["captures"]
        xla = cap["xla"]
        self.assertTrue(xla["module"].startswith("jit_train_step("), xla["module"])
        plan = xla["plan"]
        self.assertEqual(plan["parameter_bytes"], mod["argument_size_in_bytes"])
        self.assertEqual(plan["output_bytes"], mod["output_size_in_bytes"])
        self.assertEqual(plan["temp_bytes"], mod["temp_size_in_bytes"])
        self.assertEqual(plan["donated_bytes"], mod["alias_size_in_bytes"])
        lines = {(s.get("file"), s.get("line")) for s in cap["sites"]}
        # relu(x @ w1 + b1) and the output layer of jax_mlp_program.py
        self.assertIn(("jax_mlp_program.py", 25), lines, cap["sites"])


if __name__ == "__main__":
    unittest.main()
