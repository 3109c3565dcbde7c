"""Run action.yml's shell steps the way the GitHub runner runs a composite action (inputs
substituted, GITHUB_PATH / GITHUB_OUTPUT files, RUNNER_TEMP), with `version` = a wheel file, in a
scratch workspace holding a copy of a real snapshot. The `uses:` step (the SARIF upload to code
scanning) needs GitHub and is only named. Checks: the action's memlsp is the wheel's, the SARIF it
writes is SARIF 2.1.0 with the findings `memlsp --check --format json` gives, its `exit-code`
output is 1 (findings at --fail-on information) and the final step fails the job.

    python python/tests/action_steps.py ACTION_YML WHEEL CAPTURE
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml  # PyYAML (pre-commit's dependency, installed with it)


def main() -> int:
    action_yml, wheel, capture = (os.path.abspath(a) for a in sys.argv[1:4])
    action = yaml.safe_load(open(action_yml, encoding="utf-8"))
    assert action["runs"]["using"] == "composite", action["runs"]
    work = tempfile.mkdtemp(prefix="memlsp-action-")
    ws = os.path.join(work, "workspace")
    os.makedirs(os.path.join(ws, "captures"))
    shutil.copy(capture, os.path.join(ws, "captures", os.path.basename(capture)))
    inputs = {k: str(v.get("default", "")) for k, v in action["inputs"].items()}
    inputs.update({"version": wheel, "paths": "captures/", "fail-on": "information"})
    runner_temp = os.path.join(work, "runner_temp")
    os.makedirs(runner_temp)
    gh_path = os.path.join(work, "github_path")
    open(gh_path, "w").close()
    outputs: dict = {}
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    def expand(text: str) -> str:
        def one(m: "re.Match[str]") -> str:
            expr = m.group(1).strip()
            eq = re.fullmatch(r"inputs\.([\w-]+) == '(.*)'", expr)
            if eq:
                return "true" if inputs[eq.group(1)] == eq.group(2) else "false"
            if expr.startswith("inputs."):
                return inputs[expr[len("inputs."):]]
            s = re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expr)
            if s:
                return outputs.get(s.group(1), {}).get(s.group(2), "")
            raise ValueError(f"action.yml: expression not understood here: {expr}")
        return re.sub(r"\$\{\{(.*?)\}\}", one, text)

    last = None
    for step in action["runs"]["steps"]:
        name = step.get("name", step.get("uses"))
        if "if" in step and expand(step["if"]) != "true":
            continue
        if "uses" in step:
            print(f"--   step {name!r} uses {step['uses']} (needs GitHub; not run here)")
            continue
        out_file = os.path.join(work, f"output_{len(outputs)}")
        open(out_file, "w").close()
        path = os.pathsep.join([l for l in open(gh_path).read().splitlines() if l] + [os.environ["PATH"]])
        env = dict(os.environ, PATH=path, RUNNER_TEMP=runner_temp, GITHUB_PATH=gh_path,
                   GITHUB_OUTPUT=out_file, GITHUB_ACTION_PATH=os.path.dirname(action_yml), GITHUB_WORKSPACE=ws)
        env.update({k: expand(str(v)) for k, v in step.get("env", {}).items()})
        last = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", expand(step["run"])],
                              cwd=ws, env=env, capture_output=True, text=True)
        print(f"--   step {name!r}: exit {last.returncode} {last.stdout.strip()[-200:]!r}")
        if step.get("id"):
            outputs[step["id"]] = dict(l.split("=", 1) for l in open(out_file).read().splitlines() if "=" in l)
        if last.returncode != 0 and step is not action["runs"]["steps"][-1]:
            check(False, f"step {name!r} failed: {last.stderr[-2000:]}")
            return 1

    installed = [l for l in open(gh_path).read().splitlines() if l]
    memlsp = os.path.join(installed[0], "memlsp") if installed else None
    check(bool(memlsp) and os.path.isfile(memlsp) and memlsp.startswith(runner_temp),
          f"the action installed memlsp from the wheel into its own environment: {memlsp}")
    sarif = json.load(open(os.path.join(ws, inputs["sarif"]), encoding="utf-8"))
    check(sarif.get("version") == "2.1.0", "the SARIF file is SARIF 2.1.0")
    got = sorted((r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] if r.get("locations") else None)
                 for r in sarif["runs"][0]["results"])
    js = json.loads(subprocess.run([memlsp, "--check", "captures/", "--format", "json"], cwd=ws,
                                   capture_output=True, text=True).stdout)
    want_codes = sorted(f["code"] for c in js["captures"] for f in c["findings"])
    check(bool(got) and [g[0] for g in got] == want_codes,
          f"its results are the findings of --check --format json: {[g[0] for g in got]}")
    check(outputs.get("check", {}).get("exit-code") == "1", f"exit-code output {outputs.get('check')} (1: findings)")
    check(last is not None and last.returncode == 1, "the last step fails the job on findings")
    shutil.rmtree(work, ignore_errors=True)
    print(f"action: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
