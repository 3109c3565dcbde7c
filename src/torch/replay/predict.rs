//! A larger run predicted from two or more captures of the same program at other sizes.
//!
//! The captures' requests are matched one to one: the blocks live at the first trace entry
//! (ordered by the trace entry that frees them, then by address), then every `alloc`,
//! `free_requested`, `free_completed` and `oom` in trace order, with the same action and the same
//! stack. Each request's size is modelled as a function of the parameter (constant, linear,
//! quadratic, a power), the predicted trace is built on the largest capture's (its addresses tie
//! each free to its allocation) and replayed through the allocator model from an empty device:
//! the blocks live at the start are allocated first, so the segments the predicted run reserves
//! are the ones the allocator would make for it. See docs/FITS.md.
//!
//! Plain data in, plain data out: no IO, no rendering.

use serde::Serialize;

use super::fit::{self, AtCapacity, FitOptions, Needs, Requests};
use super::initial::InitialState;
use super::run;
use super::settings::Settings;
use crate::torch::model::{Action, Snapshot, StackId, TraceEntry};

/// One capture of the series: the parameter's value and the snapshot.
pub struct Point<'a> {
    pub value: f64,
    pub snap: &'a Snapshot,
}

/// How one request's size follows the parameter.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    Constant,
    /// `a + b·p` (or `b·p`).
    Linear,
    /// `c·p²`, or `a + b·p + c·p²` with four or more captures.
    Quadratic,
    /// `c·p^k`, another exponent.
    Power,
}

/// A size model of one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SizeModel {
    pub shape: Shape,
    /// `Power`: (c, k, 0) for `c·p^k`; otherwise the polynomial's (a, b, c).
    coef: [f64; 3],
    power: bool,
    /// Largest relative error over the captures.
    pub residual: f64,
}

impl SizeModel {
    pub fn eval(&self, p: f64) -> f64 {
        let [a, b, c] = self.coef;
        if self.power {
            a * p.powf(b)
        } else {
            a + b * p + c * p * p
        }
    }
}

fn residual(m: &SizeModel, ps: &[f64], ss: &[f64]) -> f64 {
    ps.iter()
        .zip(ss)
        .map(|(&p, &s)| {
            let e = (m.eval(p) - s).abs();
            if s > 0.0 { e / s } else { e }
        })
        .fold(0.0, f64::max)
}

/// Least squares of `ss` on the columns `cols(p)`.
fn least_squares(ps: &[f64], ss: &[f64], n: usize) -> Option<[f64; 3]> {
    // Normal equations, n ≤ 3, solved by Gaussian elimination (values are scaled by the
    // largest p so the powers stay near 1).
    let scale = ps.iter().copied().fold(0.0, f64::max).max(1.0);
    let mut m = [[0.0f64; 4]; 3];
    for (&p, &s) in ps.iter().zip(ss) {
        let x = p / scale;
        let cols = [1.0, x, x * x];
        for i in 0..n {
            for j in 0..n {
                m[i][j] += cols[i] * cols[j];
            }
            m[i][3] += cols[i] * s;
        }
    }
    for i in 0..n {
        let piv = (i..n).max_by(|&a, &b| m[a][i].abs().total_cmp(&m[b][i].abs()))?;
        m.swap(i, piv);
        if m[i][i].abs() < 1e-12 {
            return None;
        }
        for r in 0..n {
            if r != i {
                let f = m[r][i] / m[i][i];
                let row = m[i];
                for (v, p) in m[r].iter_mut().zip(row).skip(i) {
                    *v -= f * p;
                }
            }
        }
    }
    let mut out = [0.0; 3];
    for i in 0..n {
        out[i] = m[i][3] / m[i][i] / scale.powi(i as i32);
    }
    Some(out)
}

