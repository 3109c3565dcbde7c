"""The bench's `3M-inconsistent-named` file: `../shared/tools/gen_inconsistent_snapshot.py`, with
every 50th frame named `softmax`, `cross_entropy` or `attention_forward` (in turn) instead of
`fn_<i>`.

Usage: python3 gen_inconsistent_named.py GENERATOR N_ENTRIES OUT.pickle

The shared generator's frames are all `fn_<i>`, so the detectors that look for an attention
(PT018) or a loss (PT019) stop before walking its trace; a real file that does not fit its
segments still has such frames. This runs the generator's own text with that one expression
changed (and fails if the expression is not there), so both files share everything else."""
import sys

if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0)
if len(sys.argv) != 4 or any(a.startswith("-") for a in sys.argv[1:]):
    # An option taken for the output path once wrote a 218 MB file named `--help`.
    sys.exit(f"gen_inconsistent_named.py: expected GENERATOR N_ENTRIES OUT.pickle\n{__doc__}")
gen, n, out = sys.argv[1], sys.argv[2], sys.argv[3]
src = open(gen).read()
old = '"name": f"fn_{i}"'
new = '"name": (["softmax", "cross_entropy", "attention_forward"][(i // 50) % 3] if i % 50 == 0 else f"fn_{i}")'
if src.count(old) != 1:
    sys.exit(f"{gen}: the frame name expression {old} is not there once; update this script")
sys.argv = [gen, n, out]
exec(compile(src.replace(old, new), gen, "exec"), {"__name__": "__main__"})
