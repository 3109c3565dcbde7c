"""memlsp_capture.show / %memlsp outside a kernel: the object a notebook displays, the magic's
arguments, and memlsp's own message for a capture it cannot read. (The real notebook, executed
headless, is python/tests/notebook/check_notebook.py, run by .ci/wheel.sh.)"""

import html
import os
import re
import subprocess
import unittest

import _support  # noqa: F401 (memlsp_capture from this tree)

import memlsp_capture
from memlsp_capture import notebook

SHARED = os.environ.get("MEMLSP_SHARED") or os.path.join(os.path.dirname(_support.PYTHON_DIR), "..", "shared")
SNAPSHOT = os.path.join(SHARED, "torch_snapshots", "real", "JasperSolt__snapshot.pickle")


def memlsp_available():
    try:
        notebook._memlsp_bin()
        return True
    except FileNotFoundError:
        return False


class NotebookTest(unittest.TestCase):
    def setUp(self):
        if not (os.path.isfile(SNAPSHOT) and memlsp_available()):
            if os.environ.get("MEMLSP_REQUIRE_SHARED") == "1":
                self.fail(f"needs {SNAPSHOT} and a memlsp binary (MEMLSP_BIN)")
            self.skipTest("no ../shared snapshot or no memlsp binary")

    def page(self, report):
        m = re.fullmatch(r'<iframe class="memlsp-report" srcdoc="([^"]*)" style="width:100%;height:(\d+)px;[^"]*" '
                         r'title="memlsp report"></iframe>', report._repr_html_())
        self.assertIsNotNone(m, report._repr_html_()[:200])
        return html.unescape(m.group(1)), int(m.group(2))

    def test_show_displays_the_page_memlsp_report_writes(self):
        want = subprocess.run([notebook._memlsp_bin(), "report", SNAPSHOT, "--format", "html"],
                              check=True, capture_output=True, text=True).stdout
        page, height = self.page(memlsp_capture.show(SNAPSHOT))
        self.assertEqual(page, want)
        self.assertEqual(height, 800)
        self.assertTrue(want.startswith("<!doctype html>"), want[:40])

    def test_magic_takes_report_arguments_and_a_height(self):
        r = notebook.memlsp_magic(f"'{SNAPSHOT}' --top 3 --height 500")
        self.assertEqual(r.args, [SNAPSHOT, "--top", "3"])
        self.assertEqual(self.page(r)[1], 500)
        with self.assertRaisesRegex(ValueError, "usage: %memlsp CAPTURE"):
            notebook.memlsp_magic("")
        with self.assertRaisesRegex(ValueError, "--height takes a number"):
            notebook.memlsp_magic(f"{SNAPSHOT} --height big")

    def test_an_unreadable_capture_is_memlsps_one_line(self):
        with self.assertRaises(RuntimeError) as e:
            memlsp_capture.show(os.path.join(SHARED, "no_such.pickle"))
        msg = str(e.exception)
        self.assertTrue(msg.startswith("memlsp: ") and "no_such.pickle" in msg and "\n" not in msg, msg)

    def test_load_ext_registers_the_line_magic(self):
        class Shell:
            def register_magic_function(self, fn, magic_kind, magic_name):
                self.got = (fn, magic_kind, magic_name)
        shell = Shell()
        memlsp_capture.load_ipython_extension(shell)
        self.assertEqual(shell.got, (notebook.memlsp_magic, "line", "memlsp"))


if __name__ == "__main__":
    unittest.main()