/// The model of one request's sizes `ss` at the parameter values `ps` (at least two distinct).
pub fn model_sizes(ps: &[f64], ss: &[f64]) -> SizeModel {
    let mk = |shape, coef, power| SizeModel {
        shape,
        coef,
        power,
        residual: 0.0,
    };
    let scored = |mut m: SizeModel| {
        m.residual = residual(&m, ps, ss);
        m
    };
    if ss.iter().all(|&s| s == ss[0]) {
        return scored(mk(Shape::Constant, [ss[0], 0.0, 0.0], false));
    }
    let mut candidates: Vec<SizeModel> = Vec::new();
    // A power law through the points (log-log least squares); an integer exponent is the
    // shape of a tensor dimension that is the parameter (p·d, p²·h).
    if ps.iter().all(|&p| p > 0.0) && ss.iter().all(|&s| s > 0.0) {
        let lp: Vec<f64> = ps.iter().map(|p| p.ln()).collect();
        let ls: Vec<f64> = ss.iter().map(|s| s.ln()).collect();
        if let Some([lc, k, _]) = least_squares_raw(&lp, &ls) {
            let kr = k.round();
            if (k - kr).abs() < 0.02 && (1.0..=3.0).contains(&kr) {
                // c by least squares on p^K.
                let num: f64 = ps.iter().zip(ss).map(|(p, s)| s * p.powf(kr)).sum();
                let den: f64 = ps.iter().map(|p| p.powf(2.0 * kr)).sum();
                let shape = match kr as i64 {
                    1 => Shape::Linear,
                    2 => Shape::Quadratic,
                    _ => Shape::Power,
                };
                candidates.push(scored(mk(shape, [num / den, kr, 0.0], true)));
            }
            let general = scored(mk(Shape::Power, [lc.exp(), k, 0.0], true));
            if ps.len() >= 3 {
                candidates.push(general);
            }
        }
    }
    if let Some(c) = least_squares(ps, ss, 2) {
        candidates.push(scored(mk(Shape::Linear, c, false)));
    }
    // Three parameters go through any three points: only with four captures or more does the
    // residual say something about this model.
    if ps.len() >= 4
        && let Some(c) = least_squares(ps, ss, 3)
    {
        candidates.push(scored(mk(Shape::Quadratic, c, false)));
    }
    // The first (most parsimonious) model that reproduces the captures, else the closest.
    candidates
        .iter()
        .find(|m| m.residual <= 1e-3)
        .or_else(|| {
            candidates
                .iter()
                .min_by(|a, b| a.residual.total_cmp(&b.residual))
        })
        .copied()
        .unwrap_or_else(|| scored(mk(Shape::Constant, [ss[ss.len() - 1], 0.0, 0.0], false)))
}

/// Least squares of y on (1, x) without scaling: (intercept, slope).
fn least_squares_raw(xs: &[f64], ys: &[f64]) -> Option<[f64; 3]> {
    let n = xs.len() as f64;
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let k = sxy / sxx;
    Some([my - k * mx, k, 0.0])
}

/// How many requests follow each shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Basis {
    pub parameter: String,
    pub values: Vec<f64>,
    pub constant: u64,
    pub linear: u64,
    pub quadratic: u64,
    pub power: u64,
    /// Of them, blocks live at the first trace entry.
    pub live_at_start: u64,
    /// Largest relative error of a request's model over the captures (0 with two captures:
    /// two points determine every model).
    pub max_residual: f64,
}

impl Basis {
    /// "412 requests constant, 5,600 linear, 788 quadratic in ctx".
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("{} requests constant", group(self.constant))];
        if self.linear > 0 {
            parts.push(format!("{} linear", group(self.linear)));
        }
        if self.quadratic > 0 {
            parts.push(format!("{} quadratic", group(self.quadratic)));
        }
        if self.power > 0 {
            parts.push(format!("{} another power", group(self.power)));
        }
        format!("{} in {}", parts.join(", "), self.parameter)
    }
}

fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The predicted run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub parameter: String,
    pub at: f64,
    pub device: i64,
    /// Highest live total of the predicted run (absolute: the blocks live at the start
    /// included).
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Reserved at the end of the predicted run.
    pub reserved_bytes: u64,
    pub needs_bytes: u64,
    pub needs: Needs,
    pub on: Option<AtCapacity>,
    /// The largest parameter value whose predicted run fits on the capacity (`None` without a
    /// capacity, or when even the smallest value tried fails).
    pub largest_fitting: Option<f64>,
    pub basis: Basis,
    /// The stacks of the predicted trace are the largest capture's (its index among the
    /// points), for locating a failure.
    #[serde(skip)]
    pub reference: usize,
    /// Allocated bytes over the requests: each capture, then the prediction (for the page).
    #[serde(skip)]
    pub curves: Vec<Curve>,
    pub note: Option<String>,
}

