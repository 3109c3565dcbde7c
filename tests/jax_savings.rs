//! What a JAX fix saves, checked: for every before/after pair of real captures (the shared
//! `b_mlp_nodonate` → `c_mlp_donate` and each `fixtures/jax/pairs/*`), the fix memlsp suggests on
//! the *before* capture carries a saving range computed from the plan that holds the measured
//! saving (before − after total peak, exact bytes from xprof) and is no wider than half its
//! upper end; where a fix is known not to help (remat inside an unrolled loop on XLA:CPU), the
//! finding says why and promises nothing.

mod common;

use common::ReportExt;

use std::path::{Path, PathBuf};

use memlsp::findings::{Code, Finding, Fix, FixKind};
use memlsp::options::Options;
use memlsp::report::CaptureReport;
use serde_json::Value;

fn pairs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/jax/pairs")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn manifest(pair: &str) -> Value {
    json(&pairs().join(pair).join("manifest.json"))
}

/// The before capture of a pair, analysed on the module the manifest names.
fn before(pair: &str) -> CaptureReport {
    let m = manifest(pair);
    let path = pairs()
        .join(pair)
        .join(m["before"]["capture"].as_str().unwrap());
    analyse(&path, m["before"]["module"].as_str())
}

fn analyse(path: &Path, module: Option<&str>) -> CaptureReport {
    let mut opts = Options::default();
    opts.analysis.module = module.map(str::to_string);
    memlsp::analyze::run_file(path, &opts).unwrap_or_else(|e| panic!("{e}"))
}

fn peak_total(side: &Value) -> u64 {
    side["xprof"]["peak_total_bytes"].as_u64().unwrap()
}

fn finding(r: &CaptureReport, code: Code) -> &Finding {
    r.findings
        .iter()
        .find(|f| f.code == code)
        .unwrap_or_else(|| panic!("no {code} in {}", r.text()))
}

/// The fix whose title starts with `title` (the pair's fix), of the finding `code`.
fn fix<'a>(r: &'a CaptureReport, code: Code, title: &str) -> (&'a Finding, &'a Fix) {
    let f = finding(r, code);
    let x = f
        .fixes
        .iter()
        .find(|x| x.title.starts_with(title))
        .unwrap_or_else(|| panic!("no fix `{title}…` on {code}: {:#?}", f.fixes));
    (f, x)
}

