//! The opcodes a snapshot rarely or never uses: protocol-0 text forms, memo text forms, globals
//! and object construction (recorded as inert nodes, never executed), and refusals.

use super::{PickleError, PickleErrorKind, R, Vm};
use crate::pickle::opcodes as op;
use crate::pickle::value::{Node, Val};

impl<'a> Vm<'a, '_> {
    pub(super) fn refuse_code(&self, what: &str) -> PickleError {
        self.err(
            PickleErrorKind::Refused,
            format!("the pickle references code (`{what}`); memory snapshots contain only data, so the file is refused and nothing was imported or run"),
        )
    }

    /// `GLOBAL` / `INST` name code as text lines: refused when the limits refuse globals.
    fn refuse_text_global(&self, module: &[u8], name: &[u8]) -> R<()> {
        if !self.limits.refuse_globals {
            return Ok(());
        }
        let (m, n) = (
            String::from_utf8_lossy(module),
            String::from_utf8_lossy(name),
        );
        Err(self.refuse_code(&format!("{m}.{n}")))
    }

    /// The opcodes a snapshot rarely or never uses: protocol-0 text forms, memo text forms,
    /// globals and object construction (recorded as inert nodes, never executed), extensions,
    /// out-of-band buffers, and unknown opcodes.
    pub(super) fn rare_op(&mut self, op: u8) -> R<()> {
        use PickleErrorKind::*;
        match op {
            op::INT | op::LONG | op::FLOAT | op::UNICODE | op::STRING | op::PUT | op::GET => {
                self.text_op(op)?
            }
            op::GLOBAL
            | op::STACK_GLOBAL
            | op::REDUCE
            | op::NEWOBJ
            | op::NEWOBJ_EX
            | op::BUILD
            | op::INST
            | op::OBJ => self.code_op(op)?,
            op::PERSID | op::BINPERSID => {
                return Err(self.err(
                    Refused,
                    "persistent ids (PERSID) are not supported: this is not a memory snapshot",
                ));
            }
            op::EXT1..=op::EXT4 => {
                return Err(self.err(
                    Refused,
                    "extension-registry opcodes (EXT1/2/4) are not supported",
                ));
            }
            op::NEXT_BUFFER | op::READONLY_BUFFER => {
                return Err(self.err(
                    Refused,
                    "out-of-band buffers (pickle protocol 5 NEXT_BUFFER) are not supported",
                ));
            }
            _ => {
                return Err(self.err(Invalid, format!("unknown pickle opcode 0x{op:02x}")));
            }
        }
        Ok(())
    }

    /// Protocol-0 text forms of numbers, strings and memo indices (`INT`, `LONG`, `FLOAT`,
    /// `UNICODE`, `STRING`, `PUT`, `GET`).
    fn text_op(&mut self, op: u8) -> R<()> {
        use PickleErrorKind::*;
        match op {
            op::INT => {
                let line = self.line()?;
                let v = match line {
                    b"01" => Val::TRUE,
                    b"00" => Val::FALSE,
                    _ => {
                        let s = std::str::from_utf8(line)
                            .ok()
                            .and_then(|s| s.trim().parse::<i64>().ok());
                        match s {
                            Some(i) => self.int_val(i)?,
                            None => {
                                return Err(self.err(Invalid, "INT with a malformed number"));
                            }
                        }
                    }
                };
                self.push(v)?;
            }
            op::LONG => {
                let line = self.line()?;
                let text = std::str::from_utf8(line)
                    .unwrap_or("")
                    .trim()
                    .trim_end_matches('L');
                let v = match text.parse::<i128>() {
                    // Protocols 0 and 1 write every int past 2^31 this way (a CUDA address, a
                    // time in µs): inline when it fits, as LONG1 gets it.
                    Ok(i) if i64::try_from(i).is_ok() => self.int_val(i as i64)?,
                    Ok(i) => {
                        let bytes = i.to_le_bytes();
                        self.new_long(&bytes)?
                    }
                    Err(_) => {
                        return Err(
                            self.err(Invalid, "LONG with a malformed or over-128-bit number")
                        );
                    }
                };
                self.push(v)?;
            }
            op::FLOAT => {
                let line = self.line()?;
                let f = std::str::from_utf8(line)
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok());
                let Some(f) = f else {
                    return Err(self.err(Invalid, "FLOAT with a malformed number"));
                };
                let v = self.new_node(Node::Float(f))?;
                self.push(v)?;
            }
            op::UNICODE => {
                let line = self.line()?;
                let s = raw_unicode_unescape(line);
                let v = self.new_node(Node::OwnedStr(Box::new(s)))?;
                self.push(v)?;
            }
            op::STRING => {
                let line = self.line()?;
                let Some(s) = py_repr_unquote(line) else {
                    return Err(self.err(Invalid, "STRING argument is not a quoted string"));
                };
                let v = self.new_node(Node::OwnedStr(Box::new(
                    String::from_utf8_lossy(&s).into_owned(),
                )))?;
                self.push(v)?;
            }
            op::PUT => {
                let i = self.text_index("PUT")?;
                self.memo_put(i)?;
            }
            op::GET => {
                let i = self.text_index("GET")?;
                self.memo_get(i)?;
            }
            _ => unreachable!("text_op called with opcode 0x{op:02x}"),
        }
        Ok(())
    }

    /// Globals and object construction: recorded as inert [`Node::Global`] / [`Node::Call`]
    /// nodes (or refused with [`crate::pickle::Limits::refuse_globals`]), never imported or run.
    fn code_op(&mut self, op: u8) -> R<()> {
        use PickleErrorKind::*;
        match op {
            op::GLOBAL => {
                let module = self.line()?;
                let name = self.line()?;
                self.refuse_text_global(module, name)?;
                let m = self.text_str(module)?;
                let n = self.text_str(name)?;
                let v = self.new_node(Node::Global(Box::new((m, n))))?;
                self.push(v)?;
            }
            op::STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                if self.limits.refuse_globals {
                    let what = format!(
                        "{}.{}",
                        self.tree.str(module).unwrap_or("?"),
                        self.tree.str(name).unwrap_or("?")
                    );
                    return Err(self.refuse_code(&what));
                }
                let v = self.new_node(Node::Global(Box::new((module, name))))?;
                self.push(v)?;
            }
            op::REDUCE => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let v = self.record_call(callable, args, Val::NONE)?;
                self.push(v)?;
            }
            op::NEWOBJ => {
                let args = self.pop()?;
                let cls = self.pop()?;
                let v = self.record_call(cls, args, Val::NONE)?;
                self.push(v)?;
            }
            op::NEWOBJ_EX => {
                let kwargs = self.pop()?;
                let args = self.pop()?;
                let cls = self.pop()?;
                let both = self.tuple_of(&[args, kwargs])?;
                let v = self.record_call(cls, both, Val::NONE)?;
                self.push(v)?;
            }
            op::BUILD => {
                let state = self.pop()?;
                let obj = self.pop()?;
                let v = self.record_call(obj, Val::NONE, state)?;
                self.push(v)?;
            }
            op::INST => {
                let module = self.line()?;
                let name = self.line()?;
                self.refuse_text_global(module, name)?;
                let m = self.pop_mark()?;
                let args = self.tuple_from(m)?;
                let mv = self.text_str(module)?;
                let nv = self.text_str(name)?;
                let g = self.new_node(Node::Global(Box::new((mv, nv))))?;
                let v = self.record_call(g, args, Val::NONE)?;
                self.push(v)?;
            }
            op::OBJ => {
                let m = self.pop_mark()?;
                if self.stack.len() <= m {
                    return Err(self.err(Invalid, "OBJ without a class"));
                }
                let cls = self.stack[m];
                let args = self.tuple_from(m + 1)?;
                self.stack.truncate(m);
                let v = self.record_call(cls, args, Val::NONE)?;
                self.push(v)?;
            }
            _ => unreachable!("code_op called with opcode 0x{op:02x}"),
        }
        Ok(())
    }
}

