//! The JAX sections of the text report: the module and why it was chosen, the compiled plan,
//! the buffers at the peak and by Python line, the runtime view.

use crate::present::escape::one_line;
use std::fmt::Write as _;

use super::tag;
use crate::findings::{Label, fmt_bytes};
use crate::report::CaptureReport;
use crate::xla::diagnose::pct;
use crate::xla::summary::{Modules, Summary};

pub(super) fn sections(w: &mut String, r: &CaptureReport, x: &Summary, top: usize) {
    let (Some(module), Some(p)) = (&x.module, &x.plan) else {
        runtime_only(w, x);
        return;
    };
    let _ = writeln!(
        w,
        "Module {module} (one of {} modules with an HLO plan [read]); chosen as {} (--module to pick another).",
        x.modules.len(),
        x.why
    );
    if !x.versions.is_empty() {
        let v: Vec<String> = x.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(w, "Recorded with {} {}", v.join(", "), tag(Label::Read));
    }
    let _ = writeln!(w, "\nPlan (compiled buffer assignment, memory space 0):");
    let row = |w: &mut String, name: &str, b: u64, note: String| {
        let _ = writeln!(
            w,
            "  {name:<28} {:>12}  {:<10} {note}",
            fmt_bytes(b),
            tag(Label::Read)
        );
    };
    row(
        w,
        "parameters",
        p.parameter_bytes,
        format!("donated {}", fmt_bytes(p.donated_bytes)),
    );
    row(
        w,
        "outputs",
        p.output_bytes,
        format!(
            "not aliased with parameters {}",
            fmt_bytes(p.non_aliased_output_bytes)
        ),
    );
    row(w, "temporary block", p.temp_bytes, String::new());
    row(
        w,
        "heap peak",
        p.heap_peak_bytes,
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
        "heap peak + parameters, outputs and constants (as xprof's memory viewer)".into(),
    );
    let roles = &p.roles;
    let heap = p.heap_peak_bytes;
    let _ = writeln!(
        w,
        "  heap peak by role: forward kept for backward {} ({:.1}%), backward {} ({:.1}%), workspace {} ({:.1}%), other {} ({:.1}%) {}",
        fmt_bytes(roles.forward),
        pct(roles.forward, heap),
        fmt_bytes(roles.backward),
        pct(roles.backward, heap),
        fmt_bytes(roles.workspace),
        pct(roles.workspace, heap),
        fmt_bytes(roles.other),
        pct(roles.other, heap),
        tag(Label::Inferred)
    );

    let _ = writeln!(
        w,
        "\nTop buffers at the peak {} (role {}):",
        tag(Label::Read),
        tag(Label::Inferred)
    );
    for (i, b) in p.rows.iter().take(top.max(1)).enumerate() {
        let (base, share) = if b.heap {
            ("heap peak", pct(b.bytes, heap))
        } else {
            ("peak", pct(b.bytes, p.total_peak_bytes))
        };
        let at = match (&b.file, b.line, &b.via) {
            (Some(f), Some(l), _) => format!("{f}:{l}"),
            (_, _, Some((via, f, l))) => {
                format!("{f}:{l} (carried by {via}) {}", tag(Label::Inferred))
            }
            _ => "(no source line)".into(),
        };
        let what = if b.heap { b.role_text } else { b.category };
        let _ = writeln!(
            w,
            "  {:>2}. {:>11}  {:5.1}% of {base:<9}  {:<28} {at}  {what}  ({} # {})",
            i + 1,
            fmt_bytes(b.bytes),
            share,
            crate::xla::hlo::without_layout(&b.shape),
            b.instruction,
            b.op_name
        );
    }
    let by_line = |w: &mut String, label: Label| {
        for site in r.sites.iter().filter(|s| s.label == label) {
            let at = site
                .location
                .as_ref()
                .map(|l| one_line(&format!("{}:{} {}", l.file, l.line, l.function)).into_owned())
                .unwrap_or_else(|| "(no source line: parameters, compiler-created buffers)".into());
            let why = match (&site.reference_line, &site.carried_by) {
                (Some(x), _) => format!(" (xprof shows {}:{}, library code)", x.file, x.line),
                (None, Some(via)) => {
                    format!(" (xprof shows no line; carried by {via}, the loop called here)")
                }
                _ => String::new(),
            };
            let _ = writeln!(
                w,
                "  {:>11} in {:>3} buffer(s)  {:5.1}% of the {:<9}  {at}{why}",
                fmt_bytes(site.bytes),
                site.blocks,
                site.percent,
                site.percent_of.as_str()
            );
        }
    };
    if r.sites.iter().any(|s| s.label == Label::Read) {
        let _ = writeln!(
            w,
            "\nBy Python line, as xprof maps buffers {}:",
            tag(Label::Read)
        );
        by_line(w, Label::Read);
    }
    if r.sites.iter().any(|s| s.label == Label::Inferred) {
        let _ = writeln!(
            w,
            "\nAttributed to your code by memlsp {} (buffers the rows above show without a user line):",
            tag(Label::Inferred)
        );
        by_line(w, Label::Inferred);
    }
    runtime(w, x, module);
    w.push('\n');
}

