//! One capture → `CaptureReport`: module choice, diagnosis context, sites, JSON and report text.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::capture::Capture;
use super::diagnose::{self, Context, Growth, pct};
use super::hlo::split_program_id;
use super::plan::{Plan, Role, SMALL_BUFFER_BYTES};
use super::runtime::{Execution, Runtime};
use crate::analyze::Options;
use crate::error::{CaptureError, ErrorKind};
use crate::findings::{Code, Finding, Label, Location, fmt_bytes};
use crate::report::{CaptureKind, CaptureReport, EngineData, Site};

/// Program text for a recorded path: the workspace file it resolves to (`opts.workspace` and
/// `opts.path_mappings`, through `crate::source::paths::Resolver`, built only when needed), else
/// the path itself when it exists, else a file of the same name beside the capture or in one of
/// its parent folders (captures recorded on another machine, e.g. `/srv/jaxdemo/x.py` with the
/// capture in the project). Only `.py` files are read.
pub fn default_source_lookup(
    capture: &Path,
    opts: &Options,
) -> impl Fn(&str) -> Option<String> + use<> {
    let dir = capture.parent().map(Path::to_path_buf);
    let roots = opts.workspace.clone();
    let mappings = opts.path_mappings.clone();
    let resolver: std::sync::OnceLock<Option<crate::source::paths::Resolver>> =
        std::sync::OnceLock::new();
    move |recorded: &str| {
        if !recorded.ends_with(".py") {
            return None;
        }
        let in_workspace = resolver
            .get_or_init(|| {
                (!roots.is_empty())
                    .then(|| crate::source::paths::Resolver::new(roots.clone(), mappings.clone()))
            })
            .as_ref()
            .and_then(|r| r.resolve(recorded));
        let mut candidates: Vec<PathBuf> = in_workspace.into_iter().collect();
        candidates.push(PathBuf::from(recorded));
        if let (Some(dir), Some(name)) = (&dir, Path::new(recorded).file_name()) {
            let mut d = Some(dir.as_path());
            for _ in 0..5 {
                let Some(here) = d else { break };
                candidates.push(here.join(name));
                d = here.parent();
            }
        }
        candidates
            .into_iter()
            .find(|p| p.is_file())
            .and_then(|p| std::fs::read_to_string(p).ok())
    }
}

/// Which module to analyse, and why.
pub fn select_module<'p>(
    path: &Path,
    plans: &'p [Plan],
    rt: &Runtime,
    wanted: Option<&str>,
) -> Result<Option<(&'p Plan, String)>, CaptureError> {
    let executed = |p: &Plan| rt.executions_of(&p.module).count();
    let last_exec = |p: &Plan| rt.executions_of(&p.module).last().map(|e| e.start_ps);
    if let Some(w) = wanted {
        let exact = plans.iter().find(|p| p.module == w);
        let (bare, _) = split_program_id(w);
        let found = exact.or_else(|| {
            plans
                .iter()
                .filter(|p| p.hlo_name == bare)
                .max_by_key(|p| (last_exec(p), p.total_peak_bytes))
        });
        return match found {
            Some(p) => Ok(Some((p, "chosen with --module".to_string()))),
            None => {
                let mut names: Vec<&str> = plans.iter().map(|p| p.module.as_str()).collect();
                names.truncate(20);
                Err(CaptureError::new(
                    path,
                    ErrorKind::Unsupported,
                    None,
                    format!(
                        "no module named {w} in this capture; it has: {}",
                        names.join(", ")
                    ),
                    "pass one of these names to --module (`jit_train_step(36)` or `jit_train_step`)",
                ))
            }
        };
    }
    // The module whose last execution launched nothing (an OOM inside the step), latest first.
    let stalled = plans
        .iter()
        .filter(|p| {
            rt.executions_of(&p.module)
                .last()
                .is_some_and(|e| e.kernels == Some(0))
        })
        .max_by_key(|p| last_exec(p));
    if let Some(p) = stalled {
        let why = if rt.retries.is_empty() {
            "its last execution launched no kernel"
        } else {
            "its last execution launched no kernel (allocator retries in the capture)"
        };
        return Ok(Some((p, why.into())));
    }
    if let Some(p) = plans
        .iter()
        .filter(|p| executed(p) > 0)
        .max_by_key(|p| (p.total_peak_bytes, executed(p)))
    {
        return Ok(Some((
            p,
            format!(
                "the largest plan among the modules executed in the capture ({} execution(s))",
                executed(p)
            ),
        )));
    }
    Ok(plans.iter().max_by_key(|p| p.total_peak_bytes).map(|p| {
        (
            p,
            "the largest plan (no execution of any module was recorded)".to_string(),
        )
    }))
}

