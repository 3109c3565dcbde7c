"""The `.pre-commit-hooks.yaml` hook run by pre-commit itself, with `memlsp` from this
environment's install: a scratch git repository commits a real snapshot and a Python file; its
`.pre-commit-config.yaml` is the hook of this repository as a `local` hook (language `system`, so
pre-commit runs the installed wheel's binary instead of building one). Checks what a user sees:
with `--fail-on information` the commit is refused and the finding is printed; with the default
(`warning`) the hook passes; the Python file is never handed to memlsp.

    python python/tests/precommit_hook.py HOOKS_YAML CAPTURE
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import yaml


def main() -> int:
    hooks_yaml, capture = (os.path.abspath(a) for a in sys.argv[1:3])
    hooks = yaml.safe_load(open(hooks_yaml, encoding="utf-8"))
    hook = next(h for h in hooks if h["id"] == "memlsp-check")
    assert hook["language"] == "python", hook
    repo = tempfile.mkdtemp(prefix="memlsp-precommit-")
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "ci@example.invalid")
    git("config", "user.name", "ci")
    os.makedirs(os.path.join(repo, "captures"))
    shutil.copy(capture, os.path.join(repo, "captures", os.path.basename(capture)))
    with open(os.path.join(repo, "train.py"), "w") as f:
        f.write("print('not a capture')\n")
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    def run_with(args):
        local = dict(hook, language="system")
        if args:
            local["args"] = args
        cfg = {"repos": [{"repo": "local", "hooks": [local]}]}
        with open(os.path.join(repo, ".pre-commit-config.yaml"), "w") as f:
            yaml.safe_dump(cfg, f)
        git("add", "-A")
        env = dict(os.environ, PRE_COMMIT_HOME=os.path.join(repo, ".pre-commit-home"), NO_COLOR="1")
        return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--all-files", "--verbose"],
                              cwd=repo, env=env, capture_output=True, text=True)

    strict = run_with(["--fail-on", "information"])
    out = strict.stdout + strict.stderr
    check(strict.returncode == 1 and "Failed" in out, f"--fail-on information: the hook fails (exit {strict.returncode})")
    check("information[PT004]" in out and os.path.basename(capture) in out,
          "the finding is printed with its capture")
    check("train.py" not in out, "the Python file is not handed to memlsp")
    default = run_with(None)
    out = default.stdout + default.stderr
    check(default.returncode == 0 and "Passed" in out, f"default --fail-on warning: the hook passes (exit {default.returncode})\n{out[-1500:] if default.returncode else ''}")
    shutil.rmtree(repo, ignore_errors=True)
    print(f"pre-commit hook: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