fn runtime(w: &mut String, x: &Summary, module: &str) {
    let rt = &x.runtime;
    let _ = writeln!(w, "\nRuntime:");
    match (&rt.allocator, rt.capacity_bytes, rt.peak_bytes_in_use) {
        (Some(name), Some(cap), Some(peak)) => {
            let _ = writeln!(
                w,
                "  allocator {name}: capacity {} {}, peak in use {} {}, allocator lifetime peak {} {}",
                fmt_bytes(cap),
                tag(Label::Measured),
                fmt_bytes(peak),
                tag(Label::Measured),
                fmt_bytes(rt.lifetime_peak_bytes.unwrap_or(0)),
                tag(Label::Read)
            );
        }
        _ => {
            let _ = writeln!(
                w,
                "  no allocator (MemoryAllocation) events: the capture cannot show capacity, bytes in use or growth (the CPU client has no BFC allocator)"
            );
        }
    }
    let execs: Vec<_> = rt
        .executions
        .iter()
        .filter(|e| e.module == module)
        .collect();
    let _ = writeln!(
        w,
        "  {} execution(s) of {module} in the capture {}",
        execs.len(),
        tag(Label::Measured)
    );
    for (i, e) in execs.iter().enumerate().take(20) {
        let inuse = e
            .bytes_in_use_at_start
            .map(|b| format!(", {} in use at start", fmt_bytes(b)))
            .unwrap_or_default();
        let k = match e.kernels {
            Some(0) => ", launched no kernel".to_string(),
            Some(n) => format!(", {n} kernels/ops"),
            None => String::new(),
        };
        let temp = e
            .temp_bytes_allocated
            .map(|b| format!(", temporary block {} allocated", fmt_bytes(b)))
            .unwrap_or_default();
        let _ = writeln!(
            w,
            "    #{} at {:.3} ms{inuse}{temp}{k} {}",
            i + 1,
            e.start_ps as f64 / 1e9,
            tag(Label::Measured)
        );
    }
    let retries = rt.allocator_retries.as_deref().unwrap_or(&[]);
    if !retries.is_empty() {
        let longest = retries.iter().map(|x| x.duration_ps).max().unwrap_or(0);
        let _ = writeln!(
            w,
            "  AllocatorRetry::AllocateRaw: {} wait(s), longest {:.3} s {}",
            retries.len(),
            longest as f64 / 1e12,
            tag(Label::Measured)
        );
    }
    if let Modules::List(modules) = &x.modules {
        let others: Vec<String> = modules
            .iter()
            .filter(|m| m.module != module && m.executions > 0)
            .take(8)
            .map(|m| format!("{} ×{}", m.module, m.executions))
            .collect();
        if !others.is_empty() {
            let _ = writeln!(
                w,
                "  other modules executed: {} {}",
                others.join(", "),
                tag(Label::Measured)
            );
        }
    }
    if !x.between_last_two.is_empty() {
        let ev: Vec<String> = x
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
    if !x.live_at_last.is_empty() {
        let _ = writeln!(
            w,
            "  live at the last execution start, by the host event that allocated them {}:",
            tag(Label::Measured)
        );
        for g in x.live_at_last.iter().take(8) {
            let _ = writeln!(
                w,
                "    {:>11} in {:>3} buffer(s)  {}",
                fmt_bytes(g.bytes),
                g.count,
                g.label
            );
        }
    }
}

/// A capture without HLO modules (TensorFlow, or a trace with `enable_hlo_proto=False`).
fn runtime_only(w: &mut String, x: &Summary) {
    let _ = writeln!(
        w,
        "This capture holds no HLO module with a buffer assignment (TensorFlow capture, or JAX with enable_hlo_proto=False): no plan, no source lines."
    );
    for a in &x.allocators {
        let _ = writeln!(
            w,
            "  allocator {}: peak in use {} of capacity {} {}, {} events",
            a.name,
            fmt_bytes(a.peak_bytes_in_use),
            fmt_bytes(a.capacity_bytes),
            tag(Label::Measured),
            a.events
        );
    }
}

pub(super) fn next_steps() -> Vec<String> {
    vec![
        "confirm any change with jax.jit(f).lower(*args).compile().memory_analysis() before re-running the workload"
            .to_string(),
    ]
}

pub(super) fn uncertainty(x: &Summary) -> Vec<String> {
    let mut out = vec![
        "roles come from the JAX name stack and are inferred; buffers XLA created without a name stack count as \"other\"".to_string(),
    ];
    if x.runtime.allocator.is_none() {
        out.push(
            "without allocator events the capture cannot answer: does it fit, what else was live, does memory grow per step"
                .to_string(),
        );
    }
    out.push(
        "only memory space 0 (device memory) is analysed in depth; one host per file; \"fits\" compares bytes, and BFC also needs contiguous chunks"
            .to_string(),
    );
    if let Some(p) = &x.plan
        && p.heap_peak_bytes == 0
        && p.total_peak_bytes > 0
    {
        out.push(
            "this plan has no heap-simulator trace (e.g. TPU): only its totals are known"
                .to_string(),
        );
    }
    out
}
