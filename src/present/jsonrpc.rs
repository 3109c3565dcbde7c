//! What both servers (the language server, `src/lsp`; the MCP server, `src/mcp`) answer to a
//! message they cannot take, as JSON-RPC 2.0 says: a body that is not JSON is a parse error
//! (`-32700`); JSON nested deeper than [`MAX_DEPTH`], a body over the server's size limit, or
//! JSON that is not a JSON-RPC 2.0 message is an invalid request (`-32600`). The answer carries
//! the message's `id` when it can be read (from the parsed value, else by scanning the start of
//! the bytes for a top-level `"id"`), `null` otherwise. The transports decide how the answer is
//! sent; this module only judges.

use serde_json::{Value, json};

/// JSON-RPC 2.0 "Parse error".
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC 2.0 "Invalid Request".
pub const INVALID_REQUEST: i64 = -32600;
/// Deepest nesting accepted (serde_json's own limit, which both servers' libraries parse with).
pub const MAX_DEPTH: usize = 128;
/// How much of an oversized body is looked at for its `id`.
pub const ID_SCAN: usize = 64 << 10;

/// A message refused: the error code, the message's id (`Value::Null` when unreadable) and a
/// one-line reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub code: i64,
    pub id: Value,
    pub message: String,
}

impl Rejected {
    /// The JSON-RPC 2.0 error response.
    pub fn response(&self) -> Value {
        json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        })
    }
}

/// `Ok(value)` when `body` is one JSON-RPC 2.0 request, notification or response; else what to
/// answer.
pub fn judge(body: &[u8]) -> Result<Value, Rejected> {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            let deep = e.to_string().starts_with("recursion limit exceeded");
            return Err(Rejected {
                code: if deep { INVALID_REQUEST } else { PARSE_ERROR },
                id: scan_id(body).unwrap_or(Value::Null),
                message: if deep {
                    format!("invalid request: JSON nested deeper than {MAX_DEPTH} levels")
                } else {
                    format!(
                        "parse error: the message is not JSON ({e}, byte {} of {})",
                        byte_offset(body, e.line(), e.column()),
                        body.len()
                    )
                },
            });
        }
    };
    match shape(&value) {
        None => Ok(value),
        Some(why) => Err(Rejected {
            code: INVALID_REQUEST,
            id: match value.get("id") {
                Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
                _ => Value::Null,
            },
            message: format!("invalid request: {why}"),
        }),
    }
}

/// What to answer to a body of `len` bytes over the limit `max`, of which `head` (at most
/// [`ID_SCAN`] bytes) was read.
pub fn too_large(head: &[u8], len: u64, max: u64) -> Rejected {
    Rejected {
        code: INVALID_REQUEST,
        id: scan_id(head).unwrap_or(Value::Null),
        message: format!(
            "invalid request: the message is {len} bytes, over the limit of {max} bytes; it was skipped unread"
        ),
    }
}

/// Why `v` is not a JSON-RPC 2.0 message, if it is not.
fn shape(v: &Value) -> Option<&'static str> {
    let Value::Object(m) = v else {
        return Some(if v.is_array() {
            "batches are not supported; send one message at a time"
        } else {
            "a message is a JSON object"
        });
    };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some("`jsonrpc` must be \"2.0\"");
    }
    if !matches!(
        m.get("id"),
        None | Some(Value::Null | Value::String(_) | Value::Number(_))
    ) {
        return Some("`id` must be a string, a number or null");
    }
    match m.get("method") {
        Some(Value::String(_)) => None,
        Some(_) => Some("`method` must be a string"),
        None if m.contains_key("id") && (m.contains_key("result") || m.contains_key("error")) => {
            None
        }
        None => Some("no `method` (and not a response)"),
    }
}

/// The byte offset of 1-based `line` and `column` in `body`.
fn byte_offset(body: &[u8], line: usize, column: usize) -> usize {
    let mut at = 0;
    for _ in 1..line {
        match body[at..].iter().position(|&b| b == b'\n') {
            Some(n) => at += n + 1,
            None => return body.len(),
        }
    }
    (at + column.saturating_sub(1)).min(body.len())
}

