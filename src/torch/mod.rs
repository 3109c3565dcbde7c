//! PyTorch CUDA memory snapshots: model (`model`), decoding (`load`, `intern`) and analyses.
//!
//! [`analyse`] runs every analysis once over a loaded [`Snapshot`]; [`output`] turns the result
//! into the engine's typed [`Output`] (summary, sites, findings). Loading files and combining
//! ranks or two snapshots of one run is the pipeline's job (`crate::analyze`).

pub mod attention;
pub mod autocast_cache;
pub mod budget;
pub mod capture_limits;
pub mod categories;
pub mod compile_regions;
#[cfg(test)]
mod device_scale_tests;
pub mod device_skew;
pub mod diff;
pub mod fragmentation;
mod intern;
pub mod layer_calls;
pub mod layers;
pub mod load;
pub mod logits;
pub mod memo;
pub mod model;
pub mod model_states;
pub mod near_oom;
pub mod no_backward;
pub mod optim_state;
pub mod patterns;
pub mod range;
pub mod ranks;
pub mod recording;
pub mod release;
pub mod release_summary;
pub mod replay;
pub mod series;
pub mod sites;
pub mod stacks;
pub mod stages;
pub mod summary;
pub mod timeline;
pub mod totals;
pub mod trace_index;
pub mod trend;
pub mod worth;

// The simulations' room is `replay`; these paths stay for the front ends that use them.
pub use replay::whatif;

use crate::findings::{self, Code, Finding, Label};
use crate::options::AnalysisOptions;
use crate::site::{PercentOf, Site, SiteFrame, SiteRole};
use crate::torch::model::Snapshot;
use crate::torch::stacks::{SiteKind, StackIndex};

/// Every analysis of one snapshot.
pub struct Analysis {
    pub totals: totals::Totals,
    /// Sites over all devices.
    pub sites: sites::Sites,
    /// Sites per device (same order as `totals.devices`).
    pub device_sites: Vec<sites::Sites>,
    pub timeline: timeline::Timeline,
    /// Recorded and inferred training stages per traced device.
    pub stages: stages::Stages,
    pub fragmentation: Vec<fragmentation::OomDiagnosis>,
    pub findings: Vec<Finding>,
    pub stacks: StackIndex,
    /// Every release classified by its own stack (why memory was freed).
    pub releases: release::Releases,
    /// The allocator replays of this snapshot (validation, what-ifs, states), computed once
    /// each and shared by the analyses and the summary.
    pub replays: replay::Replays,
    /// The simulations ran (what-ifs on the findings, the summary's replay check); `false`
    /// while [`analyse_staged`] shows what the capture records, before them.
    pub simulated: bool,
    /// PT018's numbers: the attention scores grouped at a device's peak (`attention::scores`),
    /// computed once for the detector and the summary.
    pub attention: Option<attention::Attention>,
    /// The window's live blocks at each device's peak, shared by PT018 and PT019 while the
    /// detectors run.
    pub peak_live: attention::PeakLive,
    /// The compile regions, when made while another thread walked the timeline; `None`: the
    /// output makes them.
    pub compile_regions: Option<compile_regions::CompileRegions>,
}

/// What the engine hands to the pipeline for one snapshot: no text, no JSON, nothing that
/// needs the snapshot any more.
pub struct Output {
    pub summary: summary::Summary,
    pub sites: Vec<Site>,
    pub findings: Vec<Finding>,
}

/// Shown what a capture records, before the simulations: see [`analyse_staged`].
pub type Recorded<'a> = dyn FnMut(&Snapshot, &Analysis) + 'a;

/// Run every analysis over a loaded snapshot.
pub fn analyse(snap: &Snapshot, opts: &AnalysisOptions) -> Analysis {
    analyse_staged(snap, opts, None)
}

