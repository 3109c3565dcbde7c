"""docs/RANKS.md's Ray recipe as written, on a real local Ray cluster (`ray.init()` in the
recipe starts one), with `memlsp` from the installed wheel on the workers' PATH. Cluster paths are
replaced by a scratch folder holding three real snapshots of ../shared as ranks 0-2. The
comparison the recipe prints and writes must be what `memlsp report DIR` gives on the snapshots.

    python python/tests/ray_recipe.py SHARED_DIR
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = [  # the three real snapshots tests/torch_ranks.rs uses as ranks
    "kkaitlyn111__memory_ctx128_fullstep.pickle",
    "kkaitlyn111__memory_ctx256_forward.pickle",
    "kkaitlyn111__memory_snapshot.pickle",
]


def ray_block() -> str:
    doc = open(os.path.join(ROOT, "docs", "RANKS.md"), encoding="utf-8").read()
    section = doc[doc.index("## Ray") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"RANKS.md's Ray section has {len(blocks)} python blocks"
    return blocks[0]


def without_paths(comparison: dict) -> dict:
    for r in comparison["ranks"]:
        assert r.pop("path").endswith("_snapshot.pickle"), r
    return comparison


def main() -> int:
    shared = sys.argv[1]
    import ray  # the real one: fail here, not in the recipe, when it is missing

    memlsp = shutil.which("memlsp")
    assert memlsp, "memlsp is not on PATH (install the wheel into this environment)"
    tmp = tempfile.mkdtemp(prefix="memlsp-ray-")
    ranks = os.path.join(tmp, "ranks")
    os.makedirs(ranks)
    for r, n in enumerate(NAMES):
        shutil.copy(os.path.join(shared, "torch_snapshots", "real", n), os.path.join(ranks, f"rank{r}_snapshot.pickle"))
    want = json.loads(
        subprocess.run([memlsp, "report", ranks, "--format", "json"], check=True, capture_output=True, text=True).stdout
    )["rank_comparisons"][0]

    recipe = ray_block().replace("/scratch/job123/snapshots", ranks).replace("range(1024)", f"range({len(NAMES)})")
    work = os.path.join(tmp, "ray")
    os.makedirs(work)
    with open(os.path.join(work, "recipe.py"), "w", encoding="utf-8") as f:
        f.write(recipe)
    # The recipe's ray.init() starts a local cluster (no RAY_ADDRESS here); its workers run this
    # interpreter, so `memlsp` is the wheel's, found on PATH like on a cluster node.
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run(
        [sys.executable, "recipe.py"], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    check(run.returncode == 0, f"the recipe ran on a real Ray cluster (ray {ray.__version__}): exit {run.returncode}\n{run.stderr[-3000:] if run.returncode else ''}")
    check(run.stdout.startswith(f"Ranks ({len(NAMES)} snapshots)"), f"it printed the comparison: {run.stdout[:80]!r}")
    got = subprocess.run(
        [memlsp, "compare", os.path.join(work, "summaries"), "--format", "json"], check=True, capture_output=True, text=True
    )
    same = without_paths(json.loads(got.stdout)["rank_comparison"]) == without_paths(want)
    check(same, "compare on the Ray tasks' summaries == report DIR on the snapshots")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"ray recipe: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
