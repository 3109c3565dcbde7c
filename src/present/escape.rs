//! Escaping of capture strings (frame names, file names, module names: whatever a capture holds)
//! for each place they are shown, so that no string of a capture can change what a reader sees
//! beyond its own text:
//! - [`script_json`]: JSON inlined into an HTML `<script>` block (the page's data);
//! - [`html_text`]: text in an HTML element or attribute (the page's title);
//! - [`terminal`]: text printed to a terminal or a CI log (`report`, `--check`, GitHub
//!   annotations): control characters and bidirectional overrides shown as `\x1b`, `\u{202e}`;
//! - [`md_text`], [`md_code`]: Markdown (the editor's hovers): no link, image, HTML or emphasis
//!   comes from a capture string, and a code span stays one code span.

use std::borrow::Cow;
use std::fmt::Write;

/// JSON text made safe to inline in `<script type="application/json">…</script>`: every `<`, `>`
/// and `&` (so neither `</script>` nor `<!--` can change the tokenizer's state) and U+2028/U+2029
/// written as `\uXXXX`. In JSON these characters only occur inside strings, where the escape
/// means the same character, so `JSON.parse` of the block gives the same value.
pub fn script_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 16);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// Text for an HTML element or a quoted attribute value.
pub fn html_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether `c` must not reach a terminal raw: C0 controls (ESC, NUL, CR, backspace, …), DEL, C1
/// controls (U+0080–U+009F, which some terminals take as CSI), and the bidirectional overrides and
/// isolates that reorder what is shown (U+202A–U+202E, U+2066–U+2069).
fn unsafe_for_terminal(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Text for a terminal or a CI log: every control character shown as an escape (`\x1b`,
/// `\x00`, `\u{9b}`, `\u{202e}`), except newline and tab, which multi-line outputs are made of.
/// Unchanged (borrowed) when there is nothing to escape.
pub fn terminal(s: &str) -> Cow<'_, str> {
    if !s
        .chars()
        .any(|c| unsafe_for_terminal(c) && c != '\n' && c != '\t')
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if c == '\n' || c == '\t' || !unsafe_for_terminal(c) {
            out.push(c);
        } else {
            out.push_str(&escaped(c));
        }
    }
    Cow::Owned(out)
}

/// One line of text for a terminal or a CI log: as [`terminal`], and newline and tab escaped too
/// (`\x0a`), so a capture string cannot start a line of its own (a forged finding line).
pub fn one_line(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_for_terminal) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if unsafe_for_terminal(c) {
            let _ = write!(out, "{}", escaped(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The visible form of a control character: `\x1b` below U+0080, `\u{9b}` above.
fn escaped(c: char) -> String {
    if (c as u32) < 0x80 {
        format!("\\x{:02x}", c as u32)
    } else {
        format!("\\u{{{:x}}}", c as u32)
    }
}

/// Markdown text whose code spans (`` `x` ``, as the messages write code) are kept and whose
/// other text is shown literally: `[`, `]`, `<`, `>`, `&`, `*`, `~`, `|`, `#`, `\` and `_` at a
/// word's edge are backslash-escaped, so a capture string makes no link, image, HTML, heading or
/// emphasis. Backtick runs are left as they are (a backslash is always escaped, so none becomes
/// escaped), so the code spans of the result are the code spans of `s`; inside a code span
/// nothing is live. Control characters are escaped as for a terminal; a line break (newline, CR,
/// U+2028/2029) becomes a space (a capture string cannot start a block of its own).
pub fn md_text(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len() + 8);
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '`' {
            let run = run_len(&chars, i);
            if let Some(close) = closing_run(&chars, i + run, run) {
                // A code span: verbatim (controls still escaped).
                for &c in &chars[i..close + run] {
                    push_controls(&mut out, c);
                }
                i = close + run;
            } else {
                out.extend(std::iter::repeat_n('`', run));
                i += run;
            }
            continue;
        }
        let c = chars[i];
        let word = |j: Option<usize>| {
            j.and_then(|j| chars.get(j))
                .is_some_and(|c| c.is_alphanumeric())
        };
        match c {
            '\\' | '[' | ']' | '<' | '>' | '&' | '*' | '~' | '|' | '#' => {
                out.push('\\');
                out.push(c);
            }
            '_' if !(word(i.checked_sub(1)) && word(Some(i + 1))) => out.push_str("\\_"),
            '\n' | '\r' | '\u{2028}' | '\u{2029}' => out.push(' '),
            c => push_controls(&mut out, c),
        }
        i += 1;
    }
    out
}

/// `s` as one Markdown code span, whatever backticks it holds: fenced by a run of backticks
/// longer than any in `s` (padded with spaces where `s` starts or ends with one), controls escaped
/// and newlines as spaces.
pub fn md_code(s: &str) -> String {
    let mut longest = 0;
    let mut cur = 0;
    for c in s.chars() {
        if c == '`' {
            cur += 1;
            longest = longest.max(cur);
        } else {
            cur = 0;
        }
    }
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') {
        " "
    } else {
        ""
    };
    let mut body = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' | '\r' | '\u{2028}' | '\u{2029}' => body.push(' '),
            c => push_controls(&mut body, c),
        }
    }
    format!("{fence}{pad}{body}{pad}{fence}")
}