/// [`analyse`], showing `recorded` what the capture records (totals, sites, the findings of
/// the recorded trace) before the simulations run: its [`Analysis`] has `simulated: false`,
/// and a summary of it reports the replay as not run yet. The allocator's validation replay
/// runs meanwhile on a second thread on a large trace, as in [`analyse`].
pub fn analyse_staged(
    snap: &Snapshot,
    opts: &AnalysisOptions,
    recorded: Option<&mut Recorded<'_>>,
) -> Analysis {
    use crate::timings::time;
    let stacks = time("stacks", || StackIndex::new(snap, &opts.frames));
    let others = |stacks: &StackIndex| {
        let totals = time("totals", || totals::compute(snap, stacks));
        let (all_sites, device_sites) = time("sites", || {
            let all_sites = sites::compute(snap, stacks, None);
            let device_sites: Vec<_> = totals
                .devices
                .iter()
                .map(|d| sites::compute(snap, stacks, Some(d.device)))
                .collect();
            (all_sites, device_sites)
        });
        (totals, all_sites, device_sites)
    };
    // On a large trace the allocator's validation replay (what the summary checks and every
    // what-if starts from) runs on a second thread from the start, beside the other analyses.
    let entries: usize = snap.device_traces.iter().flatten().map(Vec::len).sum();
    let replays = replay::Replays::new();
    // The timeline, the longest walk before the detectors: the replay thread computes it when
    // it is done before the main thread gets there (a trace that does not validate, whose
    // replay stops at once), and the main thread meanwhile does what does not need it.
    let timeline_claim = memo::Claim::default();
    // Its live sets (peak, first OOMs), which the main thread may make while it is walked.
    let sets_ahead = timeline::SetsAhead::default();
    // The replay thread has nothing left to do: a second core is free for the analyses.
    let idle = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        if entries >= PARALLEL_FROM && parallel() {
            let r = replays.clone();
            let (claim, idle, sets) = (&timeline_claim, &idle, &sets_ahead);
            let _ = std::thread::Builder::new()
                .name("memlsp-replay".into())
                .spawn_scoped(sc, move || {
                    r.warm(snap);
                    let done = || idle.store(true, std::sync::atomic::Ordering::Release);
                    claim.help(|| {
                        let t = time("timeline", || {
                            // Its own index of the stacks: the main thread's goes into the analysis.
                            let stacks = StackIndex::new(snap, &opts.frames);
                            timeline::compute_with(snap, &stacks, sets)
                        });
                        // Idle before the main thread, woken by the value, asks.
                        done();
                        t
                    });
                    done();
                });
        }
        let (totals, all_sites, device_sites) = others(&stacks);
        let releases = time("releases", || release::Releases::compute(snap));
        let peak_live = attention::PeakLive::default();
        // While the replay thread walks the timeline, what needs only its peak and first OOM
        // indices is made here instead of waiting for it.
        let compile_regions = timeline_claim.helping().then(|| {
            time("ahead of the timeline", || {
                ahead(snap, &stacks, &releases, &peak_live, &sets_ahead)
            })
        });
        let timeline = timeline_claim.take(|| {
            time("timeline", || {
                timeline::compute_with(snap, &stacks, &sets_ahead)
            })
        });
        // PT018's grouping needs only the timeline: beside the stages when a core is free.
        let attention_scores = || {
            time("attention", || {
                attention::scores(snap, &timeline, &peak_live)
            })
        };
        let stages_now = || {
            time("stages", || {
                stages::compute(snap, &stacks, &timeline, &releases)
            })
        };
        let (stages, attention) = if idle.load(std::sync::atomic::Ordering::Acquire) {
            // The summary's release walks too (the detectors seldom need them on such a trace),
            // by whichever side is done first.
            let walks_taken = std::sync::atomic::AtomicBool::new(false);
            let walks = || {
                if !walks_taken.swap(true, std::sync::atomic::Ordering::AcqRel) {
                    time("release walks", || {
                        release_summary::warm(snap, &releases, &stacks, &timeline)
                    });
                }
            };
            beside(
                || {
                    let s = stages_now();
                    walks();
                    s
                },
                || {
                    let a = attention_scores();
                    walks();
                    a
                },
            )
        } else {
            (stages_now(), attention_scores())
        };
        let fragmentation = time("fragmentation", || {
            fragmentation::diagnose(snap, &totals, &timeline)
        });
        let mut a = Analysis {
            totals,
            sites: all_sites,
            device_sites,
            timeline,
            stages,
            fragmentation,
            findings: Vec::new(),
            stacks,
            releases,
            replays,
            simulated: false,
            attention,
            peak_live,
            compile_regions,
        };
        let mut found = time("patterns", || patterns::detect(snap, &a));
        a.peak_live.clear();
        if let Some(recorded) = recorded {
            let mut shown = found.clone();
            worth::calibrate(&a, &mut shown);
            findings::sort(&mut shown);
            a.findings = shown;
            recorded(snap, &a);
            a.findings = Vec::new();
        }
        a.simulated = true;
        time("what-if", || whatif::simulate(snap, &a, &mut found));
        if let Some(c) = opts.capacity {
            let more = time("fit", || {
                replay::fit_sites::capacity_findings(snap, &a, c, &mut found)
            });
            found.extend(more);
        }
        worth::calibrate(&a, &mut found);
        findings::sort(&mut found);
        a.findings = found;
        a
    })
}

