//! Every finding code has its documentation page, where `Code::docs_url` points.

use std::path::Path;

use memlsp::findings::Code;

#[test]
fn every_code_has_a_page() {
    for code in Code::ALL {
        let rel = code.docs_path();
        assert!(
            code.docs_url().ends_with(&rel),
            "docs_url({code}) does not point at {rel}"
        );
        assert_eq!(Code::parse(code.as_str()), Some(code), "{code} round-trips");
        let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel))
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(page.starts_with(&format!("# {code}: ")), "{rel} heading");
        let severity_line = page
            .lines()
            .find(|l| l.starts_with("**Severity:** "))
            .unwrap_or_else(|| panic!("{rel} lacks **Severity:**"));
        assert!(
            severity_line.contains(code.default_severity().as_str()),
            "{rel} names the default severity {}: {severity_line}",
            code.default_severity().as_str()
        );
        for section in [
            "## What it means",
            "## Evidence memlsp uses",
            "## Fixes",
            "## When it is expected",
        ] {
            assert!(page.contains(section), "{rel} lacks {section}");
        }
    }
}

/// The README's example is what `memlsp report` prints for the bundled fixture.
#[test]
fn readme_example_is_real_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme
        .find("Example (bundled fixture `fixtures/torch/pt002_retained_graph.pickle`")
        .expect("the README example");
    let block = readme[start..].split("```").nth(1).expect("its code block");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memlsp"))
        .args(["report", "fixtures/torch/pt002_retained_graph.pickle"])
        .current_dir(root)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut shown = 0;
    for line in block.lines().filter(|l| !l.trim().is_empty() && *l != "…") {
        assert!(
            text.lines().any(|t| t == line),
            "README example line not in the output: {line}\n{text}"
        );
        shown += 1;
    }
    assert!(shown >= 4);
}