/// The range holds the measured saving and says something.
fn assert_holds(what: &str, x: &Fix, measured: u64) {
    let (lo, hi) = x
        .saving_range
        .unwrap_or_else(|| panic!("{what}: no saving range on `{}`", x.title));
    assert!(
        (lo..=hi).contains(&measured),
        "{what}: measured {measured} B ({:.2} MiB) outside [{lo}, {hi}] ({:.2}–{:.2} MiB): {}",
        mib(measured),
        mib(lo),
        mib(hi),
        x.title
    );
    assert!(
        hi - lo <= hi / 2,
        "{what}: [{lo}, {hi}] is wider than half its upper end"
    );
    assert_eq!(
        x.saving_bytes,
        Some(lo),
        "{what}: the one number is the lower end"
    );
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// measured = before − after xprof total peak, as the manifest records it.
fn measured(pair: &str) -> u64 {
    let m = manifest(pair);
    let saving = peak_total(&m["before"]) - peak_total(&m["after"]);
    assert_eq!(Some(saving), m["measured_saving_bytes"].as_u64(), "{pair}");
    saving
}

#[test]
fn donation_saving_holds_on_the_shared_mlp() {
    let Some(b) = common::shared("jax_cpu_captures/b_mlp_nodonate/b_mlp_nodonate.xplane.pb") else {
        return;
    };
    let Some(c_oracle) = common::shared("jax_cpu_captures/c_mlp_donate/oracle.json") else {
        return;
    };
    let b_oracle = b.with_file_name("oracle.json");
    let total = |o: &Value| -> u64 {
        let largest = o["largest_module"].clone();
        o["modules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["module"] == largest && m["memory_space"] == 0)
            .unwrap()["peak_total_bytes"]
            .as_u64()
            .unwrap()
    };
    // 290.16 → 186.09 MiB.
    let saving = total(&json(&b_oracle)) - total(&json(&c_oracle));
    assert_eq!(saving / (1 << 20), 104);
    let r = analyse(&b, None);
    let (_, x) = fix(&r, Code::JX005, "add donate_argnums=(0, 1)");
    assert!(matches!(x.kind, FixKind::DonateArgnums { .. }));
    assert_holds("b_mlp_nodonate → c_mlp_donate", x, saving);
    // Less than the naive 144.08 MiB of outputs.
    assert!(x.saving_range.unwrap().1 < 144 << 20);
}

#[test]
fn donation_savings_hold_on_the_transformer_pairs() {
    for pair in ["donate_transformer", "donate_partial"] {
        let r = before(pair);
        let (f, x) = fix(&r, Code::JX005, "add donate_argnums=(0, 1)");
        assert!(
            matches!(&x.kind, FixKind::DonateArgnums { argnums, .. } if argnums == &[0, 1]),
            "{pair}: {:?}",
            x.kind
        );
        assert_holds(pair, x, measured(pair));
        // The naive estimate (the outputs' bytes) is above the range.
        let naive = manifest(pair)["naive_estimate"]["bytes"].as_u64().unwrap();
        assert!(x.saving_range.unwrap().1 < naive, "{pair}");
        assert!(
            f.evidence.iter().any(|e| e.text.contains("temporaries")),
            "{pair}: {:#?}",
            f.evidence
        );
    }
    // Params donated already: the finding names what is not, and keeps argument 0 donated.
    let r = before("donate_partial");
    let f = finding(&r, Code::JX005);
    assert!(
        f.message.starts_with("params donated, opt_state not"),
        "{}",
        f.message
    );
}

#[test]
fn checkpointing_a_scan_saving_holds() {
    let r = before("checkpoint");
    let (f, x) = fix(&r, Code::JX002, "wrap the scanned layer in jax.checkpoint");
    assert_eq!(x.kind, FixKind::JaxCheckpoint);
    assert_holds("checkpoint", x, measured("checkpoint"));
    // An MLP's [rows, F] activations that happen to be square are not attention matrices.
    assert!(
        f.fixes.iter().all(|x| !x.title.contains("S×S")),
        "{:#?}",
        f.fixes
    );
}

#[test]
fn microbatching_saving_holds() {
    let r = before("microbatch");
    let (_, x) = fix(&r, Code::JX002, "accumulate gradients over 8 microbatches");
    assert_holds("microbatch", x, measured("microbatch"));
}

#[test]
fn bf16_unscale_saving_holds() {
    let r = before("bf16_unscale");
    let (f, x) = fix(&r, Code::JX003, "keep it in bf16");
    assert!(f.message.starts_with("f32 copies of bf16 arrays"));
    assert_holds("bf16_unscale", x, measured("bf16_unscale"));
}

/// Remat inside an unrolled Python loop (XLA:CPU): the finding says why it does not help, the
/// checkpoint fix promises nothing, and the scan it points at is bounded.
fn assert_unrolled_remat_is_not_promised(what: &str, r: &CaptureReport) {
    let f = finding(r, Code::JX002);
    assert!(
        f.evidence.iter().any(|e| e.text.contains("unrolled")
            && e.text.contains("scheduled before the backward pass")),
        "{what}: {:#?}",
        f.evidence
    );
    let remat = f
        .fixes
        .iter()
        .find(|x| x.kind == FixKind::JaxCheckpoint)
        .unwrap_or_else(|| panic!("{what}: {:#?}", f.fixes));
    assert!(
        remat.title.contains("no saving expected"),
        "{}",
        remat.title
    );
    assert_eq!(
        (remat.saving_bytes, remat.saving_range),
        (None, None),
        "{what}"
    );
    assert!(!remat.preferred, "{what}");
    let scan = f
        .fixes
        .iter()
        .find(|x| x.title.starts_with("scan over the layers"))
        .unwrap_or_else(|| panic!("{what}: {:#?}", f.fixes));
    assert!(scan.preferred, "{what}");
}

#[test]
fn remat_in_an_unrolled_loop_is_not_promised() {
    let pair = "checkpoint_unrolled";
    let r = before(pair);
    assert_unrolled_remat_is_not_promised(pair, &r);
    // What checkpoint_unrolled measured (142.00 → 141.00 MiB): next to nothing.
    assert!(measured(pair) <= 1 << 20);
    // The scan it points at is what `checkpoint_after` is: the same model scanned and
    // checkpointed (142.00 → 57.00 MiB).
    let scanned =
        peak_total(&manifest(pair)["before"]) - peak_total(&manifest("checkpoint")["after"]);
    let (_, x) = fix(&r, Code::JX002, "scan over the layers");
    assert_holds("checkpoint_unrolled → checkpoint_after", x, scanned);
}

#[test]
fn remat_of_unrolled_attention_layers_is_not_promised() {
    let Some(e) = common::shared("jax_cpu_captures/e_attention_big/e_attention_big.xplane.pb")
    else {
        return;
    };
    let r = analyse(&e, None);
    assert_unrolled_remat_is_not_promised("e_attention_big", &r);
}

#[test]
fn text_report_shows_the_range_with_its_label() {
    let r = before("donate_partial");
    let (_, x) = fix(&r, Code::JX005, "add donate_argnums=(0, 1)");
    let (lo, hi) = x.saving_range.unwrap();
    let range = memlsp::findings::fmt_range(lo, hi);
    let text = r.text();
    let line = text
        .lines()
        .find(|l| l.contains("add donate_argnums=(0, 1)"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&format!("saves {range} [inferred]")),
        "{line}"
    );
    let doc: Value = serde_json::to_value(x).unwrap();
    assert_eq!(doc["saving_range"], serde_json::json!([lo, hi]));
}