/// Build the report for one capture.
pub fn report(
    cap: &Capture,
    plans: Vec<Plan>,
    rt: Runtime,
    opts: &Options,
    source: &dyn Fn(&str) -> Option<String>,
) -> Result<CaptureReport, CaptureError> {
    let path = cap.file.path.clone();
    let chosen = select_module(&path, &plans, &rt, opts.module.as_deref())?;
    let Some((plan, why)) = chosen else {
        return Ok(runtime_only(cap, &plans, &rt));
    };
    let execs: Vec<&Execution> = rt.executions_of(&plan.module).collect();
    let pick = |stack: &[Location]| {
        opts.frames
            .pick(stack.iter().map(|l| l.file.as_str()))
            .map(|(i, _)| i)
    };

    // Where the module was compiled: the jax.jit line found from the call site in program text.
    let call = plan.call_site.first().map(|f| f.location());
    let fn_name = plan.hlo_name.strip_prefix("jit_").unwrap_or(&plan.hlo_name);
    let text = call.as_ref().and_then(|c| source(&c.file));
    let (jit_site, jit_line_found) = match (&call, &text) {
        (Some(c), Some(t)) => match find_jit_line(t, c.line, fn_name) {
            Some(line) => (
                Some(Location {
                    file: c.file.clone(),
                    line,
                    function: fn_name.to_string(),
                }),
                true,
            ),
            None => (Some(c.clone()), false),
        },
        (c, _) => (c.clone(), false),
    };
    let signature = text.as_deref().and_then(|t| signature(t, fn_name));

    // Growth and host events between executions.
    let mut growth = Growth {
        starts: execs
            .iter()
            .filter_map(|e| e.bytes_in_use_at_start)
            .collect(),
        ..Growth::default()
    };
    let mut between_last_two: Vec<(String, u64)> = Vec::new();
    if let Some(first) = execs.first() {
        let line = rt.line_name(first).to_string();
        if !line.is_empty() {
            let events = rt.host_events(cap, &line, first.start_ps, i64::MAX)?;
            // Only appends made by the user's code count: the Python tracer names the function
            // around each event by base name; JAX itself appends to lists between calls too.
            let user_files = user_files(plan, &opts.frames);
            // One sweep (events on a line nest): the innermost open `$file.py:N f` event
            // around each append.
            let mut open: Vec<usize> = Vec::new();
            let mut appends: Vec<(i64, usize)> = Vec::new();
            for (i, e) in events.iter().enumerate() {
                while open.last().is_some_and(|&o| events[o].2 < e.2) {
                    open.pop();
                }
                if e.0 == "$<unknown> append" {
                    let user = open.last().is_some_and(|&o| {
                        py_function(&events[o].0)
                            .is_some_and(|(b, _, _)| user_files.iter().any(|f| f.0 == b))
                    });
                    if user {
                        appends.push((e.1, *open.last().unwrap_or(&0)));
                    }
                } else if py_function(&e.0).is_some() {
                    open.push(i);
                }
            }
            let mut first_append: Option<usize> = None;
            for (k, e) in execs.iter().enumerate() {
                let to = execs.get(k + 1).map(|n| n.start_ps).unwrap_or(i64::MAX);
                let a = appends.partition_point(|x| x.0 < e.end_ps);
                let b = appends.partition_point(|x| x.0 < to).max(a);
                if first_append.is_none() && b > a {
                    first_append = Some(appends[a].1);
                }
                if k + 1 < execs.len() || b > a {
                    growth.appends_per_gap.push((b - a) as u64);
                }
                if k + 2 == execs.len() {
                    let a = events.partition_point(|x| x.1 < e.end_ps);
                    let b = events.partition_point(|x| x.1 < to).max(a);
                    for x in &events[a..b] {
                        if is_noise(&x.0) {
                            continue;
                        }
                        match between_last_two.iter_mut().find(|(n, _)| *n == x.0) {
                            Some(c) => c.1 += 1,
                            None => between_last_two.push((x.0.clone(), 1)),
                        }
                    }
                }
            }
            if let Some(o) = first_append {
                growth.append_site = append_site(&events[o].0, &user_files, source);
            }
        }
    }
    let live_at_last = execs
        .last()
        .map(|e| rt.live_at(e.start_ps))
        .unwrap_or_default();
    let ctx = Context {
        plan,
        rt: &rt,
        execs: execs.clone(),
        capacity: rt.main().map(|a| a.capacity_bytes),
        device_memory: rt.device_memory,
        jit_site,
        jit_line_found,
        signature,
        growth,
        live_at_last: live_at_last.clone(),
        pick: &pick,
    };
    let findings = diagnose::diagnose(&ctx);
    let sites = sites(plan, &pick, opts.top);
    let headline = headline(plan, &findings);
    let engine = engine_json(plan, &plans, &rt);
    let text = render(&RenderInput {
        cap,
        plan,
        plans: &plans,
        rt: &rt,
        why: &why,
        execs: &execs,
        findings: &findings,
        sites: &sites,
        between_last_two: &between_last_two,
        live_at_last: &live_at_last,
        top: opts.top,
    });
    Ok(CaptureReport {
        path,
        kind: CaptureKind::XlaCapture,
        headline,
        engine: EngineData::Xla(engine),
        sites,
        findings,
        text,
    })
}

