//! The editor's `memlsp.capacity` setting: the first request that fails on that device is a
//! PT017 diagnostic on its line ("OOM here on …: this step needs …"), and the hover there shows
//! what the run needs (docs/FITS.md). A real snapshot, its user files recreated at their recorded
//! relative paths (`/root/autodl-tmp/assignment1-basics/cs336_basics/…` → `<ws>/cs336_basics/…`).

mod lsp_support;
#[path = "support/page.rs"]
mod page;

use std::time::Duration;

use lsp_support::{Lsp, copy, tempdir, uri};
use serde_json::json;

const SNAPSHOT: &str = "torch_snapshots/real/silmont2000__memory_forward_bf16_128.pickle";

#[test]
fn capacity_setting_puts_the_first_failing_request_on_its_line() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    for f in [
        "cs336_basics/model/swiglu.py",
        "cs336_basics/model/linear.py",
    ] {
        let p = ws.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let text: String = (1..=80)
            .map(|i| format!("        x_{i} = f(x)  # line {i}\n"))
            .collect();
        std::fs::write(&p, text).unwrap();
    }
    copy(&src, &ws.join("runs/memory_forward_bf16_128.pickle"));
    let swiglu = ws.join("cs336_basics/model/swiglu.py");
    // Without a capacity: no PT017.
    let mut lsp = Lsp::start(&ws, json!({}));
    lsp.open(&swiglu);
    let d = lsp
        .diagnostics(&swiglu, Duration::from_secs(30), |_| true)
        .unwrap_or_default();
    assert!(!d.iter().any(|x| x["code"] == "PT017"), "{d:?}");
    lsp.shutdown();

    let mut lsp = Lsp::start(&ws, json!({"capacity": "700MiB"}));
    lsp.open(&swiglu);
    let diags = lsp
        .diagnostics(&swiglu, Duration::from_secs(60), |d| {
            d.iter().any(|x| x["code"] == "PT017")
        })
        .unwrap_or_else(|| panic!("no PT017: {:?}", lsp.messages()));
    let d = diags.iter().find(|x| x["code"] == "PT017").unwrap();
    // `memlsp fit … --on 700MiB`: the first failing request is trace entry 1,704 at swiglu.py:33.
    assert_eq!(d["range"]["start"]["line"], 32, "{d}");
    assert_eq!(d["severity"], 1, "{d}");
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.starts_with("OOM here on 700.00 MiB: this step needs 818.00 MiB"),
        "{msg}"
    );
    let hover = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri(&swiglu)}, "position": {"line": 32, "character": 8}}),
    );
    let md = hover["contents"]["value"].as_str().unwrap_or("");
    assert!(md.contains("PT017"), "{md}");
    assert!(md.contains("needs 857735168 B"), "{md}");
    assert!(md.contains("simulated"), "{md}");
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}

