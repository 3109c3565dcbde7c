"""memlsp's MCP server driven by the official Python MCP client SDK (`mcp` 2.x on PyPI).

    python sdk_client.py MEMLSP SHARED FIXTURES

MEMLSP is the memlsp binary, SHARED the folder of real captures (../shared), FIXTURES the repo's
fixtures/ folder. The server is spawned over stdio (`memlsp mcp`) the way an agent's client
spawns it; every check prints one line, then `N passed, N failed`; the exit status is 1 when a
check failed. Captures are only read: the workspaces are temporary folders holding copies.

(Not named client.py: memlsp resolves a recorded path by its last components, and the real
captures record a `.../client.py`, which would then resolve to this file in golden runs.)
"""

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client

PASSED = 0
FAILED = 0


def check(name, ok, detail=""):
    global PASSED, FAILED
    if ok:
        PASSED += 1
        print(f"ok   {name}")
    else:
        FAILED += 1
        print(f"FAIL {name}{': ' + detail if detail else ''}")


def findings(doc):
    """Every finding of a report document."""
    return [f for c in doc.get("captures", []) for f in c.get("findings", [])]


async def run(memlsp, shared, fixtures, tmp):
    b_dir = shared / "jax_cpu_captures" / "b_mlp_nodonate"
    c_capture = shared / "jax_cpu_captures" / "c_mlp_donate" / "c_mlp_donate.xplane.pb"

    # Workspace: the program b_mlp_nodonate.py and its capture (copies).
    ws = tmp / "ws"
    ws.mkdir()
    shutil.copy(b_dir / "b_mlp_nodonate.py", ws)
    shutil.copy(b_dir / "b_mlp_nodonate.xplane.pb", ws)

    # The baseline of the donating version, recorded by the CLI.
    baseline = tmp / "memlsp-baseline.json"
    rec = subprocess.run(
        [str(memlsp), "baseline", str(c_capture), "-o", str(baseline)],
        cwd=ws, capture_output=True, text=True,
    )
    check("memlsp baseline records c_mlp_donate", rec.returncode == 0, rec.stderr)

    # Two real PyTorch snapshots as the ranks of one run.
    ranks = tmp / "ranks"
    ranks.mkdir()
    real = shared / "torch_snapshots" / "real"
    shutil.copy(real / "Yiyi-philosophy__a228b8e3_1.3b_snapshot.pickle", ranks / "rank0_snapshot.pickle")
    shutil.copy(real / "Yiyi-philosophy__oom_snapshot.pickle", ranks / "rank1_snapshot.pickle")

    # The tools read only under the server's roots: the workspace, the temporary folder (the
    # baseline and the ranks), the real captures and the fixtures. A folder outside all of them
    # holds a capture, reached from the workspace by a symlink and by ../.
    outside_dir = tempfile.TemporaryDirectory(prefix="memlsp-mcp-outside-")  # removed at exit
    outside = Path(outside_dir.name)
    shutil.copy(fixtures / "torch" / "pt011_step10.pickle", outside / "secret.pickle")
    (ws / "outside_link.pickle").symlink_to(outside / "secret.pickle")
    roots = [ws, tmp, shared, fixtures]
    args = ["mcp"] + [a for r in roots for a in ("--root", str(r))]
    params = StdioServerParameters(command=str(memlsp), args=args, cwd=str(ws))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check("initialize names the server", init.server_info.name == "memlsp", repr(init.server_info))
            check("the server offers tools and resources",
                  init.capabilities.tools is not None and init.capabilities.resources is not None)

            tools = {t.name: t for t in (await session.list_tools()).tools}
            want = {"analyze", "explain_line", "diff", "compare_ranks", "check_baseline"}
            check("tools/list has the five tools", want <= set(tools), sorted(tools))
            schema = tools["analyze"].input_schema if "analyze" in tools else {}
            check("analyze's input schema requires path",
                  "path" in schema.get("required", []) and "workspace" in schema.get("properties", {}),
                  json.dumps(schema)[:300])

            # analyze: the JSON document of `memlsp report --format json`, located in the workspace.
            r = await session.call_tool("analyze", {"path": "b_mlp_nodonate.xplane.pb"})
            doc = r.structured_content or {}
            jx005 = [f for f in findings(doc) if f["code"] == "JX005"]
            check("analyze: no tool error", not r.is_error, str(r.content)[:300])
            check("analyze: JX005 at b_mlp_nodonate.py:57",
                  len(jx005) == 1 and jx005[0]["file"] == "b_mlp_nodonate.py" and jx005[0]["line"] == 57,
                  json.dumps(jx005)[:400])
            labels = {e["label"] for f in jx005 for e in f.get("evidence", [])}
            check("analyze: JX005's evidence is labelled read and inferred",
                  {"read", "inferred"} <= labels, str(labels))
            check("analyze: the fix is donate_argnums",
                  any("donate_argnums" in json.dumps(f.get("fixes")) for f in jx005))
            cap = (doc.get("captures") or [{}])[0]
            check("analyze: headline and plan totals",
                  "JX005" in cap.get("headline", "") and cap.get("xla", {}).get("plan", {}).get("total_peak_bytes", 0) > 0,
                  cap.get("headline", ""))
            text = r.content[0].text if r.content else ""
            check("analyze: the text summary leads with the headline", "[JX005]" in text.splitlines()[0] if text else False, text[:200])
            cli = subprocess.run([str(memlsp), "report", "b_mlp_nodonate.xplane.pb", "--format", "json"],
                                 cwd=ws, capture_output=True, text=True)
            check("analyze: the same document as `memlsp report --format json`",
                  cli.returncode == 0 and json.loads(cli.stdout) == doc)

            # explain_line: what the workspace's captures say about the jax.jit line.
            r = await session.call_tool("explain_line", {"file": "b_mlp_nodonate.py", "line": 57})
            ex = r.structured_content or {}
            hits = ex.get("captures", [])
            codes = [f["code"] for h in hits for f in h.get("findings", [])]
            check("explain_line: JX005 at line 57 from the capture",
                  not r.is_error and "JX005" in codes and hits[0]["path"] == "b_mlp_nodonate.xplane.pb",
                  json.dumps(ex)[:400])
            r = await session.call_tool("explain_line", {"file": "b_mlp_nodonate.py", "line": 1})
            check("explain_line: nothing on line 1",
                  not r.is_error and (r.structured_content or {}).get("captures") == [],
                  json.dumps(r.structured_content)[:300])

            # check_baseline: the non-donating program against the donating one's baseline.
            r = await session.call_tool("check_baseline", {
                "paths": ["b_mlp_nodonate.xplane.pb"], "baseline": str(baseline), "max_growth": "5%"})
            cb = r.structured_content or {}
            bl = cb.get("findings", [])
            check("check_baseline: b_mlp_nodonate fails (passed false)", cb.get("passed") is False, json.dumps(cb)[:400])
            check("check_baseline: BL001 at b_mlp_nodonate.py:57",
                  any(f["code"] == "BL001" and f["file"] == "b_mlp_nodonate.py" and f["line"] == 57 for f in bl),
                  json.dumps(bl)[:400])
            check("check_baseline: numbers were compared", cb.get("compared", 0) > 0 and cb.get("missing_keys") == [])
            r = await session.call_tool("check_baseline", {"paths": [str(c_capture)], "baseline": str(baseline)})
            check("check_baseline: the baseline's own capture passes",
                  (r.structured_content or {}).get("passed") is True, json.dumps(r.structured_content)[:300])

            # diff: the growing cache of the fixtures (PT011).
            torch_fx = fixtures / "torch"
            r = await session.call_tool("diff", {
                "earlier": str(torch_fx / "pt011_step10.pickle"), "later": str(torch_fx / "pt011_step20.pickle")})
            d = r.structured_content or {}
            pt011 = [f for f in findings(d) if f["code"] == "PT011"]
            check("diff: PT011 in the later snapshot", not r.is_error and len(pt011) >= 1, json.dumps(d)[:300])
            diff_summary = ((d.get("captures") or [{}])[0].get("torch") or {}).get("diff")
            check("diff: the document carries the diff summary", diff_summary is not None)

            # compare_ranks: two real snapshots as rank 0 and rank 1.
            r = await session.call_tool("compare_ranks", {"dir": str(ranks)})
            cr = r.structured_content or {}
            rows = (cr.get("comparison") or {}).get("ranks", [])
            check("compare_ranks: one row per rank", not r.is_error and len(rows) == 2, json.dumps(cr)[:300])
            check("compare_ranks: each rank has a headline",
                  [x.get("rank") for x in cr.get("ranks", [])] == [0, 1]
                  and all(x.get("headline") for x in cr.get("ranks", [])))
            check("compare_ranks: rows carry allocated bytes",
                  all(isinstance(x.get("allocated_bytes"), int) for x in rows))

            # Errors are tool errors, and the server keeps serving.
            r = await session.call_tool("analyze", {"path": "no_such.pickle"})
            msg = r.content[0].text if r.content else ""
            check("a bad path is a tool error with the one-line message",
                  r.is_error and "no_such.pickle" in msg and "\n" not in msg, msg)
            r = await session.call_tool("analyze", {"path": "b_mlp_nodonate.xplane.pb"})
            check("the server still answers after the error", not r.is_error and r.structured_content)

            # Confinement: a capture outside the roots is refused by absolute path, ../ and a
            # symlink, with one line naming the roots; the server keeps serving.
            for how, path in [("absolute", str(outside / "secret.pickle")),
                              ("../", str(Path(*[".."] * len(ws.parts)) / outside.relative_to(outside.anchor) / "secret.pickle")),
                              ("symlink", "outside_link.pickle")]:
                r = await session.call_tool("analyze", {"path": path})
                msg = r.content[0].text if r.content else ""
                check(f"a capture outside the roots is refused ({how})",
                      r.is_error and "outside the workspace roots (" in msg and str(ws.resolve()) in msg
                      and "\n" not in msg, msg[:300])
            r = await session.call_tool("check_baseline", {"paths": ["/"], "baseline": str(baseline)})
            msg = r.content[0].text if r.content else ""
            check("check_baseline of / is refused", r.is_error and "outside the workspace roots" in msg, msg[:300])
            r = await session.call_tool("explain_line", {"file": "b_mlp_nodonate.py", "line": 57})
            budget = (r.structured_content or {}).get("budget", {})
            check("an answer states its budget", budget.get("limits", {}).get("captures") == 64
                  and "cut" not in budget, json.dumps(budget))

            # Resources: the finding pages.
            res = (await session.list_resources()).resources
            uris = {str(x.uri) for x in res}
            docs = Path(__file__).resolve().parents[2] / "docs" / "findings"
            pages = {f"memlsp://findings/{p.stem}" for p in docs.glob("*.md")}
            check("resources/list has every finding page (one per docs/findings/*.md)",
                  uris == pages, str(sorted(uris ^ pages)))
            page = await session.read_resource("memlsp://findings/JX005")
            c = page.contents[0]
            check("resources/read JX005 is its markdown page",
                  c.text.startswith("# JX005") and c.mime_type == "text/markdown", c.text[:80])


def main():
    memlsp, shared, fixtures = (Path(a).resolve() for a in sys.argv[1:4])
    with tempfile.TemporaryDirectory(prefix="memlsp-mcp-") as tmp:
        try:
            asyncio.run(run(memlsp, shared, fixtures, Path(tmp)))
        except Exception as e:  # a crash is a failure, with its reason
            check("the session ran to the end", False, f"{type(e).__name__}: {e}")
    print(f"{PASSED} passed, {FAILED} failed")
    sys.exit(1 if FAILED or not PASSED else 0)


if __name__ == "__main__":
    main()
