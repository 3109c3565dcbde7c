//! The body of an editor's hover on a line (Markdown): each finding with its evidence, fixes and
//! allocation stack, then each site's share. The language server wraps it in its hover type
//! (`lsp/handlers/hover.rs`); what it says is decided here, with the other renderings.

use std::path::Path;

use crate::findings::{Finding, Location, SavingNote, fmt_bytes};
use crate::frames::{FrameFilter, FrameKind};
use crate::present::escape::{md_code, md_text};
use crate::report::Site;
use crate::torch::stages::summary::StageAtPeak;

/// A finding on the hovered line and the capture (its shown name) that reported it.
pub struct HoverFinding<'a> {
    pub finding: &'a Finding,
    pub capture: String,
    /// The stage holding the capture's peak (recorded or inferred), when it has stages.
    pub stage_at_peak: Option<&'a StageAtPeak>,
}

/// A site on the hovered line and the capture (its shown name) that recorded it.
pub struct HoverSite<'a> {
    pub site: &'a Site,
    pub capture: String,
}

/// A local file as a link target (`file:///…`), or `None` when it cannot be one. The front end
/// gives it: the URI form belongs to the protocol.
pub type FileLink<'a> = &'a dyn Fn(&Path) -> Option<String>;

fn frame_label(loc: &Location) -> String {
    format!("{}:{} {}", loc.file, loc.line, loc.function)
}

/// The allocation stack as hover Markdown: one line per user frame, each a link to the file
/// and line (`file:///…#L8`, which VS Code and Neovim's `gx` open); framework and native frames
/// folded into a count.
fn stack_block(frames: &[Location], filter: &FrameFilter, link: FileLink) -> String {
    let mut out = String::new();
    let mut folded = 0usize;
    let mut folded_native = 0usize;
    for fr in frames {
        match filter.classify(&fr.file) {
            FrameKind::User => {
                let link = fr.local().and_then(link).map(|u| {
                    format!(
                        "[{}:{}]({}#L{})",
                        md_text(fr.shown()),
                        fr.line,
                        // A `(` or `)` of the path would end the link's destination.
                        u.replace('(', "%28").replace(')', "%29"),
                        fr.line
                    )
                });
                match link {
                    Some(l) => out.push_str(&format!("- {l} {}\n", md_code(&fr.function))),
                    None => out.push_str(&format!(
                        "- {} (not in the workspace)\n",
                        md_code(&frame_label(fr))
                    )),
                }
            }
            FrameKind::Generated => {
                // The kernel a compiler wrote for the user's line below it.
                out.push_str(&format!(
                    "- {} (generated code)\n",
                    md_code(&frame_label(fr))
                ));
            }
            FrameKind::Framework => folded += 1,
            FrameKind::Native => folded_native += 1,
        }
    }
    if folded > 0 {
        out.push_str(&format!("- … {folded} framework frames folded\n"));
    }
    if folded_native > 0 {
        out.push_str(&format!("- … {folded_native} native frames folded\n"));
    }
    out
}

/// The hover's line naming the stage that holds the capture's peak: its name and span are
/// `read` from `external_annotations` or `inferred` from the trace.
fn stage_line(s: &StageAtPeak) -> String {
    let (label, name) = match s.source {
        "recorded" => ("read", md_code(&s.name)),
        _ => ("inferred", format!("the {}", md_text(&s.name))),
    };
    format!(
        "- *{label}*: the capture's peak is in {name} of step {}\n",
        s.step
    )
}