/// Why captures cannot be matched (or predicted from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch(pub String);

/// Requests of one capture, in the matched order.
struct Side {
    settings: Settings,
    /// Blocks live at the start: (requested size, address, pending, stream).
    init: Vec<(u64, u64, bool, u64)>,
    /// Request entries of the trace (indices into the trace).
    requests: Vec<usize>,
}

fn side(snap: &Snapshot, device: i64) -> Side {
    let p = super::prepare(snap, device);
    let trace = snap.trace(device);
    let mut first_free: rustc_hash::FxHashMap<u64, usize> = rustc_hash::FxHashMap::default();
    for (i, e) in trace.iter().enumerate().rev() {
        if matches!(e.action, Action::FreeRequested | Action::FreeCompleted) {
            first_free.insert(e.addr, i);
        }
    }
    let stream_of = |addr: u64| {
        p.init
            .segs
            .iter()
            .find(|s| s.addr <= addr && addr < s.addr.saturating_add(s.size))
            .map(|s| s.stream)
            .or_else(|| {
                p.init
                    .es
                    .iter()
                    .find(|s| s.base <= addr && addr < s.base.saturating_add(s.span))
                    .map(|s| s.stream)
            })
            .unwrap_or(0)
    };
    // The stack each block was allocated from (the snapshot's, for a block still live at the
    // end; that of the entry freeing it otherwise).
    let info = super::state::alloc_info(snap, &p);
    type Key = (usize, Vec<(String, u64, String)>, u64, u64, u64, bool, u64);
    let mut init: Vec<Key> = p
        .init
        .allocs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let freed = first_free.get(&a.addr).copied();
            // Blocks the trace never frees (weights, buffers) have nothing to tie them across
            // captures but their stack: the allocator placed them at different addresses in
            // each run. They are matched by stack, then by size (the k-th smallest of a stack
            // with the k-th smallest).
            let (stack, size) = match freed {
                Some(_) => (Vec::new(), 0),
                None => (stack_text(snap, info.get(i).and_then(|x| x.1)), a.requested),
            };
            (
                freed.unwrap_or(usize::MAX),
                stack,
                size,
                a.addr,
                a.requested,
                a.pending,
                stream_of(a.addr),
            )
        })
        .collect();
    init.sort_unstable();
    Side {
        settings: p.settings.clone(),
        init: init
            .into_iter()
            .map(|(_, _, _, addr, req, pending, stream)| (req, addr, pending, stream))
            .collect(),
        requests: trace
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                matches!(
                    e.action,
                    Action::Alloc | Action::FreeRequested | Action::FreeCompleted | Action::Oom
                )
            })
            .map(|(i, _)| i)
            .collect(),
    }
}

/// A stack's frames as text, to compare stacks across captures.
fn stack_text(snap: &Snapshot, stack: Option<StackId>) -> Vec<(String, u64, String)> {
    snap.stack_frames(stack)
        .map(|f| (f.filename.clone(), f.line, f.name.clone()))
        .collect()
}

/// The device predicted: the traced device with most entries in the first capture.
fn device_of(snap: &Snapshot) -> Option<i64> {
    snap.devices()
        .into_iter()
        .filter(|&d| !snap.trace(d).is_empty())
        .max_by_key(|&d| (snap.trace(d).len(), -d))
}

/// Matched requests of the captures and the model of each size.
struct Matched {
    device: i64,
    settings: Settings,
    reference: usize,
    /// The reference capture's requests, with the size model of the sized ones.
    init: Vec<(SizeModel, u64, bool, u64)>,
    requests: Vec<(usize, Option<SizeModel>)>,
    /// Each capture's own sizes: (blocks live at the start, requests; 0 for a free).
    sizes: Vec<(Vec<u64>, Vec<u64>)>,
    basis: Basis,
}