/// The value of the top-level `"id"` member of a (possibly broken or cut) JSON object, when it
/// is a number or a string that ends within `bytes`. Strings and nesting are followed so that an
/// `"id"` inside `params` is not taken.
pub fn scan_id(bytes: &[u8]) -> Option<Value> {
    let bytes = &bytes[..bytes.len().min(ID_SCAN)];
    let mut depth = 0usize;
    let mut i = 0;
    // Whether the last string at depth 1 was a key (followed by `:`) named "id".
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.checked_sub(1)?,
            b'"' => {
                let end = string_end(bytes, i)?;
                let key = &bytes[i + 1..end];
                i = end + 1;
                if depth == 1 && key == b"id" {
                    let rest = skip_ws(bytes, i);
                    if bytes.get(rest) == Some(&b':') {
                        return value_at(bytes, skip_ws(bytes, rest + 1));
                    }
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the quote closing the string that opens at `open`.
fn string_end(bytes: &[u8], open: usize) -> Option<usize> {
    let mut j = open + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'"' => return Some(j),
            _ => j += 1,
        }
    }
    None
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// A number or string value starting at `i`, complete within `bytes`.
fn value_at(bytes: &[u8], i: usize) -> Option<Value> {
    let end = match bytes.get(i)? {
        b'"' => string_end(bytes, i)? + 1,
        b'-' | b'0'..=b'9' => {
            let n = bytes[i..]
                .iter()
                .take_while(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E'))
                .count();
            // A number cut by the end of what was read is not the id.
            if i + n >= bytes.len() {
                return None;
            }
            i + n
        }
        _ => return None,
    };
    match serde_json::from_slice(&bytes[i..end]).ok()? {
        v @ (Value::String(_) | Value::Number(_)) => Some(v),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_messages_pass() {
        for ok in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{}}"#[..],
            br#"{"jsonrpc":"2.0","method":"n"}"#,
            br#"{"jsonrpc":"2.0","id":"a","result":null}"#,
            br#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"m"}}"#,
        ] {
            assert!(judge(ok).is_ok(), "{}", String::from_utf8_lossy(ok));
        }
    }

    #[test]
    fn unparseable_is_a_parse_error_with_the_id_when_readable() {
        let r = judge(br#"{"jsonrpc":"2.0","id":42,"method":"x","params":{"a":"#).unwrap_err();
        assert_eq!((r.code, r.id.clone()), (PARSE_ERROR, json!(42)));
        assert!(r.message.starts_with("parse error: "), "{}", r.message);
        let r = judge(b"{ not json").unwrap_err();
        assert_eq!((r.code, r.id), (PARSE_ERROR, Value::Null));
        // An "id" inside params is not the message's.
        let r = judge(br#"{"params":{"id":7},"id":"x-1","method":"#).unwrap_err();
        assert_eq!(r.id, json!("x-1"));
        let r = judge(br#"{"params":{"id":7}, garbage"#).unwrap_err();
        assert_eq!(r.id, Value::Null);
    }

    #[test]
    fn too_deep_and_wrong_shapes_are_invalid_requests() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"x","params":{}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let r = judge(deep.as_bytes()).unwrap_err();
        assert_eq!((r.code, r.id), (INVALID_REQUEST, json!(9)));
        assert!(r.message.contains("deeper than 128"), "{}", r.message);
        for (bad, id) in [
            (&b"[1,2]"[..], Value::Null),
            (br#"{"id": 7, "method": 5}"#, json!(7)),
            (br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#, Value::Null),
            (br#"{"jsonrpc":"2.0","id":3}"#, json!(3)),
        ] {
            let r = judge(bad).unwrap_err();
            assert_eq!((r.code, r.id), (INVALID_REQUEST, id));
        }
    }

    #[test]
    fn too_large_keeps_the_id_of_its_start() {
        let r = too_large(
            br#"{"jsonrpc":"2.0","id":5,"method":"x","params":"aaaa"#,
            1 << 30,
            64,
        );
        assert_eq!((r.code, r.id.clone()), (INVALID_REQUEST, json!(5)));
        // A number cut by the end of the head is not taken.
        assert_eq!(scan_id(br#"{"id":12"#), None);
        assert_eq!(
            r.response()["error"]["message"],
            "invalid request: the message is 1073741824 bytes, over the limit of 64 bytes; it was skipped unread"
        );
    }
}