/// With `memlsp.capacity` set, the hover of any finding shows what the run needs, also where it
/// fits (kkaitlyn111's training step on an H100: PT004 and PT001 on optimizers.py:82).
#[test]
fn hover_on_a_finding_shows_needs_when_a_capacity_is_set() {
    let Some(src) =
        lsp_support::shared("torch_snapshots/real/kkaitlyn111__memory_ctx128_fullstep.pickle")
    else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let opt = ws.join("cs336_basics/optimizers.py");
    std::fs::create_dir_all(opt.parent().unwrap()).unwrap();
    let text: String = (1..=450)
        .map(|i| format!("        state_{i} = torch.zeros_like(p)  # line {i}\n"))
        .collect();
    std::fs::write(&opt, text).unwrap();
    copy(&src, &ws.join("runs/memory_ctx128_fullstep.pickle"));
    let mut lsp = Lsp::start(&ws, json!({"capacity": "H100"}));
    lsp.open(&opt);
    let diags = lsp
        .diagnostics(&opt, Duration::from_secs(90), |d| {
            d.iter().any(|x| x["code"] == "PT004")
        })
        .unwrap_or_else(|| panic!("no PT004: {:?}", lsp.messages()));
    assert!(
        !diags.iter().any(|x| x["code"] == "PT017"),
        "it fits: {diags:?}"
    );
    // The server publishes what the capture records first and the simulations (the fit among
    // them) when they finish: ask until the refined result answers.
    let want = "device 0 needs 51.46 GiB to run without an OOM (fits on the 79.15 GiB set: 27.69 GiB spare)";
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let md = loop {
        let hover = lsp.request(
            "textDocument/hover",
            json!({"textDocument": {"uri": uri(&opt)}, "position": {"line": 81, "character": 8}}),
        );
        let md = hover["contents"]["value"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if md.contains(want) || std::time::Instant::now() > deadline {
            break md;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        md.contains("device 0 needs 51.46 GiB to run without an OOM (fits on the 79.15 GiB set: 27.69 GiB spare)"),
        "{md}"
    );
    lsp.shutdown();
}

/// "Show memory timeline" with `memlsp.capacity` set: the server's page carries the fit as
/// `memlsp report --on` draws it (the capacity line, `needs`, the first failing request), and a
/// new capacity draws the page again instead of showing the kept one.
#[test]
fn the_timeline_page_draws_the_configured_capacity_and_the_first_failure() {
    let Some(src) = lsp_support::shared(SNAPSHOT) else {
        return;
    };
    let (_tmp, ws) = tempdir();
    let swiglu = ws.join("cs336_basics/model/swiglu.py");
    std::fs::create_dir_all(swiglu.parent().unwrap()).unwrap();
    let text: String = (1..=80)
        .map(|i| format!("        x_{i} = f(x)  # line {i}\n"))
        .collect();
    std::fs::write(&swiglu, text).unwrap();
    let cap = ws.join("runs/memory_forward_bf16_128.pickle");
    copy(&src, &cap);
    let mut lsp = Lsp::start(&ws, json!({"capacity": "700MiB"}));
    lsp.open(&swiglu);
    lsp.diagnostics(&swiglu, Duration::from_secs(60), |d| {
        d.iter().any(|x| x["code"] == "PT017")
    })
    .unwrap_or_else(|| panic!("no PT017: {:?}", lsp.messages()));
    let timeline = |lsp: &mut Lsp| {
        let page = lsp.request(
            "workspace/executeCommand",
            json!({"command": "memlsp.timeline", "arguments": [{"capture": cap.to_string_lossy()}]}),
        );
        let html = page["html"].as_str().unwrap_or_else(|| panic!("{page}"));
        assert!(
            html.contains("\"capacity \" + bytes(cap)"),
            "the page draws the capacity line"
        );
        page::page_data(html)["captures"][0]["torch"].clone()
    };
    let torch = timeline(&mut lsp);
    let fit = &torch["fit"][0];
    // The same numbers as `memlsp fit … --on 700MiB` (tests/cli_fit.rs).
    assert_eq!(fit["validated"], true, "{fit}");
    assert_eq!(fit["needs_bytes"], 818u64 << 20, "{fit}");
    assert_eq!(fit["on"]["capacity_bytes"], 700u64 << 20, "{fit}");
    assert_eq!(fit["on"]["fits"], false, "{fit}");
    let failure = &fit["on"]["first_failure"];
    assert_eq!(failure["entry"], 1704, "{fit}");
    assert_eq!(failure["site"]["line"], 33, "{fit}");
    assert!(
        failure["site"]["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("swiglu.py")),
        "{fit}"
    );

    // Another capacity (on which it fits): the kept page is not shown, the new one has it.
    lsp.settings = json!({"capacity": "1GiB"});
    lsp.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": null}),
    );
    lsp.diagnostics(&swiglu, Duration::from_secs(60), |d| {
        !d.iter().any(|x| x["code"] == "PT017")
    })
    .unwrap_or_else(|| panic!("PT017 stayed on 1 GiB: {:?}", lsp.messages()));
    let torch = timeline(&mut lsp);
    let on = &torch["fit"][0]["on"];
    assert_eq!(on["capacity_bytes"], 1u64 << 30, "{on}");
    assert_eq!(on["fits"], true, "{on}");
    assert!(on["first_failure"].is_null(), "{on}");
    assert!(lsp.errors().is_empty(), "{:?}", lsp.errors());
    lsp.shutdown();
}
