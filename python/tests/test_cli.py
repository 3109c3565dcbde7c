"""`python -m memlsp_capture`: recipes, and what a capture folder holds."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import _support


def run(*args):
    env = dict(os.environ, PYTHONPATH=_support.PYTHON_DIR)
    return subprocess.run([sys.executable, "-m", "memlsp_capture", *args], env=env,
                          capture_output=True, text=True)


class CliTest(unittest.TestCase):
    def test_help_shows_the_recipes(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("memlsp_capture.torch(", r.stdout)
        self.assertIn("memlsp_capture.jax(", r.stdout)
        self.assertIn("memlsp report caps/", r.stdout)

    def test_lists_a_capture_folder(self):
        d = tempfile.mkdtemp(prefix="memlsp-capture-cli-")
        self.addCleanup(shutil.rmtree, d, True)
        for name in ("rank0_snapshot_step1.pickle", "rank0_snapshot_step10.pickle", "rank0_snapshot_oom.pickle",
                     "snapshot_step1-2.pickle", "notes.txt"):
            open(os.path.join(d, name), "wb").close()
        run_dir = os.path.join(d, "plugins", "profile", "2026_01_01_00_00_00")
        os.makedirs(run_dir)
        for name in ("vm.xplane.pb", "memory_analysis.json", "vm.trace.json.gz"):
            open(os.path.join(run_dir, name), "wb").close()
        r = run(d)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn("rank 0, PyTorch snapshot after step 10", out)
        self.assertIn("rank 0, PyTorch snapshot at the first CUDA OOM", out)
        self.assertIn("JAX trace vm.xplane.pb + memory_analysis.json", out)
        self.assertIn(f"memlsp report {d}/rank0_snapshot_step1.pickle --diff {d}/rank0_snapshot_step10.pickle", out)
        self.assertNotIn("notes.txt", out)

    def test_not_a_directory(self):
        self.assertEqual(run("/nonexistent/caps").returncode, 2)


if __name__ == "__main__":
    unittest.main()
