//! Captures made here with real JAX 0.10.2 on the CPU (`fixtures/jax/generate.sh`). The programs
//! sit beside the captures; the captures record `/tmp/memlsp-jaxgen/<name>.py`, so finding the
//! jit line exercises the lookup beside the capture. Expected lines come from the programs'
//! `# CULPRIT(...)` comments.

mod common;

use common::ReportExt;

use std::path::{Path, PathBuf};

use memlsp::findings::{Code, FixKind, Severity};
use memlsp::options::Options;
use memlsp::report::CaptureReport;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/jax/{name}.xplane.pb"))
}

fn culprit_line(name: &str, tag: &str) -> u32 {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/jax/{name}.py"));
    let text = std::fs::read_to_string(py).unwrap();
    text.lines().position(|l| l.contains(tag)).unwrap() as u32 + 1
}

fn analyze(name: &str) -> CaptureReport {
    memlsp::analyze::run_file(&fixture(name), &Options::default()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn fixtures_stay_small() {
    for name in ["decorator_nodonate", "scan_layers", "grads_kept"] {
        let len = std::fs::metadata(fixture(name)).unwrap().len();
        assert!(len < 1 << 20, "{name} is {len} bytes");
    }
}

#[test]
fn bare_jit_decorator_without_donation_is_the_culprit_line() {
    let r = analyze("decorator_nodonate");
    let f = r
        .findings
        .iter()
        .find(|f| f.code == Code::JX005)
        .expect("JX005");
    assert_eq!(f.severity, Severity::Warning);
    let loc = f.location.as_ref().unwrap();
    assert_eq!(loc.file, "/tmp/memlsp-jaxgen/decorator_nodonate.py");
    assert_eq!(
        loc.line,
        culprit_line("decorator_nodonate", "CULPRIT(no-donation)")
    );
    assert!(
        matches!(&f.fixes[0].kind, FixKind::DonateArgnums { argnums, .. } if argnums == &[0, 1]),
        "{:?}",
        f.fixes[0].kind
    );
    // params and momentum: four f32[1024,1024] leaves could be donated; the saving is bounded
    // below their 16 MiB (temporaries lent the outputs' memory move to the heap).
    let (lo, hi) = f.fixes[0].saving_range.expect("a saving range");
    assert!(lo > 0 && hi < 4 * 1024 * 1024 * 4, "{lo} {hi}");
    assert_eq!(f.fixes[0].saving_bytes, Some(lo));
    // JAX's own list.append calls between steps are not growth.
    assert!(
        r.findings.iter().all(|f| f.code != Code::JX004),
        "{}",
        r.headline()
    );
}

#[test]
fn scan_stacked_activations_point_at_the_scan_line() {
    let r = analyze("scan_layers");
    assert!(
        r.findings.iter().all(|f| f.code != Code::JX005),
        "donated step"
    );
    let f = r
        .findings
        .iter()
        .find(|f| f.code == Code::JX002)
        .expect("JX002");
    assert_eq!(
        f.location.as_ref().unwrap().line,
        culprit_line("scan_layers", "CULPRIT(scan-stack)")
    );
    // Three f32[16,512,256] stacks (16 layers × the batch's activations) carried by the loop.
    assert_eq!(f.bytes, Some(3 * 16 * 512 * 256 * 4));
    assert!(r.text().contains("(carried by while."), "{}", r.text());
    let x = r.engine();
    assert!(x["plan"]["roles"]["forward"].as_u64().unwrap() >= 3 * 16 * 512 * 256 * 4);
}

#[test]
fn gradients_appended_every_step_point_at_the_append_line() {
    let r = analyze("grads_kept");
    let f = r
        .findings
        .iter()
        .find(|f| f.code == Code::JX004)
        .expect("JX004");
    assert_eq!(f.severity, Severity::Warning);
    let loc = f.location.as_ref().unwrap();
    assert_eq!(loc.file, "/tmp/memlsp-jaxgen/grads_kept.py");
    assert_eq!(loc.line, culprit_line("grads_kept", "CULPRIT(growth)"));
    assert_eq!(loc.function, "train_loop");
    assert_eq!(f.fixes[0].kind, FixKind::DeviceGetAppend);
    // Four traced steps, one append after each; the new memory per step is the plan's
    // non-aliased outputs: the gradient f32[512,512] (plus a few bytes of XLA:CPU bookkeeping).
    assert!(
        f.evidence[0].text.ends_with("[1, 1, 1, 1]"),
        "{}",
        f.evidence[0].text
    );
    let x = r.engine();
    let new = x["plan"]["non_aliased_output_bytes"].as_u64().unwrap();
    assert_eq!(f.bytes, Some(new));
    assert!(
        (512 * 512 * 4..512 * 512 * 4 + 1024).contains(&new),
        "{new}"
    );
    assert!(
        r.findings.iter().all(|f| f.code != Code::JX005),
        "the step donates w"
    );
}

#[test]
fn a_profile_directory_yields_one_report_per_host_file() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("plugins/profile/2026_11_30_17_00_00");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::copy(fixture("scan_layers"), run.join("vm.xplane.pb")).unwrap();
    let reports = memlsp::analyze::analyze_path(dir.path(), &Options::default()).unwrap();
    assert_eq!(reports.len(), 1);
    assert!(
        reports[0].headline().starts_with("jit_sgd("),
        "{}",
        reports[0].headline()
    );
}

/// Damaged bytes anywhere give a report or an error, never a panic (debug builds also trap
/// arithmetic overflow, so sizes and times from a corrupt file are exercised too).
#[test]
fn corrupted_bytes_never_panic() {
    let bytes = std::fs::read(fixture("decorator_nodonate")).unwrap();
    // Half the mutations land in the /host:metadata plane (HLO protos: sizes, ids, frames).
    let cap = memlsp::xla::Capture::open(&fixture("decorator_nodonate")).unwrap();
    let meta = cap
        .file
        .planes
        .iter()
        .find(|p| p.name == "/host:metadata")
        .unwrap();
    let (meta_start, meta_len) = (meta.start as usize, meta.len as usize);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mutated.xplane.pb");
    // A fixed linear-congruential sequence: deterministic, spread over the file.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let (mut refused, mut reported) = (0, 0);
    for round in 0..300 {
        let mut m = bytes.clone();
        for _ in 0..3 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = if round % 2 == 0 {
                meta_start + (x >> 33) as usize % meta_len
            } else {
                (x >> 33) as usize % m.len()
            };
            m[at] = (x >> 13) as u8;
        }
        std::fs::write(&path, &m).unwrap();
        match memlsp::analyze::run_file(&path, &Options::default()) {
            Ok(r) => {
                assert!(!r.headline().is_empty());
                // The presenters read whatever the damaged plan holds.
                let text = memlsp::cli::render_text(std::slice::from_ref(&r), 10);
                assert!(text.starts_with(&r.headline()));
                assert!(memlsp::cli::render_json(std::slice::from_ref(&r)).contains("\"xla\""));
                reported += 1;
            }
            Err(e) => {
                assert!(
                    e.to_string().starts_with(&path.display().to_string()),
                    "{e}"
                );
                refused += 1;
            }
        }
    }
    // Both outcomes occur, so the mutations reach the decoder's refusals and the analyses alike.
    assert!(
        refused > 10 && reported > 10,
        "refused {refused}, reported {reported}"
    );
}

/// Planes are mapped where the SIGBUS guard is installed (the CLI and the servers): a capture
/// that a new profile overwrites while it is analysed reads as zeros past its new end, and the
/// analysis says so instead of reporting what the zeros decoded to.
#[cfg(target_os = "linux")]
#[test]
fn a_capture_truncated_under_its_mapping_is_reported_as_truncated() {
    memlsp::sigbus::install();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grads_kept.xplane.pb");
    std::fs::copy(fixture("grads_kept"), &path).unwrap();
    let cap = memlsp::xla::Capture::open(&path).unwrap();
    assert!(
        memlsp::xla::analyse(&cap, &Default::default()).is_ok(),
        "the intact copy analyses"
    );
    std::fs::File::create(&path).unwrap(); // truncated, as `open(path, "wb")` does
    let e = match memlsp::xla::analyse(&cap, &Default::default()) {
        Ok(_) => panic!("a truncated capture analysed as if intact"),
        Err(e) => e,
    };
    assert_eq!(e.kind, memlsp::error::ErrorKind::Truncated, "{e}");
    assert!(
        e.to_string().contains("truncated while it was being read"),
        "{e}"
    );
}