fn is_noise(name: &str) -> bool {
    name.starts_with("ThreadpoolListener")
        || name.starts_with("$builtins")
        || name == "PythonRefManager::CollectGarbage"
        || name.starts_with("end: ")
}

/// `(base name, full recorded path)` of the user files in the plan's stack frames.
fn user_files(plan: &Plan, filter: &crate::source::frames::FrameFilter) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let frames = plan
        .at_peak
        .iter()
        .flat_map(|b| b.stack.iter().chain(b.via_stack.iter()))
        .chain(plan.call_site.iter());
    for f in frames {
        if out.iter().any(|(_, p)| *p == f.file) || !filter.is_user(&f.file) {
            continue;
        }
        if let Some(base) = Path::new(&f.file).file_name().and_then(|n| n.to_str()) {
            out.push((base.to_string(), f.file.clone()));
        }
    }
    out
}

/// A Python-tracer function event `$file.py:<def line> <function>`: (base name, def line,
/// function).
fn py_function(name: &str) -> Option<(&str, u32, &str)> {
    let rest = name.strip_prefix('$')?;
    let (file_line, function) = rest.split_once(' ')?;
    let (base, def_line) = file_line.rsplit_once(':')?;
    if !base.ends_with(".py") {
        return None;
    }
    Some((base, def_line.parse().ok()?, function))
}

/// The user's function around a `list.append` event (the tracer event `name`), with the append
/// line when the program text is found.
fn append_site(
    name: &str,
    user_files: &[(String, String)],
    source: &dyn Fn(&str) -> Option<String>,
) -> Option<Location> {
    let (base, def_line, function) = py_function(name)?;
    let file = user_files.iter().find(|f| f.0 == base)?.1.clone();
    let line = source(&file)
        .and_then(|t| find_in_function(&t, def_line, ".append("))
        .unwrap_or(def_line);
    Some(Location {
        file,
        line,
        function: function.to_string(),
    })
}

/// First line at or after `def_line` inside that function's body that contains `needle`.
pub fn find_in_function(text: &str, def_line: u32, needle: &str) -> Option<u32> {
    let lines: Vec<&str> = text.lines().collect();
    let start = def_line.checked_sub(1)? as usize;
    let indent = |s: &str| s.len() - s.trim_start().len();
    let def_indent = indent(lines.get(start)?);
    for (i, l) in lines.iter().enumerate().skip(start + 1) {
        if !l.trim().is_empty() && indent(l) <= def_indent && !l.trim_start().starts_with('#') {
            break;
        }
        if l.contains(needle) {
            return Some(i as u32 + 1);
        }
    }
    None
}

/// The line holding the `jax.jit(...)` call or decorator that compiled `fn_name`, given the
/// line that called the jitted function.
pub fn find_jit_line(text: &str, call_line: u32, fn_name: &str) -> Option<u32> {
    let lines: Vec<&str> = text.lines().collect();
    let is_jit = |l: &str| {
        calls_jit(l) || l.trim_start().starts_with("@jax.jit") || l.trim_start().starts_with("@jit")
    };
    let code = |l: &str| l.split('#').next().unwrap_or("").to_string();
    // The callee names on the call line: identifiers directly followed by `(`.
    let call = code(lines.get(call_line.checked_sub(1)? as usize)?);
    if calls_jit(&call) {
        return Some(call_line);
    }
    let mut callees: Vec<String> = Vec::new();
    let bytes: Vec<char> = call.chars().collect();
    for (i, c) in bytes.iter().enumerate() {
        if *c != '(' {
            continue;
        }
        let mut j = i;
        while j > 0 && (bytes[j - 1].is_alphanumeric() || bytes[j - 1] == '_') {
            j -= 1;
        }
        if j < i {
            callees.push(bytes[j..i].iter().collect());
        }
    }
    callees.push(fn_name.to_string());
    for name in &callees {
        for (i, l) in lines.iter().enumerate() {
            let l = code(l);
            let t = l.trim_start();
            // `name = jax.jit(...)`
            if let Some(rest) = t.strip_prefix(name.as_str()) {
                let rest = rest.trim_start();
                if rest.starts_with('=') && !rest.starts_with("==") && is_jit(rest) {
                    return Some(i as u32 + 1);
                }
            }
            // `@jax.jit` / `@partial(jax.jit, …)` decorating `def name(`
            if t.starts_with(&format!("def {name}(")) {
                let mut k = i;
                while k > 0 && lines[k - 1].trim_start().starts_with('@') {
                    k -= 1;
                    // `@jax.jit`, `@jit`, `@partial(jax.jit, …)`, `@functools.partial(jit, …)`
                    let d = code(lines[k]);
                    if is_jit(&d) || d.contains("jax.jit") || d.contains("(jit,") {
                        return Some(k as u32 + 1);
                    }
                }
            }
        }
    }
    // `jax.jit(fn_name` anywhere (e.g. `step = jax.jit(train_step, ...)` under another name).
    lines
        .iter()
        .position(|l| code(l).contains(&format!("jit({fn_name}")))
        .map(|i| i as u32 + 1)
}