fn match_points(points: &[Point], parameter: &str) -> Result<Matched, Mismatch> {
    if points.len() < 2 {
        return Err(Mismatch(
            "give at least two captures (NAME=VALUE:FILE)".into(),
        ));
    }
    let mut values: Vec<f64> = points.iter().map(|p| p.value).collect();
    values.sort_by(f64::total_cmp);
    if values.windows(2).any(|w| w[0] == w[1]) {
        return Err(Mismatch(format!(
            "two captures have the same {parameter}: give captures at different values"
        )));
    }
    let name = |i: usize| format!("{parameter}={}", show_value(points[i].value));
    let device = device_of(points[0].snap).ok_or_else(|| {
        Mismatch(format!(
            "{}: no trace: memory history was not recorded",
            name(0)
        ))
    })?;
    let mut sides = Vec::new();
    for (i, p) in points.iter().enumerate() {
        if p.snap.trace(device).is_empty() {
            return Err(Mismatch(format!(
                "{}: no trace on device {device}, which {} has",
                name(i),
                name(0)
            )));
        }
        let r = super::Replays::new().device(p.snap, device);
        if !r.validated {
            return Err(Mismatch(format!(
                "{}: the allocator replay does not validate on device {device} ({}), so nothing \
                 can be simulated from it",
                name(i),
                r.note.unwrap_or_default()
            )));
        }
        sides.push(side(p.snap, device));
    }
    let reference = (0..points.len())
        .max_by(|&a, &b| points[a].value.total_cmp(&points[b].value))
        .unwrap_or(0);
    let base = &sides[0];
    for (i, s) in sides.iter().enumerate().skip(1) {
        if s.init.len() != base.init.len() {
            return Err(Mismatch(format!(
                "blocks live at the first trace entry: {} in {}, {} in {}: not the same program \
                 state",
                base.init.len(),
                name(0),
                s.init.len(),
                name(i)
            )));
        }
        if s.requests.len() != base.requests.len() {
            return Err(Mismatch(format!(
                "requests (alloc, free, oom) in the trace: {} in {}, {} in {}: not the same \
                 program (record the same steps at each size)",
                group(base.requests.len() as u64),
                name(0),
                group(s.requests.len() as u64),
                name(i)
            )));
        }
    }
    let ps: Vec<f64> = points.iter().map(|p| p.value).collect();
    let mut basis = Basis {
        parameter: parameter.to_string(),
        values,
        ..Basis::default()
    };
    let count = |m: &SizeModel, basis: &mut Basis| {
        match m.shape {
            Shape::Constant => basis.constant += 1,
            Shape::Linear => basis.linear += 1,
            Shape::Quadratic => basis.quadratic += 1,
            Shape::Power => basis.power += 1,
        }
        basis.max_residual = basis.max_residual.max(m.residual);
    };
    let mut init = Vec::new();
    for k in 0..base.init.len() {
        let ss: Vec<f64> = sides.iter().map(|s| s.init[k].0 as f64).collect();
        let m = model_sizes(&ps, &ss);
        count(&m, &mut basis);
        basis.live_at_start += 1;
        let (_, addr, pending, stream) = sides[reference].init[k];
        init.push((m, addr, pending, stream));
    }
    let traces: Vec<&[TraceEntry]> = points.iter().map(|p| p.snap.trace(device)).collect();
    let mut stack_cache: Vec<rustc_hash::FxHashMap<Option<StackId>, usize>> =
        vec![rustc_hash::FxHashMap::default(); points.len()];
    let mut texts: Vec<Vec<(String, u64, String)>> = Vec::new();
    let mut text_id = |i: usize, s: Option<StackId>| -> usize {
        *stack_cache[i].entry(s).or_insert_with(|| {
            let t = stack_text(points[i].snap, s);
            match texts.iter().position(|x| *x == t) {
                Some(k) => k,
                None => {
                    texts.push(t);
                    texts.len() - 1
                }
            }
        })
    };
    let mut requests = Vec::with_capacity(base.requests.len());
    for k in 0..base.requests.len() {
        let e0 = &traces[0][base.requests[k]];
        let t0 = text_id(0, e0.stack());
        for (i, s) in sides.iter().enumerate().skip(1) {
            let e = &traces[i][s.requests[k]];
            if e.action != e0.action {
                return Err(Mismatch(format!(
                    "request {} (trace entry {} in {}, {} in {}): {} in {}, {} in {}: not the \
                     same program",
                    group(k as u64),
                    group(base.requests[k] as u64),
                    name(0),
                    group(s.requests[k] as u64),
                    name(i),
                    e0.action.as_str(),
                    name(0),
                    e.action.as_str(),
                    name(i)
                )));
            }
            if text_id(i, e.stack()) != t0 {
                return Err(Mismatch(format!(
                    "request {} (trace entry {} in {}, {} in {}): {} from different stacks: \
                     not the same code path",
                    group(k as u64),
                    group(base.requests[k] as u64),
                    name(0),
                    group(s.requests[k] as u64),
                    name(i),
                    e0.action.as_str()
                )));
            }
        }
        let sized = matches!(e0.action, Action::Alloc | Action::Oom);
        let model = sized.then(|| {
            let ss: Vec<f64> = (0..points.len())
                .map(|i| traces[i][sides[i].requests[k]].size as f64)
                .collect();
            let m = model_sizes(&ps, &ss);
            count(&m, &mut basis);
            m
        });
        requests.push((sides[reference].requests[k], model));
    }
    let sizes = (0..points.len())
        .map(|i| {
            let init = sides[i].init.iter().map(|x| x.0).collect();
            let req = sides[i]
                .requests
                .iter()
                .map(|&j| match traces[i][j].action {
                    Action::Alloc | Action::Oom => traces[i][j].size,
                    _ => 0,
                })
                .collect();
            (init, req)
        })
        .collect();
    Ok(Matched {
        sizes,
        device,
        settings: sides[reference].settings.clone(),
        reference,
        init,
        requests,
        basis,
    })
}

