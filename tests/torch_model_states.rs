//! PT020 on the real snapshots: model states as a share of the peak, with the size fixes'
//! bounds labelled inferred, and PT004 not repeating them.

mod common;

use memlsp::findings::{Code, Label};
use memlsp::options::Options;

const GIB: f64 = (1u64 << 30) as f64;

fn findings(rel: &str) -> Option<Vec<memlsp::findings::Finding>> {
    let path = common::shared(&format!("torch_snapshots/real/{rel}"))?;
    Some(
        memlsp::analyze::run_file(&path, &Options::default())
            .unwrap()
            .findings,
    )
}

#[test]
fn adam_state_gradients_and_weights_are_the_whole_peak_of_sidsoc12() {
    let Some(all) = findings("sidsoc12__8169e1e6_mem_snapshot_ctx128_fp32_train.pickle") else {
        return;
    };
    let f = all
        .iter()
        .find(|f| f.code == Code::PT020)
        .expect("PT020 on sidsoc12");
    assert_eq!(f.bytes_label, Some(Label::Inferred));
    assert!(f.percent.unwrap() > 95.0, "{:?}", f.percent);
    assert!(
        f.message.contains("optimizer state 25.38 GiB"),
        "{}",
        f.message
    );
    assert_eq!(f.location.as_ref().map(|l| l.line), Some(53));
    // 8-bit m/v: ¾ of the 25.38 GiB state, a bound.
    let eight = &f.fixes[0];
    assert!(eight.title.contains("AdamW8bit") && eight.title.contains("at most"));
    let saved = eight.saving_bytes.unwrap() as f64 / GIB;
    assert!((saved - 19.04).abs() < 0.01, "{saved}");
    assert!(f.fixes.iter().all(|x| x.simulated.is_none()));
    // PT004 still says "not a leak" and leaves the size advice to PT020.
    let pt004 = all.iter().find(|f| f.code == Code::PT004).expect("PT004");
    assert!(
        pt004.fixes[0].title.contains("PT020"),
        "{}",
        pt004.fixes[0].title
    );
    assert!(!pt004.fixes[0].title.contains("8-bit Adam"));
}

#[test]
fn an_activation_dominated_training_step_gets_no_model_state_finding() {
    let Some(all) = findings("Wedsonlin__results_medium_1024_training_memory_snapshot.pickle")
    else {
        return;
    };
    assert!(all.iter().all(|f| f.code != Code::PT020));
    let pt004 = all.iter().find(|f| f.code == Code::PT004).expect("PT004");
    assert!(pt004.fixes[0].title.contains("8-bit Adam"));
}
