"""memlsp_capture.torch against a recording stand-in for torch (no GPU, no torch needed)."""

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings
from unittest import mock

import _support  # noqa: F401  (puts this source tree first on sys.path)
import memlsp_capture
from fake_torch import FakeTorch
from memlsp_capture import CaptureWarning


def run_loop(fake, out, n_steps, **kw):
    """A training loop as a user writes it; returns the capture."""
    with fake.installed():
        with memlsp_capture.torch(out, **kw) as cap:
            fake.events.append(("model built", None))
            for _ in range(n_steps):
                fake.events.append(("train step", None))
                cap.step()
    return cap


class TorchCaptureTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="memlsp-capture-test-")
        self.out = os.path.join(self.tmp, "caps")
        env = mock.patch.dict(os.environ)
        env.start()
        self.addCleanup(env.stop)
        for k in ("RANK", "WORLD_SIZE"):
            os.environ.pop(k, None)
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def files(self):
        return sorted(os.listdir(self.out))

    # ------------------------------------------------------------------ history on / off

    def test_history_enabled_with_the_right_arguments_before_the_first_step(self):
        fake = FakeTorch()
        run_loop(fake, self.out, 3, steps=(1, 3))
        kinds = [e[0] for e in fake.events]
        self.assertEqual(kinds[0], "record", "history must be the first thing switched on")
        self.assertEqual(
            fake.events[0][1],
            {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 100_000},
        )
        self.assertLess(kinds.index("record"), kinds.index("model built"))
        self.assertLess(kinds.index("attach"), kinds.index("train step"))
        # the observer is attached after recording is on (enabling history initialises CUDA,
        # and older torch attaches observers only to initialised device allocators)
        self.assertLess(kinds.index("record"), kinds.index("attach"))

    def test_arguments_are_passed_through(self):
        fake = FakeTorch()
        run_loop(fake, self.out, 1, steps=(1,), max_entries=5, stacks="all", context="alloc")
        self.assertEqual(
            fake.records()[0], {"enabled": "all", "context": "alloc", "stacks": "all", "max_entries": 5}
        )

    def test_history_disabled_on_exit(self):
        fake = FakeTorch()
        run_loop(fake, self.out, 2, steps=(1, 2))
        self.assertEqual(fake.records()[-1]["enabled"], None)
        self.assertEqual(len(fake.records()), 2)
        self.assertIsNone(fake.history)

    def test_history_disabled_when_the_loop_raises(self):
        fake = FakeTorch()
        with fake.installed():
            with self.assertRaises(ValueError):
                with memlsp_capture.torch(self.out, steps=(1,)) as cap:
                    cap.step()
                    raise ValueError("user bug")
        self.assertIsNone(fake.history)
        self.assertEqual(self.files(), ["snapshot_step1.pickle"])

    # ------------------------------------------------------------------ step snapshots

    def test_snapshots_after_step_1_and_k_only(self):
        fake = FakeTorch()
        with warnings.catch_warnings():
            warnings.simplefilter("error", CaptureWarning)
            cap = run_loop(fake, self.out, 12, steps=(1, 10))
        self.assertEqual(self.files(), ["snapshot_step1.pickle", "snapshot_step10.pickle"])
        self.assertEqual(fake.snapshots, 2)
        kinds = [e[0] for e in fake.events]
        steps_before = [kinds[: i].count("train step") for i, k in enumerate(kinds) if k == "snapshot"]
        self.assertEqual(steps_before, [1, 10], "dumped right after step 1 and step 10")
        self.assertEqual(cap.files, [os.path.join(self.out, f) for f in self.files()])

        with open(os.path.join(self.out, "snapshot_step10.pickle"), "rb") as f:
            raw = f.read()
        self.assertEqual(raw[:2], b"\x80\x04", "pickle protocol 4, readable by MemoryViz too")
        snap = pickle.loads(raw)
        self.assertEqual(snap["fake_index"], 2)
        self.assertEqual(snap["recording"]["enabled"], "all", "taken while history was on")
        self.assertEqual(snap["device_traces"][0][0]["frames"][0]["line"], 3)
        self.assertFalse([n for n in os.listdir(self.out) if "partial" in n])

    def test_warns_about_steps_never_reached(self):
        fake = FakeTorch()
        with self.assertWarnsRegex(CaptureWarning, r"steps \[10\] were never reached") as cm:
            run_loop(fake, self.out, 4, steps=(1, 10))
        self.assertEqual(os.path.abspath(cm.filename), os.path.abspath(__file__),
                         "the warning points at the user's code, not at memlsp_capture")
        self.assertEqual(self.files(), ["snapshot_step1.pickle"])

    def test_explicit_step_numbers_and_labels(self):
        fake = FakeTorch()
        with fake.installed():
            with memlsp_capture.torch(self.out, steps=(100,)) as cap:
                self.assertIsNone(cap.step(99))
                self.assertTrue(cap.step(100).endswith("snapshot_step100.pickle"))
                cap.dump("after_eval")
                with self.assertRaises(ValueError):
                    cap.dump("../escape")
        self.assertEqual(self.files(), ["snapshot_after_eval.pickle", "snapshot_step100.pickle"])

    def test_creates_the_directory(self):
        fake = FakeTorch()
        nested = os.path.join(self.tmp, "a", "b", "caps")
        with fake.installed():
            with memlsp_capture.torch(nested, steps=(1,)) as cap:
                cap.step()
        self.assertEqual(os.listdir(nested), ["snapshot_step1.pickle"])

    # ------------------------------------------------------------------ OOM

    def test_oom_observer_dumps_once(self):
        fake = FakeTorch()
        with fake.installed():
            with memlsp_capture.torch(self.out, steps=(5,)) as cap:
                self.assertEqual(len(fake.observers), 1)
                cap.step()
                with self.assertLogs("memlsp_capture", "WARNING") as logs:
                    fake.oom()
                    fake.oom(alloc=1 << 20)  # a second OOM in the same run: no second file
                self.assertEqual(len(logs.output), 1)
                self.assertIn("snapshot_oom.pickle", logs.output[0])
            self.assertEqual(fake.snapshots, 1)
            fake.oom()  # after the block the observer stays registered but is quiet
        self.assertEqual(self.files(), ["snapshot_oom.pickle"])
        self.assertEqual(cap.oom_file, os.path.join(self.out, "snapshot_oom.pickle"))
        with open(cap.oom_file, "rb") as f:
            self.assertEqual(pickle.load(f)["recording"]["enabled"], "all")

    def test_oom_observer_never_raises_into_the_allocator(self):
        fake = FakeTorch()
        with fake.installed():
            with memlsp_capture.torch(self.out, steps=(5,)):
                fake.fail_snapshot = True
                with self.assertLogs("memlsp_capture", "WARNING"):
                    fake.oom()  # must not raise
        self.assertEqual(self.files(), [])

    def test_no_observer_when_on_oom_is_false(self):
        fake = FakeTorch()
        run_loop(fake, self.out, 1, steps=(1,), on_oom=False)
        self.assertEqual(fake.observers, [])

    def test_oom_leaving_the_block_dumps_when_no_observer_exists(self):
        class OutOfMemoryError(RuntimeError):
            pass

        fake = FakeTorch(has_observer=False)
        with fake.installed():
            with self.assertWarnsRegex(CaptureWarning, "_cuda_attach_out_of_memory_observer"):
                with self.assertRaises(OutOfMemoryError), self.assertLogs("memlsp_capture", "WARNING"):
                    with memlsp_capture.torch(self.out, steps=(5,)):
                        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.assertEqual(self.files(), ["snapshot_oom.pickle"])

    # ------------------------------------------------------------------ names

    def test_rank_in_names_when_distributed_is_initialised(self):
        fake = FakeTorch(rank=3)
        with fake.installed():
            with memlsp_capture.torch(self.out, steps=(1, 2)) as cap:
                cap.step()
                with self.assertLogs("memlsp_capture", "WARNING"):
                    fake.oom()
                cap.step()
        self.assertEqual(
            self.files(),
            ["rank3_snapshot_oom.pickle", "rank3_snapshot_step1.pickle", "rank3_snapshot_step2.pickle"],
        )

    def test_rank_from_the_launcher_environment(self):
        os.environ.update(RANK="2", WORLD_SIZE="4")
        run_loop(FakeTorch(), self.out, 1, steps=(1,))
        self.assertEqual(self.files(), ["rank2_snapshot_step1.pickle"])

    def test_single_process_environment_has_no_rank(self):
        os.environ.update(RANK="0", WORLD_SIZE="1")
        run_loop(FakeTorch(), self.out, 1, steps=(1,))
        self.assertEqual(self.files(), ["snapshot_step1.pickle"])

    def test_never_overwrites_an_existing_capture(self):
        os.makedirs(self.out)
        old = os.path.join(self.out, "snapshot_step1.pickle")
        with open(old, "wb") as f:
            f.write(b"earlier run")
        with self.assertWarnsRegex(CaptureWarning, "snapshot_step1-2.pickle"):
            run_loop(FakeTorch(), self.out, 1, steps=(1,))
        with open(old, "rb") as f:
            self.assertEqual(f.read(), b"earlier run")
        with self.assertWarns(CaptureWarning):
            run_loop(FakeTorch(), self.out, 1, steps=(1,))
        self.assertEqual(
            self.files(), ["snapshot_step1-2.pickle", "snapshot_step1-3.pickle", "snapshot_step1.pickle"]
        )
        with open(os.path.join(self.out, "snapshot_step1-3.pickle"), "rb") as f:
            self.assertIn("segments", pickle.load(f))

    # ------------------------------------------------------------------ older torch

    def test_fallback_when_record_memory_history_has_no_stacks(self):
        fake = FakeTorch(flavour="nostacks")
        with self.assertWarnsRegex(CaptureWarning, "no 'stacks' argument"):
            run_loop(fake, self.out, 1, steps=(1,))
        self.assertEqual(fake.records()[0], {"enabled": "all", "context": "all", "max_entries": 100_000})
        self.assertEqual(fake.records()[-1]["enabled"], None)
        self.assertEqual(self.files(), ["snapshot_step1.pickle"])

    def test_fallback_when_the_signature_is_hidden_and_stacks_is_refused(self):
        fake = FakeTorch(flavour="varkw-nostacks")
        with self.assertWarnsRegex(CaptureWarning, "no 'stacks' argument"):
            run_loop(fake, self.out, 1, steps=(1,))
        self.assertEqual(fake.records()[0], {"enabled": "all", "context": "all", "max_entries": 100_000})

    def test_torch_2_0_bool_form(self):
        fake = FakeTorch(flavour="2.0")
        with self.assertWarnsRegex(CaptureWarning, "2.0 form"):
            run_loop(fake, self.out, 1, steps=(1,))
        self.assertEqual(
            fake.records()[0],
            {"enabled": True, "record_context": True, "trace_alloc_max_entries": 100_000,
             "trace_alloc_record_context": True},
        )
        self.assertEqual(fake.records()[-1]["enabled"], False)
        self.assertEqual(self.files(), ["snapshot_step1.pickle"])

    def test_no_cuda_records_nothing(self):
        fake = FakeTorch(cuda_available=False)
        with self.assertWarnsRegex(CaptureWarning, "not available"):
            run_loop(fake, self.out, 2, steps=(1,))
        self.assertEqual(fake.events, [("model built", None), ("train step", None), ("train step", None)])

    def test_bad_arguments(self):
        for kw in ({"steps": (0,)}, {"stacks": "cpp"}, {"context": "everything"}, {"max_entries": 0}):
            with self.assertRaises(ValueError, msg=kw):
                memlsp_capture.torch(self.out, **kw)


class ImportTest(unittest.TestCase):
    def test_importing_the_package_imports_neither_torch_nor_jax(self):
        code = (
            "import sys, memlsp_capture; "
            "bad = [m for m in ('torch', 'jax', 'jaxlib', 'numpy') if m in sys.modules]; "
            "assert not bad, bad; "
            "memlsp_capture.torch('unused', steps=(1,)); memlsp_capture.jax('unused', steps=(2, 3)); "
            "bad = [m for m in ('torch', 'jax') if m in sys.modules]; "
            "assert not bad, bad"
        )
        env = dict(os.environ, PYTHONPATH=_support.PYTHON_DIR)
        r = subprocess.run([sys.executable, "-c", code], env=env, cwd=_support.PYTHON_DIR,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(_support.PYTHON_DIR, "unused")),
                         "creating a capture object must not touch the disk")


if __name__ == "__main__":
    unittest.main()