/// `jit(` as a call of `jit` / `jax.jit` (not the tail of a name like `train_step_jit(`).
fn calls_jit(line: &str) -> bool {
    line.match_indices("jit(").any(|(i, _)| {
        line[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// Positional parameter names of `def fn_name(...)`.
pub fn signature(text: &str, fn_name: &str) -> Option<Vec<String>> {
    let start = text.find(&format!("def {fn_name}("))? + fn_name.len() + 5;
    let mut depth = 1;
    let mut end = start;
    for (i, c) in text[start..].char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    end = start + i;
                    break;
                }
            }
            _ => {}
        }
    }
    let args = &text[start..end];
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in args.chars().chain(std::iter::once(',')) {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                let name: String = cur
                    .split([':', '='])
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string();
                if name.starts_with('*') {
                    break;
                }
                if !name.is_empty() && name != "/" && name != "self" {
                    out.push(name);
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    Some(out)
}

/// Buffers at the peak grouped by culprit line.
fn sites(plan: &Plan, pick: &dyn Fn(&[Location]) -> Option<usize>, top: usize) -> Vec<Site> {
    // (site, only heap buffers, bytes per role)
    type Acc = (Site, bool, Vec<(Role, u64)>);
    let mut out: Vec<Acc> = Vec::new();
    for b in &plan.at_peak {
        let (loc, stack) = diagnose::culprit(b, pick);
        let i = match out.iter().position(|s| s.0.location == loc) {
            Some(i) => i,
            None => {
                out.push((
                    Site {
                        location: loc,
                        bytes: 0,
                        requested_bytes: None,
                        blocks: 0,
                        percent: 0.0,
                        stack,
                        role: None,
                        scope: Some(plan.module.clone()),
                        percent_of: "heap peak",
                    },
                    true,
                    Vec::new(),
                ));
                out.len() - 1
            }
        };
        let s = &mut out[i];
        s.0.bytes += b.size;
        s.0.blocks += 1;
        s.1 &= b.heap;
        let role = if b.heap { b.role } else { Role::Other };
        match s.2.iter_mut().find(|r| r.0 == role) {
            Some(r) => r.1 += b.size,
            None => s.2.push((role, b.size)),
        }
        if !b.heap && s.0.role.is_none() {
            s.0.role = Some(b.category.as_str().to_ascii_lowercase());
        }
    }
    let mut sites: Vec<Site> = out
        .into_iter()
        .map(|(mut s, heap_only, roles)| {
            if heap_only {
                s.percent = pct(s.bytes, plan.heap_peak_bytes);
                s.role = roles
                    .iter()
                    .max_by_key(|r| r.1)
                    .map(|r| r.0.as_str().to_string());
            } else {
                s.percent = pct(s.bytes, plan.total_peak_bytes);
                s.percent_of = "peak";
            }
            s
        })
        .collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.bytes));
    // Lines holding only scalars are noise next to megabytes (xprof lumps them as `small`).
    if sites.iter().any(|s| s.bytes >= SMALL_BUFFER_BYTES) {
        sites.retain(|s| s.bytes >= SMALL_BUFFER_BYTES);
    }
    sites.truncate(top.max(1));
    sites
}