/// Python `repr()` string literal (protocol 0 `STRING`) → bytes.
fn py_repr_unquote(line: &[u8]) -> Option<Vec<u8>> {
    let q = *line.first()?;
    if !(q == b'\'' || q == b'"') || line.len() < 2 || *line.last()? != q {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        if c != b'\\' || i + 1 >= body.len() {
            out.push(c);
            i += 1;
            continue;
        }
        let e = body[i + 1];
        i += 2;
        match e {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'0' => out.push(0),
            b'\\' | b'\'' | b'"' => out.push(e),
            b'x' if i + 2 <= body.len() => {
                let hex = std::str::from_utf8(&body[i..i + 2]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            _ => {
                out.push(b'\\');
                out.push(e);
            }
        }
    }
    Some(out)
}

/// `raw-unicode-escape` (protocol 0 `UNICODE`): `\uXXXX` and `\UXXXXXXXX` escapes, bytes as latin-1.
fn raw_unicode_unescape(line: &[u8]) -> String {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let c = line[i];
        if c == b'\\' && i + 1 < line.len() && (line[i + 1] == b'u' || line[i + 1] == b'U') {
            let n = if line[i + 1] == b'u' { 4 } else { 8 };
            if let Some(hex) = line.get(i + 2..i + 2 + n) {
                if let Some(ch) = std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(char::from_u32)
                {
                    out.push(ch);
                    i += 2 + n;
                    continue;
                }
            }
        }
        out.push(c as char);
        i += 1;
    }
    out
}