/// The analyses that need only the indices of a trace's peak and first OOM (which
/// `timeline::set_indices` finds without the timeline's address map), made while another thread
/// walks the timeline: first the timeline's own live sets there (which it then takes instead of
/// making them), then the release walks, the window's live blocks at the peak (PT018, PT019),
/// and the compile regions, returned.
fn ahead(
    snap: &Snapshot,
    stacks: &StackIndex,
    releases: &release::Releases,
    peak_live: &attention::PeakLive,
    sets: &timeline::SetsAhead,
) -> compile_regions::CompileRegions {
    let indices = timeline::all_set_indices(snap);
    sets.help(|| timeline::sets_ahead(snap, stacks, &indices));
    release_summary::warm_at(snap, releases, stacks, &indices);
    let peaks: Vec<(i64, u64)> = indices
        .iter()
        .filter_map(|&(d, (peak, _))| Some((d, peak?)))
        .collect();
    let loss = snap.any_stack_has(|f| logits::is_loss(&f.name));
    attention::warm_peak_live(snap, peak_live, &peaks, loss);
    compile_regions::compute_at(snap, |d| peaks.iter().find(|p| p.0 == d).map(|p| p.1))
}

/// `a` here and `b` on a thread of its own (both here if the thread cannot start).
fn beside<A: Send, B: Send>(a: impl FnOnce() -> A, b: impl FnOnce() -> B + Send) -> (A, B) {
    let b = std::sync::Mutex::new(Some(b));
    let run_b = || {
        let f = b.lock().ok().and_then(|mut f| f.take());
        f.map(|f| f())
    };
    std::thread::scope(|s| {
        let h = std::thread::Builder::new()
            .name("memlsp-beside".into())
            .spawn_scoped(s, run_b);
        let a = a();
        let done = h
            .ok()
            .and_then(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        // Not started (or handed nothing): here, after `a`.
        let b = match done {
            Some(v) => v,
            None => run_b().expect("the closure is run once"),
        };
        (a, b)
    })
}

/// More than one core to run on.
pub(crate) fn parallel() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
}

/// Traces with at least this many entries get the allocator replay on a second thread.
pub(crate) const PARALLEL_FROM: usize = 200_000;

/// The engine's output: the typed summary, the first `opts.top` sites, the findings.
pub fn output(snap: &Snapshot, a: &Analysis, opts: &AnalysisOptions) -> Output {
    use crate::timings::time;
    let summarize = || time("summary", || summary::summarize(snap, a, opts.top));
    let walks = || {
        let categories = time("categories", || {
            categories::compute(snap, &a.stacks, &a.timeline, &opts.categories)
        });
        let compile_contexts = match &a.compile_regions {
            Some(c) => c.clone(),
            None => time("compile contexts", || {
                compile_regions::compute(snap, &a.timeline)
            }),
        };
        (categories, compile_contexts)
    };
    // Each walks a long trace on its own: on both cores when there are two.
    let entries: usize = snap.device_traces.iter().flatten().map(Vec::len).sum();
    let (mut summary, (categories, compile_contexts)) = if entries >= PARALLEL_FROM && parallel() {
        beside(summarize, walks)
    } else {
        (summarize(), walks())
    };
    summary.rank_summary = time("rank summary", || ranks::RankSummary::of(snap, a));
    summary.categories = categories;
    summary.compile_contexts = compile_contexts;
    if opts.pictures {
        time("pictures", || pictures(snap, a, &mut summary));
    }
    if opts.fit {
        let fit_opts = replay::fit::FitOptions {
            capacity: opts.capacity,
            ..Default::default()
        };
        summary.fit = Some(time("fit", || {
            replay::fit_sites::capture_fit(snap, &a.replays, &opts.frames, &fit_opts)
                .iter()
                .map(|d| replay::fit_sites::FitEntry::of(d, None))
                .collect()
        }));
    }
    Output {
        summary,
        sites: time("report sites", || report_sites(snap, a, opts)),
        findings: a.findings.clone(),
    }
}