fn headline(plan: &Plan, findings: &[Finding]) -> String {
    let main = findings
        .iter()
        .find(|f| f.severity >= crate::findings::Severity::Warning);
    let at = |f: &Finding| {
        f.location
            .as_ref()
            .map(|l| {
                let base = Path::new(&l.file)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or(&l.file);
                format!(" ({base}:{})", l.line)
            })
            .unwrap_or_default()
    };
    match main {
        Some(f) => format!("{}: {} [{}]{}", plan.module, f.message, f.code, at(f)),
        None => format!(
            "{}: plan peaks at {} (heap {} + parameters/outputs {}); no memory problem found{}",
            plan.module,
            fmt_bytes(plan.total_peak_bytes),
            fmt_bytes(plan.heap_peak_bytes),
            fmt_bytes(plan.indefinite_in_peak),
            findings
                .iter()
                .find(|f| f.code == Code::JX009)
                .map(|f| format!(
                    "; largest: {}{}",
                    f.message.split(" live at").next().unwrap_or(""),
                    at(f)
                ))
                .unwrap_or_default()
        ),
    }
}

fn plan_json(p: &Plan) -> Value {
    let role = |k: &str| p.roles.get(k).copied().unwrap_or(0);
    json!({
        "parameter_bytes": p.parameter_bytes,
        "donated_bytes": p.donated_bytes,
        "output_bytes": p.output_bytes,
        "non_aliased_output_bytes": p.non_aliased_output_bytes,
        "temp_bytes": p.temp_bytes,
        "heap_peak_bytes": p.heap_peak_bytes,
        "total_peak_bytes": p.total_peak_bytes,
        "indefinite_bytes": p.indefinite_bytes,
        "total_allocation_bytes": p.total_allocation_bytes,
        "peak_instruction": p.peak_instruction,
        "roles": {
            "forward": role("forward"),
            "backward": role("backward"),
            "workspace": role("workspace"),
            "other": role("other"),
        },
        "buffers_at_peak": p.at_peak.iter().take(25).map(|b| json!({
            "bytes": b.size,
            "shape": b.shape,
            "instruction": b.instruction,
            "op_name": b.op_name,
            "category": b.category.as_str(),
            "role": b.role.key(),
            "file": b.source.as_ref().map(|s| s.file.clone()),
            "line": b.source.as_ref().map(|s| s.line),
        })).collect::<Vec<_>>(),
    })
}

fn engine_json(plan: &Plan, plans: &[Plan], rt: &Runtime) -> Value {
    let temp_of = |e: &Execution| {
        (e.module == plan.module)
            .then(|| rt.temp_allocation(e, &plan.temp_allocations))
            .flatten()
            .map(|m| m.requested_bytes)
    };
    let mut runtime = serde_json::Map::new();
    if let Some(a) = rt.main() {
        runtime.insert("allocator".into(), json!(a.name));
        runtime.insert("capacity_bytes".into(), json!(a.capacity_bytes));
        runtime.insert("peak_bytes_in_use".into(), json!(a.peak_bytes_in_use));
        runtime.insert("lifetime_peak_bytes".into(), json!(a.lifetime_peak_bytes));
    }
    runtime.insert(
        "executions".into(),
        Value::Array(
            rt.executions
                .iter()
                .map(|e| {
                    json!({
                        "module": e.module,
                        "start_ps": e.start_ps,
                        "kernels": e.kernels,
                        "bytes_in_use_at_start": e.bytes_in_use_at_start,
                        "temp_bytes_allocated": temp_of(e),
                    })
                })
                .collect(),
        ),
    );
    runtime.insert(
        "allocator_retries".into(),
        json!(rt.retries.iter().map(|r| json!({"start_ps": r.t_ps, "duration_ps": r.duration_ps, "module": r.module})).collect::<Vec<_>>()),
    );
    json!({
        "module": plan.module,
        "plan": plan_json(plan),
        "runtime": Value::Object(runtime),
        "modules": plans.iter().map(|p| json!({
            "module": p.module,
            "total_peak_bytes": p.total_peak_bytes,
            "heap_peak_bytes": p.heap_peak_bytes,
            "executions": rt.executions_of(&p.module).count(),
        })).collect::<Vec<_>>(),
    })
}

struct RenderInput<'a> {
    cap: &'a Capture,
    plan: &'a Plan,
    plans: &'a [Plan],
    rt: &'a Runtime,
    why: &'a str,
    execs: &'a [&'a Execution],
    findings: &'a [Finding],
    sites: &'a [Site],
    between_last_two: &'a [(String, u64)],
    live_at_last: &'a [super::runtime::LiveGroup],
    top: usize,
}

fn tag(l: Label) -> &'static str {
    match l {
        Label::Measured => "[measured]",
        Label::Read => "[read]",
        Label::Inferred => "[inferred]",
        Label::Simulated => "[simulated]",
    }
}

