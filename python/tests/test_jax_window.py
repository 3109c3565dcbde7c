"""memlsp_capture.jax's step logic against a recording stand-in for jax (runs without jax).

The real end-to-end run is in test_jax_capture.py; this checks the corners that a real run
does not reach cheaply: where the window starts and stops, early exits, exceptions, a failing
profiler, several processes, and files that must not be overwritten.
"""

import json
import os
import shutil
import sys
import tempfile
import types
import unittest
from unittest import mock

import _support  # noqa: F401
import memlsp_capture
from memlsp_capture import CaptureWarning


class FakeArray:
    def __init__(self, deleted=False):
        self.deleted = deleted
        self.shape, self.dtype, self.sharding = (2, 2), "float32", None

    def is_deleted(self):
        return self.deleted


class FakeJax:
    def __init__(self, process_count=1, start_fails=False):
        self.events = []
        self.run = 0
        jax = types.ModuleType("jax")
        jax.__version__ = "0.0-fake"
        jax.Array = FakeArray
        jax.ShapeDtypeStruct = lambda shape, dtype, sharding=None: ("aval", shape, dtype)
        jax.tree_util = types.SimpleNamespace(
            tree_map=lambda f, tree: (tuple(f(a) for a in tree[0]), {k: f(v) for k, v in tree[1].items()})
        )
        jax.block_until_ready = lambda x: self.events.append(("block", "live" if x == "LIVE" else x))
        jax.live_arrays = lambda: "LIVE"
        jax.default_backend = lambda: "cpu"
        jax.devices = lambda: [types.SimpleNamespace(device_kind="fake")]
        jax.process_count = lambda: process_count
        jax.process_index = lambda: process_count - 1
        jax.jit = lambda f: self.jitted(f)

        def start_trace(log_dir):
            if start_fails:
                raise RuntimeError("Profile has already been started")
            self.events.append(("start", log_dir))
            self.log_dir = log_dir

        def stop_trace():
            self.events.append(("stop",))
            self.run += 1
            run = os.path.join(self.log_dir, "plugins", "profile", f"2026_01_01_00_00_{self.run:02d}")
            os.makedirs(run, exist_ok=True)
            with open(os.path.join(run, "host.xplane.pb"), "wb") as f:
                f.write(b"xplane")

        def device_memory_profile():
            self.events.append(("memory_profile",))
            return b"\x1f\x8bprofile"

        jax.profiler = types.SimpleNamespace(
            start_trace=start_trace, stop_trace=stop_trace, device_memory_profile=device_memory_profile
        )
        self.module = jax

    def jitted(self, f):
        fake = self

        class Stats:
            argument_size_in_bytes, output_size_in_bytes, temp_size_in_bytes = 10, 20, 30
            alias_size_in_bytes = generated_code_size_in_bytes = 0
            serialized_buffer_assignment_proto = b"not a size"

        class Compiled:
            donate_argnums = (0,)

            def memory_analysis(self):
                return Stats()

            def as_text(self):
                return "HloModule jit_" + f.__name__ + ", is_scheduled=true"

        class Lowered:
            def compile(self):
                return Compiled()

        class Jitted:
            __wrapped__ = f
            __name__ = f.__name__

            def lower(self, *args, **kwargs):
                fake.events.append(("lower", args, kwargs))
                return Lowered()

            def __call__(self, *args, **kwargs):
                fake.events.append(("call",))
                return f(*args, **kwargs)

        return Jitted()

    def installed(self):
        return mock.patch.dict(sys.modules, {"jax": self.module, "jaxlib": types.ModuleType("jaxlib")})

    def kinds(self):
        return [e[0] for e in self.events]


def train_step(params, x):
    return params