impl Output {
    /// Keep one copy of each distinct stack of this output's sites, findings and pictures
    /// among those `set` already holds (the ranks of a job share most of theirs).
    pub fn share_stacks(&mut self, set: &mut crate::findings::StackSet) {
        let bands = self
            .summary
            .series
            .iter_mut()
            .flat_map(|s| s.bands.iter_mut());
        set.share(
            self.sites
                .iter_mut()
                .map(|s| &mut s.stack)
                .chain(self.findings.iter_mut().map(|f| &mut f.stack))
                .chain(bands.map(|b| &mut b.stack)),
        );
    }
}

/// What the pictures draw: memory over the trace, the snapshot's segments and the replayed
/// allocator states.
fn pictures(snap: &Snapshot, a: &Analysis, summary: &mut summary::Summary) {
    {
        let starts: Vec<(i64, i64)> = a
            .timeline
            .devices
            .iter()
            .map(|t| (t.device, t.live_start))
            .collect();
        summary.series = series::compute(snap, &a.stacks, &starts);
        summary.segment_bars = a
            .totals
            .devices
            .iter()
            .map(|d| (d.device, series::segments(snap, d.device, 400)))
            .collect();
        // The allocator at each device's peak and first OOM: replayed, and only where the
        // replay reproduces every recorded segment event.
        let validated: Vec<i64> = summary
            .replay
            .devices
            .iter()
            .filter(|d| d.validated)
            .map(|d| d.device)
            .collect();
        summary.state_bars =
            series::state_panels(snap, &a.replays, &summary.series, &validated, 400);
        summary.trace_index = trace_index::compute(snap, a);
    }
}

/// Top sites as the shared `Site` type (percent of live memory, measured from allocator state).
pub fn report_sites(snap: &Snapshot, a: &Analysis, opts: &AnalysisOptions) -> Vec<Site> {
    let allocated = a.totals.overall.allocated;
    a.sites
        .sites
        .iter()
        .take(opts.top)
        .map(|s| {
            let stack = stacks::stack_locations(snap, s.stack, None);
            let from = stacks::stack_locations(snap, s.stack, s.key);
            // The callers in the user's own code say which loop or model part owns the memory.
            let callers = from
                .iter()
                .skip(1)
                .filter(|l| opts.frames.is_user(&l.file))
                .take(2)
                .cloned()
                .collect();
            Site {
                location: s.key.and_then(|k| stacks::location(snap, k)),
                bytes: s.bytes,
                requested_bytes: Some(s.requested_bytes),
                blocks: s.blocks,
                percent: s.percent_of(allocated).unwrap_or(0.0),
                percent_of: PercentOf::LiveMemory,
                label: Label::Measured,
                stack: stack.into(),
                callers,
                frame: match (s.key, s.kind) {
                    (None, _) => SiteFrame::None,
                    (Some(_), SiteKind::PythonFallback) => SiteFrame::PythonFallback,
                    _ => SiteFrame::User,
                },
                role: Some(site_role(a, &a.findings, s)),
                scope: None,
                reference_line: None,
                carried_by: None,
            }
        })
        .collect()
}

/// A site's role, with "user container" when a pattern among `found` saw it growing like one.
pub fn site_role(a: &Analysis, found: &[Finding], s: &sites::SiteStat) -> SiteRole {
    let grows = found
        .iter()
        .any(|f| f.code == Code::PT003 && f.location.as_ref().is_some_and(|l| same_site(l, s)));
    if grows {
        return SiteRole::UserContainer;
    }
    let role = s.role();
    if role == stacks::Role::Unknown {
        // A line whose allocations the trace shows freed again almost every time.
        let (allocs, freed) = a
            .timeline
            .devices
            .iter()
            .flat_map(|t| t.sites.iter())
            .filter(|t| t.key == s.key && s.key.is_some())
            .fold((0u64, 0u64), |(x, y), t| {
                (x.saturating_add(t.allocs), y.saturating_add(t.freed))
            });
        if allocs >= 4 && freed.saturating_mul(10) >= allocs.saturating_mul(9) {
            return SiteRole::Temporary;
        }
    }
    role.site_role()
}