/// A parameter value as the user wrote it (an integer without `.0`).
pub fn show_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn size_at(m: &SizeModel, at: f64) -> u64 {
    let v = m.eval(at).round();
    if v.is_finite() && v > 0.0 {
        v.min(u64::MAX as f64 / 2.0) as u64
    } else {
        0
    }
}

/// The predicted trace at `at`: the blocks live at the start allocated first, then the
/// reference capture's requests with predicted sizes.
fn predicted_trace(m: &Matched, reference: &[TraceEntry], at: f64) -> Vec<TraceEntry> {
    trace_with(
        m,
        reference,
        |k| size_at(&m.init[k].0, at),
        |k| m.requests[k].1.as_ref().map(|model| size_at(model, at)),
    )
}

/// The reference capture's requests with the sizes given: the blocks live at the start first
/// (`init_size(k)`), then each request (`req_size(k)`, `None`: as recorded).
fn trace_with(
    m: &Matched,
    reference: &[TraceEntry],
    init_size: impl Fn(usize) -> u64,
    req_size: impl Fn(usize) -> Option<u64>,
) -> Vec<TraceEntry> {
    let mut t = Vec::with_capacity(m.init.len() * 2 + m.requests.len());
    for (k, (_, addr, pending, stream)) in m.init.iter().enumerate() {
        t.push(TraceEntry::new(Action::Alloc, *addr, init_size(k), *stream));
        if *pending {
            t.push(TraceEntry::new(Action::FreeRequested, *addr, 0, *stream));
        }
    }
    for (k, (i, _)) in m.requests.iter().enumerate() {
        let mut e = reference[*i].clone();
        if let Some(size) = req_size(k) {
            e.size = size;
        }
        t.push(e);
    }
    t
}

/// Allocated bytes over the matched requests, for the page: one run (a capture's own sizes, or
/// the predicted ones) as the highest allocated total in each of [`CURVE_COLUMNS`] runs of
/// requests.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Curve {
    pub value: f64,
    /// The predicted run; otherwise a capture's own recorded sizes, replayed the same way from
    /// an empty device (both `simulated`: a block's size is the allocator's decision).
    pub predicted: bool,
    /// (first request of the column, highest allocated bytes in it).
    pub points: Vec<[u64; 2]>,
}

/// Columns of a [`Curve`].
pub const CURVE_COLUMNS: usize = 300;

