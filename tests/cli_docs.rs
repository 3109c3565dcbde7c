//! Every finding code has its documentation page, where `docs_url` points.

use std::path::Path;

#[test]
fn every_code_has_a_page() {
    let codes = (1..=11)
        .map(|n| format!("PT{n:03}"))
        .chain((1..=9).map(|n| format!("JX{n:03}")));
    for code in codes {
        let rel = format!("docs/findings/{code}.md");
        assert!(
            memlsp::findings::docs_url(&code).ends_with(&rel),
            "docs_url({code}) does not point at {rel}"
        );
        let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel))
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(page.starts_with(&format!("# {code}: ")), "{rel} heading");
        for section in [
            "**Severity:**",
            "## What it means",
            "## Evidence memlsp uses",
            "## Fixes",
            "## When it is expected",
        ] {
            assert!(page.contains(section), "{rel} lacks {section}");
        }
    }
}
