//! The finding pages (`docs/findings/<CODE>.md`) as MCP resources, `memlsp://findings/<CODE>`:
//! compiled in, so the server answers from any directory.

use rmcp::model::{ReadResourceResult, Resource, ResourceContents};

use crate::findings::Code;

/// Where the pages live.
const PREFIX: &str = "memlsp://findings/";

/// Every code's page (`pages_cover_every_code` checks that none is missing).
const PAGES: &[(Code, &str)] = &[
    (Code::BL001, include_str!("../../docs/findings/BL001.md")),
    (Code::JX001, include_str!("../../docs/findings/JX001.md")),
    (Code::JX002, include_str!("../../docs/findings/JX002.md")),
    (Code::JX003, include_str!("../../docs/findings/JX003.md")),
    (Code::JX004, include_str!("../../docs/findings/JX004.md")),
    (Code::JX005, include_str!("../../docs/findings/JX005.md")),
    (Code::JX006, include_str!("../../docs/findings/JX006.md")),
    (Code::JX007, include_str!("../../docs/findings/JX007.md")),
    (Code::JX008, include_str!("../../docs/findings/JX008.md")),
    (Code::JX009, include_str!("../../docs/findings/JX009.md")),
    (Code::JX010, include_str!("../../docs/findings/JX010.md")),
    (Code::PT001, include_str!("../../docs/findings/PT001.md")),
    (Code::PT002, include_str!("../../docs/findings/PT002.md")),
    (Code::PT003, include_str!("../../docs/findings/PT003.md")),
    (Code::PT004, include_str!("../../docs/findings/PT004.md")),
    (Code::PT005, include_str!("../../docs/findings/PT005.md")),
    (Code::PT006, include_str!("../../docs/findings/PT006.md")),
    (Code::PT007, include_str!("../../docs/findings/PT007.md")),
    (Code::PT008, include_str!("../../docs/findings/PT008.md")),
    (Code::PT009, include_str!("../../docs/findings/PT009.md")),
    (Code::PT010, include_str!("../../docs/findings/PT010.md")),
    (Code::PT011, include_str!("../../docs/findings/PT011.md")),
    (Code::PT012, include_str!("../../docs/findings/PT012.md")),
    (Code::PT013, include_str!("../../docs/findings/PT013.md")),
    (Code::PT014, include_str!("../../docs/findings/PT014.md")),
    (Code::PT015, include_str!("../../docs/findings/PT015.md")),
    (Code::PT016, include_str!("../../docs/findings/PT016.md")),
    (Code::PT017, include_str!("../../docs/findings/PT017.md")),
    (Code::PT018, include_str!("../../docs/findings/PT018.md")),
    (Code::PT019, include_str!("../../docs/findings/PT019.md")),
    (Code::PT020, include_str!("../../docs/findings/PT020.md")),
];

fn uri(code: Code) -> String {
    format!("{PREFIX}{code}")
}

/// The page's first heading (`# JX005: no parameter donated`), else the code.
fn title(code: Code, page: &str) -> String {
    page.lines()
        .find_map(|l| l.strip_prefix("# "))
        .map_or_else(|| code.to_string(), |t| t.trim().to_string())
}

/// Every page, in code order.
pub(super) fn list() -> Vec<Resource> {
    PAGES
        .iter()
        .map(|(code, page)| {
            Resource::new(uri(*code), code.as_str())
                .with_title(title(*code, page))
                .with_description(format!(
                    "What {code} ({}) means, why memlsp reports it, how to fix it",
                    code.pattern()
                ))
                .with_mime_type("text/markdown")
                .with_size(page.len() as u64)
        })
        .collect()
}

/// The page at `uri`, if there is one.
pub(super) fn read(uri: &str) -> Option<ReadResourceResult> {
    let code = Code::parse(uri.strip_prefix(PREFIX)?)?;
    let (_, page) = PAGES.iter().find(|(c, _)| *c == code)?;
    Some(ReadResourceResult::new(vec![
        ResourceContents::text(*page, uri).with_mime_type("text/markdown"),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_cover_every_code() {
        for code in Code::ALL {
            let page = PAGES.iter().find(|(c, _)| *c == code);
            assert!(page.is_some(), "{code} has no page in PAGES");
            assert!(read(&uri(code)).is_some(), "{code}");
        }
        assert_eq!(PAGES.len(), Code::ALL.len());
        assert_eq!(list().len(), Code::ALL.len());
        assert!(read("memlsp://findings/XX999").is_none());
        assert!(read("file:///etc/passwd").is_none());
    }
}
