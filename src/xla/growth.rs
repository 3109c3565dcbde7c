//! What happens between executions of a module: growth of bytes in use, `list.append` calls in
//! the user's code after each execution (the Python tracer's events), and the host events between
//! the last two executions.

use std::path::Path;

use super::capture::Capture;
use super::diagnose::Growth;
use super::plan::Plan;
use super::runtime::{Execution, Runtime};
use crate::error::CaptureError;
use crate::findings::{Location, Refine};
use crate::frames::FrameFilter;

/// Growth evidence for `execs` (the chosen module's executions) and the host events between the
/// last two of them, by name, with counts.
pub fn between_executions(
    cap: &Capture,
    rt: &Runtime,
    plan: &Plan,
    execs: &[&Execution],
    filter: &FrameFilter,
) -> Result<(Growth, Vec<(String, u64)>), CaptureError> {
    let mut growth = Growth {
        starts: execs
            .iter()
            .filter_map(|e| e.bytes_in_use_at_start)
            .collect(),
        ..Growth::default()
    };
    let mut between_last_two: Vec<(String, u64)> = Vec::new();
    let Some(first) = execs.first() else {
        return Ok((growth, between_last_two));
    };
    let line = rt.line_name(first).to_string();
    if line.is_empty() {
        return Ok((growth, between_last_two));
    }
    let events = rt.host_events(cap, &line, first.start_ps, i64::MAX)?;
    // Only appends made by the user's code count: the Python tracer names the function around
    // each event by base name; JAX itself appends to lists between calls too.
    let user_files = user_files(plan, filter);
    // One sweep (events on a line nest): the innermost open `$file.py:N f` event around each
    // append.
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
        growth.append_site = append_site(&events[o].0, &user_files);
    }
    Ok((growth, between_last_two))
}

fn is_noise(name: &str) -> bool {
    name.starts_with("ThreadpoolListener")
        || name.starts_with("$builtins")
        || name == "PythonRefManager::CollectGarbage"
        || name.starts_with("end: ")
}

/// `(base name, full recorded path)` of the user files in the plan's stack frames.
fn user_files(plan: &Plan, filter: &FrameFilter) -> Vec<(String, String)> {
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

/// The user's function around a `list.append` event (the tracer event `name`): its `def` line,
/// which the locate step moves to the append itself when it finds the program text.
fn append_site(name: &str, user_files: &[(String, String)]) -> Option<(Location, Refine)> {
    let (base, def_line, function) = py_function(name)?;
    let file = user_files.iter().find(|f| f.0 == base)?.1.clone();
    Some((
        Location::new(file, def_line, function),
        Refine::InFunction { needle: ".append(" },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