fn render(r: &RenderInput) -> String {
    let p = r.plan;
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(
        w,
        "Module {} (one of {} modules with an HLO plan [read]); chosen as {} (--module to pick another).",
        p.module,
        r.plans.len(),
        r.why
    );
    if !r.cap.versions.is_empty() {
        let v: Vec<String> = r
            .cap
            .versions
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(w, "Recorded with {} {}", v.join(", "), tag(Label::Read));
    }
    let _ = writeln!(w, "\nPlan (compiled buffer assignment, memory space 0):");
    let row = |w: &mut String, name: &str, b: u64, l: Label, note: String| {
        let _ = writeln!(
            w,
            "  {name:<28} {:>12}  {:<10} {note}",
            fmt_bytes(b),
            tag(l)
        );
    };
    row(
        w,
        "parameters",
        p.parameter_bytes,
        Label::Read,
        format!("donated {}", fmt_bytes(p.donated_bytes)),
    );
    row(
        w,
        "outputs",
        p.output_bytes,
        Label::Read,
        format!(
            "not aliased with parameters {}",
            fmt_bytes(p.non_aliased_output_bytes)
        ),
    );
    row(
        w,
        "temporary block",
        p.temp_bytes,
        Label::Read,
        String::new(),
    );
    row(
        w,
        "heap peak",
        p.heap_peak_bytes,
        Label::Read,
        if p.peak_instruction.is_empty() {
            String::new()
        } else {
            format!("at {}", p.peak_instruction)
        },
    );
    row(
        w,
        "total peak",
        p.total_peak_bytes,
        Label::Read,
        "heap peak + parameters, outputs and constants (as xprof's memory viewer)".into(),
    );
    let role = |k: &str| p.roles.get(k).copied().unwrap_or(0);
    let _ = writeln!(
        w,
        "  heap peak by role: forward kept for backward {} ({:.1}%), backward {} ({:.1}%), workspace {} ({:.1}%), other {} ({:.1}%) {}",
        fmt_bytes(role("forward")),
        pct(role("forward"), p.heap_peak_bytes),
        fmt_bytes(role("backward")),
        pct(role("backward"), p.heap_peak_bytes),
        fmt_bytes(role("workspace")),
        pct(role("workspace"), p.heap_peak_bytes),
        fmt_bytes(role("other")),
        pct(role("other"), p.heap_peak_bytes),
        tag(Label::Inferred)
    );

    let _ = writeln!(
        w,
        "\nTop buffers at the peak {} (role {}):",
        tag(Label::Read),
        tag(Label::Inferred)
    );
    for (i, b) in p.at_peak.iter().take(r.top.max(1)).enumerate() {
        let (base, share) = if b.heap {
            ("heap peak", pct(b.size, p.heap_peak_bytes))
        } else {
            ("peak", pct(b.size, p.total_peak_bytes))
        };
        let at = match (&b.source, b.line(), &b.via) {
            (Some(f), _, _) => format!("{}:{}", f.file, f.line),
            (None, Some(f), Some(w)) => {
                format!("{}:{} (carried by {w}) [inferred]", f.file, f.line)
            }
            _ => "(no source line)".into(),
        };
        let what = if b.heap {
            b.role.as_str().to_string()
        } else {
            b.category.as_str().to_string()
        };
        let _ = writeln!(
            w,
            "  {:>2}. {:>11}  {:5.1}% of {base:<9}  {:<28} {at}  {what}  ({} # {})",
            i + 1,
            fmt_bytes(b.size),
            share,
            super::hlo::without_layout(&b.shape),
            b.instruction,
            b.op_name
        );
    }
    if !r.sites.is_empty() {
        let _ = writeln!(w, "\nBy Python line {}:", tag(Label::Read));
        for site in r.sites {
            let at = site
                .location
                .as_ref()
                .map(|l| format!("{}:{} {}", l.file, l.line, l.function))
                .unwrap_or_else(|| "(no source line: parameters, compiler-created buffers)".into());
            let _ = writeln!(
                w,
                "  {:>11} in {:>3} buffer(s)  {:5.1}% of the {:<9}  {at}",
                fmt_bytes(site.bytes),
                site.blocks,
                site.percent,
                site.percent_of
            );
        }
    }

    let _ = writeln!(w, "\nRuntime:");
    match r.rt.main() {
        Some(a) => {
            let _ = writeln!(
                w,
                "  allocator {}: capacity {} {}, peak in use {} {}, allocator lifetime peak {} {}",
                a.name,
                fmt_bytes(a.capacity_bytes),
                tag(Label::Measured),
                fmt_bytes(a.peak_bytes_in_use),
                tag(Label::Measured),
                fmt_bytes(a.lifetime_peak_bytes),
                tag(Label::Read)
            );
        }
        None => {
            let _ = writeln!(
                w,
                "  no allocator (MemoryAllocation) events: the capture cannot show capacity, bytes in use or growth (the CPU client has no BFC allocator)"
            );
        }
    }
    let _ = writeln!(
        w,
        "  {} execution(s) of {} in the capture {}",
        r.execs.len(),
        p.module,
        tag(Label::Measured)
    );
    for (i, e) in r.execs.iter().enumerate().take(20) {
        let inuse = e
            .bytes_in_use_at_start
            .map(|b| format!(", {} in use at start", fmt_bytes(b)))
            .unwrap_or_default();
        let k = match e.kernels {
            Some(0) => ", launched no kernel".to_string(),
            Some(n) => format!(", {n} kernels/ops"),
            None => String::new(),
        };
        let temp =
            r.rt.temp_allocation(e, &p.temp_allocations)
                .map(|m| {
                    format!(
                        ", temporary block {} allocated",
                        fmt_bytes(m.requested_bytes)
                    )
                })
                .unwrap_or_default();
        let _ = writeln!(
            w,
            "    #{} at {:.3} ms{inuse}{temp}{k} {}",
            i + 1,
            e.start_ps as f64 / 1e9,
            tag(Label::Measured)
        );
    }
    if !r.rt.retries.is_empty() {
        let longest =
            r.rt.retries
                .iter()
                .map(|x| x.duration_ps)
                .max()
                .unwrap_or(0);
        let _ = writeln!(
            w,
            "  AllocatorRetry::AllocateRaw: {} wait(s), longest {:.3} s {}",
            r.rt.retries.len(),
            longest as f64 / 1e12,
            tag(Label::Measured)
        );
    }
    let others: Vec<String> = r
        .plans
        .iter()
        .filter(|x| x.module != p.module)
        .filter_map(|x| {
            let n = r.rt.executions_of(&x.module).count();
            (n > 0).then(|| format!("{} ×{n}", x.module))
        })
        .take(8)
        .collect();
    if !others.is_empty() {
        let _ = writeln!(
            w,
            "  other modules executed: {} {}",
            others.join(", "),
            tag(Label::Measured)
        );
    }
    if !r.between_last_two.is_empty() {
        let ev: Vec<String> = r
            .between_last_two
            .iter()
            .take(12)
            .map(|(n, c)| format!("{n} ×{c}"))
            .collect();
        let _ = writeln!(
            w,
            "  host events between the last two executions: {} {}",
            ev.join(", "),
            tag(Label::Measured)
        );
    }
    if !r.live_at_last.is_empty() {
        let _ = writeln!(
            w,
            "  live at the last execution start, by the host event that allocated them {}:",
            tag(Label::Measured)
        );
        for g in r.live_at_last.iter().take(8) {
            let _ = writeln!(
                w,
                "    {:>11} in {:>3} buffer(s)  {}",
                fmt_bytes(g.bytes),
                g.count,
                g.label
            );
        }
    }

    let _ = writeln!(w, "\nDiagnosis:");
    let shown: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| f.code != Code::JX009)
        .collect();
    if shown.is_empty() {
        let _ = writeln!(
            w,
            "  no problem found: parameters donated or nothing to donate, no growth evidence, no single line dominates the peak"
        );
    }
    for f in &shown {
        let at = f
            .location
            .as_ref()
            .map(|l| format!(" at {}:{}", l.file, l.line))
            .unwrap_or_default();
        let _ = writeln!(w, "  {} {} {}{at}", f.severity.as_str(), f.code, f.message);
        for e in &f.evidence {
            let _ = writeln!(w, "      {} {}", tag(e.label), e.text);
        }
    }

    let _ = writeln!(w, "\nNext steps:");
    let mut n = 0;
    for f in &shown {
        for fix in &f.fixes {
            n += 1;
            let at = f
                .location
                .as_ref()
                .map(|l| format!("{}:{}: ", l.file, l.line))
                .unwrap_or_default();
            // Savings are estimates: tag them, and say them once.
            let saving = match fix.saving_bytes.filter(|b| *b > 0) {
                Some(b) if fix.title.contains(&fmt_bytes(b)) => {
                    format!(" {}", tag(Label::Inferred))
                }
                Some(b) => format!(" — saves ~{} {}", fmt_bytes(b), tag(Label::Inferred)),
                None => String::new(),
            };
            let cost = fix
                .cost
                .as_ref()
                .map(|c| format!("; cost: {c}"))
                .unwrap_or_default();
            let _ = writeln!(w, "  {n}. {at}{} [{}]{saving}{cost}", fix.title, f.code);
        }
    }
    n += 1;
    let _ = writeln!(
        w,
        "  {n}. confirm any change with jax.jit(f).lower(*args).compile().memory_analysis() before re-running the workload"
    );

    let _ = writeln!(w, "\nUncertainty:");
    let _ = writeln!(
        w,
        "  - roles come from the JAX name stack and are inferred; buffers XLA created without a name stack count as \"other\""
    );
    if r.rt.main().is_none() {
        let _ = writeln!(
            w,
            "  - without allocator events the capture cannot answer: does it fit, what else was live, does memory grow per step"
        );
    }
    let _ = writeln!(
        w,
        "  - only memory space 0 (device memory) is analysed in depth; one host per file; \"fits\" compares bytes, and BFC also needs contiguous chunks"
    );
    if p.heap_peak_bytes == 0 && p.total_peak_bytes > 0 {
        let _ = writeln!(
            w,
            "  - this plan has no heap-simulator trace (e.g. TPU): only its totals are known"
        );
    }
    s
}

