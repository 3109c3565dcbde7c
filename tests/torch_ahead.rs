//! What the analysis makes ahead of the timeline, while another thread walks it (a trace whose
//! replay stops at once): the peak and first-OOM indices from `timeline::set_indices`, the
//! timeline's live sets there, and the compile regions at that peak. On every real capture
//! they are the timeline's own.

mod common;

use memlsp::frames::FrameFilter;
use memlsp::options::DecodeOptions;
use memlsp::torch::compile_regions;
use memlsp::torch::load::load_snapshot;
use memlsp::torch::stacks::StackIndex;
use memlsp::torch::timeline;

#[test]
fn indices_and_compile_regions_ahead_of_the_timeline_are_its_own_on_real_captures() {
    let Some(files) = common::real_snapshots() else {
        return;
    };
    let (mut peaks, mut ooms, mut regions) = (0, 0, 0);
    for f in &files {
        let snap = load_snapshot(f, &DecodeOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e:?}", f.display()));
        let stacks = StackIndex::new(&snap, &FrameFilter::default());
        let t = timeline::compute(&snap, &stacks);
        let mut ahead = Vec::new();
        for d in &t.devices {
            let got = timeline::set_indices(snap.trace(d.device));
            let want = (
                d.peak_set.as_ref().map(|p| p.index),
                d.oom_sets.first().map(|p| p.index),
            );
            assert_eq!(got, want, "{} device {}", f.display(), d.device);
            peaks += usize::from(got.0.is_some());
            ooms += usize::from(got.1.is_some());
            ahead.extend(got.0.map(|k| (d.device, k)));
        }
        // The timeline's own live sets, made ahead: where it takes them, they are the ones
        // it would make.
        let at = timeline::all_set_indices(&snap);
        assert_eq!(at.len(), t.devices.len(), "{}", f.display());
        for (d, ks, sets) in timeline::sets_ahead(&snap, &stacks, &at) {
            let t = t.device(d).expect("a timeline for each traced device");
            let mut want: Vec<&timeline::LiveSet> = t.peak_set.iter().collect();
            want.extend(&t.oom_sets);
            assert_eq!(
                sets.iter().collect::<Vec<_>>(),
                want,
                "{} device {d}",
                f.display()
            );
            assert_eq!(ks.len(), want.len());
        }
        let claim = timeline::SetsAhead::default();
        claim.help(|| timeline::sets_ahead(&snap, &stacks, &at));
        assert_eq!(timeline::compute_with(&snap, &stacks, &claim), t);
        let early =
            compile_regions::compute_at(&snap, |d| ahead.iter().find(|p| p.0 == d).map(|p| p.1));
        let late = compile_regions::compute(&snap, &t);
        regions += late.devices.len();
        assert_eq!(
            serde_json::to_string(&early).unwrap(),
            serde_json::to_string(&late).unwrap(),
            "{}",
            f.display()
        );
    }
    assert!(files.len() >= 39, "the 39 real snapshots ({})", files.len());
    // Each part is compared on some: 25 device peaks, one OOM set, 10 devices with compile
    // contexts recorded (counted when this test was written).
    assert!(
        peaks >= 25 && ooms >= 1 && regions >= 10,
        "{peaks} {ooms} {regions}"
    );
}