fn push_controls(out: &mut String, c: char) {
    if unsafe_for_terminal(c) && c != '\t' && c != '\n' {
        out.push_str(&escaped(c));
    } else {
        out.push(c);
    }
}

fn run_len(chars: &[char], at: usize) -> usize {
    chars[at..].iter().take_while(|&&c| c == '`').count()
}

/// Where the next run of exactly `n` backticks at or after `from` starts.
fn closing_run(chars: &[char], from: usize, n: usize) -> Option<usize> {
    let mut j = from;
    while j < chars.len() {
        if chars[j] == '`' {
            let run = run_len(chars, j);
            if run == n {
                return Some(j);
            }
            j += run;
        } else {
            j += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_json_closes_nothing_and_parses_to_the_same_value() {
        let v = serde_json::json!({"f": "a<!--<script></script>&\u{2028}\u{2029}>b"});
        let raw = serde_json::to_string(&v).unwrap();
        let safe = script_json(&raw);
        for bad in ["<", ">", "&", "\u{2028}", "\u{2029}"] {
            assert!(!safe.contains(bad), "{safe}");
        }
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn html_text_escapes_markup_and_quotes() {
        assert_eq!(
            html_text(r#"<a href="x">&'"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }

    #[test]
    fn terminal_escapes_controls_but_keeps_lines() {
        assert_eq!(terminal("a\nb\tc"), "a\nb\tc");
        assert!(matches!(terminal("plain é"), Cow::Borrowed(_)));
        assert_eq!(
            terminal("\x1b[31mred\x00\r\u{9b}2J\u{202e}"),
            "\\x1b[31mred\\x00\\x0d\\u{9b}2J\\u{202e}"
        );
    }

    #[test]
    fn one_line_escapes_newlines_too() {
        assert_eq!(one_line("a\nb:1: error\t"), "a\\x0ab:1: error\\x09");
        assert!(matches!(one_line("x.py"), Cow::Borrowed(_)));
    }

    #[test]
    fn md_text_keeps_code_spans_and_kills_links_images_html() {
        assert_eq!(
            md_text("Accumulate `loss.item()` in __init__"),
            "Accumulate `loss.item()` in \\_\\_init\\_\\_"
        );
        assert_eq!(md_text("train_leak.py"), "train_leak.py");
        let s = md_text("[x](http://e) ![i](http://e/i.png) <img src=x onerror=y> a\nb # c");
        assert_eq!(
            s,
            "\\[x\\](http://e) !\\[i\\](http://e/i.png) \\<img src=x onerror=y\\> a b \\# c"
        );
        assert!(!s.contains('\n'), "{s}");
        // A stray backtick stays literal and opens nothing.
        assert_eq!(md_text("a ` [b](c)"), "a ` \\[b\\](c)");
        // Inside a span nothing is escaped (it is not live there).
        assert_eq!(md_text("`[b](c)`"), "`[b](c)`");
    }

    #[test]
    fn md_code_is_one_span_whatever_it_holds() {
        assert_eq!(md_code("f"), "`f`");
        assert_eq!(md_code("a`b"), "``a`b``");
        assert_eq!(md_code("`x`"), "`` `x` ``");
        assert_eq!(md_code("a\nb\x1b"), "`a b\\x1b`");
    }
}