/// A capture without HLO modules (TensorFlow, or a trace with `enable_hlo_proto=False`).
fn runtime_only(cap: &Capture, plans: &[Plan], rt: &Runtime) -> CaptureReport {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "This capture holds no HLO module with a buffer assignment (TensorFlow capture, or JAX with enable_hlo_proto=False): no plan, no source lines."
    );
    for a in &rt.allocators {
        let _ = writeln!(
            text,
            "  allocator {}: peak in use {} of capacity {} {}, {} events",
            a.name,
            fmt_bytes(a.peak_bytes_in_use),
            fmt_bytes(a.capacity_bytes),
            tag(Label::Measured),
            a.events
        );
    }
    let headline = match rt.main() {
        Some(a) => format!(
            "no HLO plan in this capture; allocator {} peaked at {} of {} (measured)",
            a.name,
            fmt_bytes(a.peak_bytes_in_use),
            fmt_bytes(a.capacity_bytes)
        ),
        None => "no HLO plan and no allocator events in this capture: nothing to analyse".into(),
    };
    let mut runtime = serde_json::Map::new();
    if let Some(a) = rt.main() {
        runtime.insert("allocator".into(), json!(a.name));
        runtime.insert("capacity_bytes".into(), json!(a.capacity_bytes));
        runtime.insert("peak_bytes_in_use".into(), json!(a.peak_bytes_in_use));
    }
    runtime.insert("executions".into(), json!([]));
    CaptureReport {
        path: cap.file.path.clone(),
        kind: CaptureKind::XlaCapture,
        headline,
        engine: EngineData::Xla(json!({
            "module": Value::Null,
            "plan": Value::Null,
            "runtime": Value::Object(runtime),
            "modules": plans.len(),
        })),
        sites: Vec::new(),
        findings: Vec::new(),
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROGRAM: &str = "import jax
def train_step(params, opt_state, x, y=None, *rest):
    return params

step = jax.jit(train_step)  # a comment with jit(

@partial(jax.jit, static_argnums=2)
def eval_step(params, batch):
    return params

def loop(params, o, x):
    hist = []
    for _ in range(3):
        params = step(params, o, x)
        hist.append(params)
        e = eval_step(params, x)
    out = train_step_jit(params)
    return params
";

    #[test]
    fn jit_line_is_found_from_the_call_site() {
        // `step(...)` on line 14 was made by `step = jax.jit(train_step)` on line 5.
        assert_eq!(find_jit_line(PROGRAM, 14, "train_step"), Some(5));
        // A decorated function: the decorator line.
        assert_eq!(find_jit_line(PROGRAM, 16, "eval_step"), Some(7));
        // `train_step_jit(` is a name ending in `jit`, not a jit call: fall back to the
        // `jax.jit(train_step` line.
        assert_eq!(find_jit_line(PROGRAM, 17, "train_step"), Some(5));
        assert_eq!(find_jit_line(PROGRAM, 99, "train_step"), None);
    }

    #[test]
    fn signature_and_append_line() {
        assert_eq!(
            signature(PROGRAM, "train_step"),
            Some(vec![
                "params".into(),
                "opt_state".into(),
                "x".into(),
                "y".into()
            ])
        );
        assert_eq!(find_in_function(PROGRAM, 11, ".append("), Some(15));
        assert_eq!(find_in_function(PROGRAM, 2, ".append("), None);
    }

    #[test]
    fn python_tracer_function_events() {
        assert_eq!(
            py_function("$d_grads_kept.py:48 train_loop"),
            Some(("d_grads_kept.py", 48, "train_loop"))
        );
        assert_eq!(py_function("$<unknown> append"), None);
        assert_eq!(py_function("$builtins isinstance"), None);
    }
}