struct CurveObs {
    offset: usize,
    n: usize,
    top: Vec<u64>,
}

impl run::Observer for CurveObs {
    fn after(
        &mut self,
        op: &run::Op,
        _done: run::Done,
        m: &super::model::Model,
        _addr_of: &super::addr_of::AddrOf,
    ) -> bool {
        if op.pos >= self.offset && self.n > 0 {
            let k = (op.pos - self.offset) * self.top.len() / self.n;
            if let Some(t) = self.top.get_mut(k) {
                *t = (*t).max(m.allocated);
            }
        }
        true
    }
}

fn curve(m: &Matched, trace: &[TraceEntry], value: f64, predicted: bool) -> Curve {
    let init = InitialState::default();
    let plan = run::plan(trace, &init);
    let n = m.requests.len();
    let cols = CURVE_COLUMNS.min(n.max(1));
    let mut obs = CurveObs {
        offset: trace.len() - n,
        n,
        top: vec![0; cols],
    };
    let edits = run::Edits::default();
    run::replay(
        trace,
        &plan,
        &init,
        m.settings.clone(),
        false,
        None,
        &edits,
        &mut obs,
    );
    Curve {
        value,
        predicted,
        points: obs
            .top
            .iter()
            .enumerate()
            .map(|(c, &v)| [(c * n / cols) as u64, v])
            .collect(),
    }
}

/// Predict the run at `at` from `points` (see the module doc). `capacity`: also replay on a
/// device of that many bytes and find the largest parameter value that fits there.
pub fn predict(
    points: &[Point],
    parameter: &str,
    at: f64,
    opts: &FitOptions,
) -> Result<Prediction, Mismatch> {
    let m = match_points(points, parameter)?;
    let reference = points[m.reference].snap.trace(m.device);
    let init = InitialState::default();
    let run_at = |v: f64, capacity: Option<u64>, stacks: bool| {
        let trace = predicted_trace(&m, reference, v);
        let plan = run::plan(&trace, &init);
        let req = Requests {
            trace: &trace,
            plan: &plan,
            init: &init,
            settings: m.settings.clone(),
            empty_cache_probes: &[],
            recorded_addresses: false,
        };
        let st: Vec<Option<StackId>> = if stacks {
            let mut st = vec![None; plan.arefs];
            for (entry, aref) in plan.alloc_arefs(&trace) {
                if let Some(s) = st.get_mut(aref as usize) {
                    *s = trace[entry].stack();
                }
            }
            st
        } else {
            Vec::new()
        };
        (fit::attempt(&req, capacity, &st), trace, plan)
    };
    let (free, trace, plan) = run_at(at, None, false);
    let req = Requests {
        trace: &trace,
        plan: &plan,
        init: &init,
        settings: m.settings.clone(),
        empty_cache_probes: &[],
        recorded_addresses: false,
    };
    let stacks: Vec<Option<StackId>> = {
        let mut st = vec![None; plan.arefs];
        for (entry, aref) in plan.alloc_arefs(&trace) {
            if let Some(s) = st.get_mut(aref as usize) {
                *s = trace[entry].stack();
            }
        }
        st
    };
    let (needs, _, _, on) = fit::fit_requests(
        &req,
        &stacks,
        &FitOptions {
            settings_trials: false,
            ..opts.clone()
        },
    );
    let integer = points.iter().all(|p| p.value.fract() == 0.0) && at.fract() == 0.0;
    let largest_fitting = opts
        .capacity
        .and_then(|c| largest_fitting(|v| run_at(v, Some(c), false).0.fits, at, integer));
    let mut notes = vec![
        "the predicted run starts on an empty device with the blocks live at the first entry \
         allocated first (no cached segments from before the trace)"
            .to_string(),
    ];
    if m.basis.max_residual > 1e-3 {
        notes.push(format!(
            "some request sizes do not follow one model exactly (largest relative error {:.1} %)",
            m.basis.max_residual * 100.0
        ));
    }
    let reference_trace = reference;
    let mut curves: Vec<Curve> = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (init_sizes, req_sizes) = &m.sizes[i];
            let t = trace_with(
                &m,
                reference_trace,
                |k| init_sizes[k],
                |k| m.requests[k].1.map(|_| req_sizes[k]),
            );
            curve(&m, &t, p.value, false)
        })
        .collect();
    curves.push(curve(&m, &trace, at, true));
    Ok(Prediction {
        curves,
        parameter: parameter.to_string(),
        at,
        device: m.device,
        peak_allocated_bytes: free.peak_allocated,
        peak_reserved_bytes: free.peak_reserved,
        reserved_bytes: free.reserved_end,
        needs_bytes: needs.needs_bytes,
        needs,
        on,
        largest_fitting,
        basis: m.basis,
        reference: m.reference,
        note: Some(notes.join("; ")),
    })
}

