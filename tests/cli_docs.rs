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