class JaxWindowTest(unittest.TestCase):
    def setUp(self):
        self.out = tempfile.mkdtemp(prefix="memlsp-capture-window-")
        self.addCleanup(shutil.rmtree, self.out, True)

    def loop(self, fake, steps, n, record=None, **kw):
        with fake.installed():
            with memlsp_capture.jax(self.out, steps=steps, **kw) as cap:
                for i in range(1, n + 1):
                    fake.events.append(("step", i))
                    if record:
                        record(cap, i)
                    cap.step(f"loss{i}")
        return cap

    def test_window_starts_after_step_first_minus_1_and_stops_after_last(self):
        fake = FakeJax()
        cap = self.loop(fake, (3, 5), 7)
        self.assertEqual(
            [e for e in fake.events if e[0] in ("step", "start", "stop")],
            [("step", 1), ("step", 2), ("start", self.out), ("step", 3), ("step", 4), ("step", 5),
             ("stop",), ("step", 6), ("step", 7)],
        )
        # the boundaries wait for the step's outputs before starting / stopping
        i = fake.events.index(("start", self.out))
        self.assertIn(("block", ("loss2",)), fake.events[i - 3 : i])
        self.assertEqual(fake.events[fake.events.index(("stop",)) - 1], ("block", ("loss5",)))
        self.assertEqual(sorted(os.listdir(cap.run_dir)), ["host.xplane.pb", "memory_after.prof", "memory_before.prof"])

    def test_steps_from_1_trace_the_compile_with_a_warning(self):
        fake = FakeJax()
        with self.assertWarnsRegex(CaptureWarning, "compiles"):
            self.loop(fake, (1, 2), 3)
        self.assertEqual(fake.kinds().index("start"), 1)  # memory profile, then start: before step 1

    def test_block_ending_early_stops_and_writes_the_trace(self):
        fake = FakeJax()
        with self.assertWarnsRegex(CaptureWarning, "before step 4"):
            cap = self.loop(fake, (2, 4), 2)
        self.assertEqual(fake.kinds().count("stop"), 1)
        self.assertTrue(cap.xplane_files)

    def test_exception_in_the_window_still_writes_the_trace(self):
        fake = FakeJax()
        with fake.installed():
            with self.assertRaises(MemoryError):
                with memlsp_capture.jax(self.out, steps=(2, 4)) as cap:
                    cap.step()
                    raise MemoryError("RESOURCE_EXHAUSTED: Out of memory")
        self.assertEqual(fake.kinds().count("stop"), 1)
        self.assertIn(("block", "live"), fake.events, "no outputs given: all live arrays are waited for")
        self.assertEqual(len(cap.xplane_files), 1)

    def test_memory_analysis_before_during_and_without_a_trace(self):
        fake = FakeJax()
        step = fake.jitted(train_step)

        def record(cap, i):
            if i == 1:
                cap.save_memory_analysis(step, FakeArray(), x=FakeArray(deleted=True))
                self.assertEqual(os.listdir(self.out), [], "kept until the run folder exists")

        cap = self.loop(fake, (2, 3), 3, record=record)
        with open(os.path.join(cap.run_dir, "memory_analysis.json")) as f:
            doc = json.load(f)
        (mod,) = doc["modules"]
        self.assertEqual(mod["module"], "jit_train_step")
        self.assertEqual(mod["function"], "train_step")
        self.assertEqual(mod["file"], os.path.abspath(__file__))
        self.assertEqual((mod["argument_size_in_bytes"], mod["output_size_in_bytes"], mod["temp_size_in_bytes"]), (10, 20, 30))
        self.assertEqual(mod["donate_argnums"], [0])
        self.assertNotIn("serialized_buffer_assignment_proto", mod)
        lower = [e for e in fake.events if e[0] == "lower"][0]
        self.assertIsInstance(lower[1][0], FakeArray, "live arrays are lowered as they are")
        self.assertEqual(lower[2]["x"][0], "aval", "a donated (deleted) array is lowered by shape")

        # after the trace: written at once, into the same file
        with fake.installed():
            cap.save_memory_analysis(train_step, FakeArray())  # a plain function gets jitted
        with open(os.path.join(cap.run_dir, "memory_analysis.json")) as f:
            self.assertEqual(len(json.load(f)["modules"]), 2)

        # no trace at all (the loop was too short): beside out_dir, with a warning
        out2 = os.path.join(self.out, "short")
        with fake.installed(), self.assertWarnsRegex(CaptureWarning, "no trace was written"):
            with memlsp_capture.jax(out2, steps=(5, 6)) as cap2:
                cap2.save_memory_analysis(step, FakeArray())
        self.assertEqual(os.listdir(out2), ["memory_analysis.json"])

    def test_watch_analyses_the_first_call_only_before_running_it(self):
        fake = FakeJax()
        step = fake.jitted(train_step)
        with fake.installed():
            with memlsp_capture.jax(self.out, steps=(2, 2)) as cap:
                watched = cap.watch(step)
                for _ in range(3):
                    watched("p", "x")
                    cap.step()
        kinds = [k for k in fake.kinds() if k in ("lower", "call")]
        self.assertEqual(kinds, ["lower", "call", "call", "call"])
        self.assertEqual(watched.__wrapped__, step)

    def test_failing_start_trace_is_a_warning_not_a_crash(self):
        fake = FakeJax(start_fails=True)
        with self.assertWarnsRegex(CaptureWarning, "start_trace failed"):
            cap = self.loop(fake, (2, 3), 4)
        self.assertNotIn("stop", fake.kinds())
        self.assertIsNone(cap.run_dir)

    def test_several_processes_prefix_the_side_files(self):
        fake = FakeJax(process_count=2)
        cap = self.loop(fake, (2, 2), 2, record=lambda c, i: i == 1 and c.save_memory_analysis(fake.jitted(train_step)))
        self.assertEqual(
            sorted(os.listdir(cap.run_dir)),
            ["host.xplane.pb", "process1_memory_after.prof", "process1_memory_analysis.json",
             "process1_memory_before.prof"],
        )

    def test_side_files_in_a_shared_run_folder_are_not_overwritten(self):
        fake = FakeJax()
        fake.run = 0
        self.loop(fake, (2, 2), 2, memory_profile=True)
        fake.run = 0  # the next trace lands in the same run folder (same second)
        with self.assertWarnsRegex(CaptureWarning, "memory_before-2.prof"):
            cap = self.loop(fake, (2, 2), 2)
        self.assertEqual(
            sorted(os.listdir(cap.run_dir)),
            ["host.xplane.pb", "memory_after-2.prof", "memory_after.prof", "memory_before-2.prof",
             "memory_before.prof"],
        )

    def test_bad_steps(self):
        for steps in ((0, 2), (3, 2), (1, 2, 3), ("a", 2)):
            with self.assertRaises(ValueError, msg=steps):
                memlsp_capture.jax(self.out, steps=steps)


if __name__ == "__main__":
    unittest.main()