/// The largest value whose run fits, searching up from `at` (when it fits) or down from it.
fn largest_fitting(mut fits: impl FnMut(f64) -> bool, at: f64, integer: bool) -> Option<f64> {
    let done = |lo: f64, hi: f64| {
        if integer {
            hi - lo <= 1.0
        } else {
            hi - lo <= lo.abs() * 1e-4
        }
    };
    let mid = |lo: f64, hi: f64| {
        let m = (lo + hi) / 2.0;
        if integer { m.floor() } else { m }
    };
    let (mut lo, mut hi);
    if fits(at) {
        lo = at;
        hi = at.max(1.0) * 2.0;
        let mut n = 0;
        while fits(hi) {
            lo = hi;
            hi *= 2.0;
            n += 1;
            if n > 40 {
                return Some(lo);
            }
        }
    } else {
        hi = at;
        lo = if integer { 1.0 } else { at / 1024.0 };
        if !fits(lo) {
            return None;
        }
    }
    while !done(lo, hi) {
        let m = mid(lo, hi);
        if m <= lo || m >= hi {
            break;
        }
        if fits(m) {
            lo = m;
        } else {
            hi = m;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_from_two_and_three_points() {
        let m = model_sizes(&[128.0, 256.0], &[100.0, 100.0]);
        assert_eq!(m.shape, Shape::Constant);
        let m = model_sizes(&[128.0, 256.0], &[1024.0, 2048.0]);
        assert_eq!(m.shape, Shape::Linear);
        assert_eq!(size_at(&m, 512.0), 4096);
        let m = model_sizes(&[128.0, 256.0], &[1024.0, 4096.0]);
        assert_eq!(m.shape, Shape::Quadratic);
        assert_eq!(size_at(&m, 512.0), 16384);
        // An offset: linear through the two points, not a power of 1.58.
        let m = model_sizes(&[128.0, 256.0], &[1000.0 + 128.0, 1000.0 + 256.0]);
        assert_eq!(m.shape, Shape::Linear);
        assert_eq!(size_at(&m, 512.0), 1512);
        // Four points: a + b·p + c·p².
        let f = |p: f64| 64.0 + 3.0 * p + 0.5 * p * p;
        let ps = [128.0, 256.0, 384.0, 640.0];
        let m = model_sizes(&ps, &ps.map(f));
        assert_eq!(m.shape, Shape::Quadratic);
        assert!(m.residual < 1e-9);
        assert_eq!(size_at(&m, 512.0), f(512.0) as u64);
    }

    #[test]
    fn largest_fitting_bisects_integers() {
        assert_eq!(largest_fitting(|v| v <= 700.0, 512.0, true), Some(700.0));
        assert_eq!(largest_fitting(|v| v <= 300.0, 512.0, true), Some(300.0));
        assert_eq!(largest_fitting(|_| false, 512.0, true), None);
    }
}

#[cfg(test)]
mod residual_tests {
    use super::*;

    /// A size that depends on data (here: no shape of the parameter) is fitted as well as it
    /// can be, and its residual says so.
    #[test]
    fn a_size_no_model_follows_reports_its_residual() {
        let m = model_sizes(&[128.0, 256.0, 512.0], &[1000.0, 2600.0, 2700.0]);
        assert!(m.residual > 0.05, "{m:?}");
        // Two captures cannot show it: every model goes through two points.
        let m = model_sizes(&[128.0, 256.0], &[1000.0, 2600.0]);
        assert!(m.residual < 1e-9, "{m:?}");
    }
}
