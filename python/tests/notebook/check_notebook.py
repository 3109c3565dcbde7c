"""Execute report.ipynb headless (nbclient, an ipykernel of this interpreter) and check what a
notebook user sees: each cell's inline page is the page `memlsp report CAPTURE --format html`
writes, the `%memlsp` magic works (loaded by the import and by `%load_ext`), and an unreadable
capture is memlsp's one-line message. Needs nbclient, nbformat and ipykernel installed here and
`memlsp` from the same wheel.

    python python/tests/notebook/check_notebook.py CAPTURE [EXECUTED.ipynb]
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    capture = os.path.abspath(sys.argv[1])
    out_path = sys.argv[2] if len(sys.argv) > 2 else None
    os.environ["MEMLSP_NOTEBOOK_CAPTURE"] = capture
    nb = nbformat.read(os.path.join(HERE, "report.ipynb"), as_version=4)
    # The kernel runs in a scratch folder: nothing is written next to the capture or the repo.
    work = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"memlsp-notebook-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": work}}).execute()
    if out_path:
        nbformat.write(nb, out_path)

    from memlsp import find_memlsp_bin

    want = subprocess.run(
        [find_memlsp_bin(), "report", capture, "--format", "html"],
        check=True, capture_output=True, text=True, encoding="utf-8",
    ).stdout
    headline = subprocess.run(
        [find_memlsp_bin(), "report", capture],
        check=True, capture_output=True, text=True, encoding="utf-8",
    ).stdout.splitlines()[0]

    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        check(not errors, f"cell {i + 1} ran without an error {[e.get('evalue') for e in errors]}")

    def page_of(cell):
        for o in cell.outputs:
            if o.output_type in ("execute_result", "display_data") and "text/html" in o.data:
                m = re.fullmatch(r'<iframe class="memlsp-report" srcdoc="([^"]*)" style="width:100%;height:(\d+)px;[^"]*" title="memlsp report"></iframe>', o.data["text/html"])
                if m:
                    return html.unescape(m.group(1)), int(m.group(2))
        return None, None

    for i, height in ((0, 800), (1, 600), (2, 800)):
        page, h = page_of(code[i])
        check(page == want, f"cell {i + 1}: the inline page is memlsp report's page ({len(want)} bytes)")
        check(h == height, f"cell {i + 1}: frame height {h} px (want {height})")
    # The user sees the report's headline on the page (its words, whatever the markup around them).
    text = html.unescape(re.sub(r"<[^>]+>", "", want))
    words = headline.split(" [")[0][:60]
    check(words in text, f"the page shows the headline {words!r}")
    stdout = "".join(o.get("text", "") for o in code[3].outputs if o.output_type == "stream")
    check(
        stdout.startswith("error: ") and "no_such_snapshot.pickle" in stdout and stdout.count("\n") == 1,
        f"an unreadable capture is one line: {stdout.strip()!r}",
    )
    print(f"notebook: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