fn same_site(l: &crate::findings::Location, s: &sites::SiteStat) -> bool {
    s.site == format!("{}:{}:{}", l.file, l.line, l.function)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::model::{Action, Block, BlockState, Frame, Segment, TraceEntry};

    /// `beside` gives each closure's value in its place, the second made on its own thread.
    #[test]
    fn beside_runs_the_second_closure_on_its_own_thread() {
        let here = std::thread::current().id();
        let (a, b) = beside(
            || (std::thread::current().id(), "a"),
            || (std::thread::current().id(), "b"),
        );
        assert_eq!((a.0 == here, a.1), (true, "a"));
        assert_eq!((b.0 == here, b.1), (false, "b"));
    }

    #[test]
    fn a_large_trace_analysed_on_two_threads_matches_one_thread() {
        let mut trace = Vec::new();
        for i in 0..(PARALLEL_FROM as u64 / 2 + 1) {
            let st = Some((i % 3) as u32);
            trace.push(TraceEntry::new(Action::Alloc, i, 512, 0).with_stack(st));
            if i % 4 != 0 {
                trace.push(TraceEntry::new(Action::FreeCompleted, i, 512, 0).with_stack(st));
            }
        }
        let frame = |n: &str| Frame {
            name: n.into(),
            filename: "/w/train.py".into(),
            line: 3,
        };
        let snap = Snapshot {
            device_traces: Some(vec![trace]),
            frames: vec![frame("a"), frame("b"), frame("c")],
            stacks: vec![vec![0], vec![1], vec![2]],
            ..Snapshot::default()
        };
        let opts = AnalysisOptions::default();
        let a = analyse(&snap, &opts);
        let stacks = StackIndex::new(&snap, &opts.frames);
        assert_eq!(a.timeline, timeline::compute(&snap, &stacks));
        assert_eq!(a.totals, totals::compute(&snap, &stacks));
        assert_eq!(a.timeline.devices[0].allocs, PARALLEL_FROM as u64 / 2 + 1);
    }

    /// Values a corrupt or hostile file can carry: sizes at u64::MAX, stack ids past the table,
    /// negative devices, frees of unknown addresses, an OOM on an empty device.
    #[test]
    fn hostile_values_do_not_panic() {
        let big = Block {
            address: u64::MAX - 1,
            size: u64::MAX,
            requested_size: u64::MAX,
            state: BlockState::ActiveAllocated,
            stack: Some(9999),
            history_len: 0,
        };
        let mut other = big.clone();
        other.state = BlockState::Other("weird".into());
        let mut inactive = big.clone();
        inactive.state = BlockState::Inactive;
        let seg = |device| Segment {
            device,
            address: 0,
            total_size: u64::MAX,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: u64::MAX,
            segment_type: None,
            is_expandable: true,
            pool_id: Some((-1, -1)),
            stack: Some(u32::MAX),
            blocks: vec![big.clone(), other.clone(), inactive.clone()],
        };
        let e = |action: Action, addr: u64, size: u64| {
            TraceEntry::new(action, addr, size, 0)
                .with_time_us(Some(i64::MIN))
                .with_device_free(Some(u64::MAX))
                .with_stack(Some(12345))
        };
        let snap = Snapshot {
            segments: vec![seg(-3), seg(0), seg(0)],
            device_traces: Some(vec![
                vec![
                    e(Action::FreeCompleted, 1, u64::MAX),
                    e(Action::Alloc, 1, u64::MAX),
                    e(Action::Alloc, 1, u64::MAX),
                    e(Action::Oom, 0, u64::MAX),
                    e(Action::FreeRequested, 7, 0),
                    e(Action::Other(0), 0, 1),
                    e(Action::SegmentUnmap, 0, u64::MAX),
                ],
                vec![e(Action::Oom, 0, 1)],
            ]),
            frames: vec![Frame {
                name: String::new(),
                filename: "<frozen x>".into(),
                line: u64::MAX,
            }],
            stacks: vec![vec![0, 77]],
            other_actions: vec!["later".into()],
            ..Snapshot::default()
        };
        let opts = AnalysisOptions::default();
        let a = analyse(&snap, &opts);
        let r = output(&snap, &a, &opts);
        assert!(serde_json::to_string(&r.summary).is_ok());
        assert!(r.findings.iter().any(|f| f.code == Code::PT009));
        let d = diff::diff(&snap, &a, &snap, &a);
        assert!(d.grown.is_empty(), "a snapshot never grows against itself");
    }
}