/// Markdown hover for a line: each finding, then the sites, each with its stack and evidence.
pub fn markdown(
    findings: &[HoverFinding],
    sites: &[HoverSite],
    filter: &FrameFilter,
    link: FileLink,
) -> String {
    let mut md = String::new();
    for lf in findings {
        let f = lf.finding;
        md.push_str(&format!(
            "**{} {}** ({}), capture {}",
            f.code,
            f.code.pattern(),
            f.severity.as_str(),
            md_code(&lf.capture)
        ));
        if let Some(scope) = &f.scope {
            md.push_str(&format!(", {}", md_text(&scope.to_string())));
        }
        md.push_str("\n\n");
        md.push_str(&md_text(&f.message));
        md.push_str("\n\n");
        if let Some(b) = f.bytes {
            md.push_str(&format!("**{}**", fmt_bytes(b)));
            if let Some(p) = f.percent {
                md.push_str(&format!(" ({p:.1}%)"));
            }
            if let Some(l) = f.bytes_label {
                md.push_str(&format!(" *{}*", l.as_str()));
            }
            md.push_str("\n\n");
        }
        for e in &f.evidence {
            md.push_str(&format!("- *{}*: {}\n", e.label.as_str(), md_text(&e.text)));
        }
        if let Some(s) = lf.stage_at_peak {
            md.push_str(&stage_line(s));
        }
        if !f.evidence.is_empty() || lf.stage_at_peak.is_some() {
            md.push('\n');
        }
        for fix in &f.fixes {
            md.push_str(&format!("- fix: {}", md_text(&fix.title)));
            match fix.saving_note() {
                Some(SavingNote::InTitle) => md.push_str(" (*inferred*)"),
                Some(SavingNote::Amount(a)) => {
                    md.push_str(&format!(" (saves {}, *inferred*)", md_text(&a)))
                }
                None => {}
            }
            if let Some(sim) = &fix.simulated {
                md.push_str(&format!(
                    "\n  - *simulated*: {} — {}",
                    md_text(&sim.change),
                    md_text(&sim.outcome())
                ));
            }
            md.push('\n');
        }
        if !f.stack.is_empty() {
            md.push_str("\nAllocation stack (innermost first):\n\n");
            md.push_str(&stack_block(&f.stack, filter, link));
        }
        md.push_str(&format!("\n[{}]({})\n\n---\n\n", f.code, f.code.docs_url()));
    }
    for ls in sites {
        let s = ls.site;
        md.push_str(&format!(
            "**{}** live in {} block{} ({:.1}% of {}, *{}*), capture {}",
            fmt_bytes(s.bytes),
            s.blocks,
            if s.blocks == 1 { "" } else { "s" },
            s.percent,
            s.percent_of.as_str(),
            s.label.as_str(),
            md_code(&ls.capture)
        ));
        if let Some(scope) = &s.scope {
            md.push_str(&format!(", {}", md_text(&scope.to_string())));
        }
        if let Some(role) = s.role {
            md.push_str(&format!("; role: {} (*inferred*)", role.as_str()));
        }
        md.push('\n');
        match (&s.reference_line, &s.carried_by) {
            (Some(x), _) => md.push_str(&format!(
                "\nxprof shows these buffers at {} (library code); memlsp attributes them to this line, the first frame of yours (*inferred*)\n",
                md_code(&format!("{}:{}", x.file, x.line))
            )),
            (None, Some(via)) => md.push_str(&format!(
                "\nxprof shows no line for these buffers; memlsp attributes them to this line because {}, the loop called here, carries them (*inferred*)\n",
                md_code(&via.to_string())
            )),
            _ => {}
        }
        if !s.stack.is_empty() {
            md.push_str("\nAllocation stack (innermost first):\n\n");
            md.push_str(&stack_block(&s.stack, filter, link));
        }
        md.push_str("\n---\n\n");
    }
    md.trim_end().trim_end_matches("---").trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stage_at_the_peak_carries_its_label() {
        let st = |name: &str, source: &'static str| StageAtPeak {
            device: 0,
            name: name.into(),
            source,
            step: 2,
            peak_bytes: 1,
        };
        assert_eq!(
            stage_line(&st("backward", "inferred")),
            "- *inferred*: the capture's peak is in the backward of step 2\n"
        );
        assert_eq!(
            stage_line(&st("Optimizer.step#AdamW.step", "recorded")),
            "- *read*: the capture's peak is in `Optimizer.step#AdamW.step` of step 2\n"
        );
    }
}
