"""`python -m memlsp_capture [DIR]`: show the recipes, or list what a capture folder holds and
which memlsp commands fit it. Imports neither torch nor jax."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Dict, List, Optional

RECIPES = """\
PyTorch (enter before the model is built):

    with memlsp_capture.torch("caps/", steps=(1, 10)) as cap:
        model = build_model().cuda()
        for step, batch in enumerate(loader, 1):
            ...
            optimizer.step()
            cap.step()      # caps/snapshot_step1.pickle, caps/snapshot_step10.pickle
                            # caps/snapshot_oom.pickle on the first CUDA OOM

JAX (step 1 compiles, so steps 2..4 are traced):

    with memlsp_capture.jax("caps/", steps=(2, 4)) as cap:
        train_step = cap.watch(train_step)      # memory_analysis.json from its first call
        for step in range(1, 5):
            params, opt_state, loss = train_step(params, opt_state, batch)
            cap.step(loss)

Then: memlsp report caps/
"""

_SNAPSHOT = re.compile(r"^(?:rank(?P<rank>\d+)_)?snapshot_(?P<label>.+?)(?:-(?P<copy>\d+))?\.pickle$")


def describe(directory: str) -> List[str]:
    """One line per capture found under `directory`, then the memlsp commands to run."""
    lines: List[str] = []
    steps: Dict[Optional[str], List[tuple]] = {}
    ooms: List[str] = []
    for name in sorted(os.listdir(directory)):
        m = _SNAPSHOT.match(name)
        if not m:
            continue
        path = os.path.join(directory, name)
        rank, label = m.group("rank"), m.group("label")
        who = f"rank {rank}, " if rank is not None else ""
        if label == "oom":
            lines.append(f"  {path}: {who}PyTorch snapshot at the first CUDA OOM")
            ooms.append(path)
        elif label.startswith("step") and label[4:].isdigit():
            lines.append(f"  {path}: {who}PyTorch snapshot after step {label[4:]}")
            if m.group("copy") is None:
                steps.setdefault(rank, []).append((int(label[4:]), path))
        else:
            lines.append(f"  {path}: {who}PyTorch snapshot '{label}'")
    runs = os.path.join(directory, "plugins", "profile")
    jax_runs = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
    for run in jax_runs:
        run_dir = os.path.join(runs, run)
        files = sorted(os.listdir(run_dir))
        xplanes = [f for f in files if f.endswith(".xplane.pb")]
        extra = [f for f in files if f.endswith((".json", ".prof"))]
        lines.append(f"  {run_dir}/: JAX trace {', '.join(xplanes) or '(no .xplane.pb)'}"
                     + (f" + {', '.join(extra)}" if extra else ""))
    if not lines:
        return [f"{directory}: no memlsp-capture files here"]
    out = [f"{directory}:"] + lines + ["", "memlsp commands:", f"  memlsp report {directory}"]
    for path in ooms:
        out.append(f"  memlsp report {path}")
    for rank_steps in steps.values():
        rank_steps.sort()
        if len(rank_steps) >= 2:
            out.append(f"  memlsp report {rank_steps[0][1]} --diff {rank_steps[-1][1]}   # growth between steps")
    for run in jax_runs:
        out.append(f"  memlsp report {os.path.join(runs, run)}")
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memlsp_capture",
        description="memlsp-capture: take GPU memory captures that memlsp explains per Python line.",
        epilog=RECIPES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", nargs="?", help="a capture folder: list what it holds and the memlsp commands for it")
    args = parser.parse_args(argv)
    if args.dir is None:
        print(RECIPES, end="")
        return 0
    if not os.path.isdir(args.dir):
        print(f"{args.dir}: not a directory", file=sys.stderr)
        return 2
    print("\n".join(describe(args.dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
