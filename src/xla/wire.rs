//! A tiny protobuf wire walker with absolute byte offsets.
//!
//! prost's `DecodeError` carries no offset, and decoding every `XEvent` of a large capture into
//! owned structs costs ~6× the file in memory. The hot path (lines, events, stats) and the framing
//! check therefore walk the wire format directly over borrowed bytes; prost decodes only the small
//! metadata messages.

/// Where and why the wire format broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError {
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// The bytes end inside a field (file still being written, or cut).
    pub truncated: bool,
    pub what: String,
}

/// One field value as it appears on the wire.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    /// Length-delimited payload and its absolute offset.
    Len(&'a [u8], u64),
}

impl<'a> Value<'a> {
    pub fn as_u64(self) -> u64 {
        match self {
            Value::Varint(v) | Value::Fixed64(v) => v,
            Value::Fixed32(v) => v as u64,
            Value::Len(..) => 0,
        }
    }
    pub fn as_i64(self) -> i64 {
        self.as_u64() as i64
    }
    pub fn bytes(self) -> &'a [u8] {
        match self {
            Value::Len(b, _) => b,
            _ => &[],
        }
    }
    pub fn str(self) -> &'a str {
        std::str::from_utf8(self.bytes()).unwrap_or("")
    }
}

/// Walks the fields of one message held in `buf`, which starts at absolute offset `base`.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: u64,
    /// True when `buf` reaches the end of the file: running past it means truncation.
    at_file_end: bool,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], base: u64) -> Self {
        Reader {
            buf,
            pos: 0,
            base,
            at_file_end: false,
        }
    }

    /// A reader over a whole file (or the tail of one): overruns are reported as truncation.
    pub fn file(buf: &'a [u8]) -> Self {
        Reader {
            at_file_end: true,
            ..Reader::new(buf, 0)
        }
    }

    #[cold]
    fn err(&self, at: usize, truncated: bool, what: impl Into<String>) -> WireError {
        WireError {
            offset: self.base + at as u64,
            truncated: truncated && self.at_file_end,
            what: what.into(),
        }
    }

    #[inline(always)]
    fn varint(&mut self, field_start: usize) -> Result<u64, WireError> {
        // Fast path: most keys, ids and lengths fit in one byte.
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(b as u64);
            }
        }
        self.varint_slow(field_start)
    }

    #[inline(never)]
    fn varint_slow(&mut self, field_start: usize) -> Result<u64, WireError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.err(field_start, true, "file ends inside a varint"));
            };
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(self.err(field_start, false, "varint longer than 10 bytes"))
    }

    /// Next `(field number, value)`, or `None` at the end of the message.
    #[allow(clippy::should_implement_trait)]
    #[inline(always)]
    pub fn next(&mut self) -> Result<Option<(u32, Value<'a>)>, WireError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let start = self.pos;
        let key = self.varint(start)?;
        let field = (key >> 3) as u32;
        if field == 0 || key >> 3 > u32::MAX as u64 {
            return Err(self.bad_key(start, key));
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint(start)?),
            2 => {
                let len = self.varint(start)?;
                let remaining = (self.buf.len() - self.pos) as u64;
                if len > remaining {
                    return Err(self.overrun(start, field, len, remaining));
                }
                let off = self.base + self.pos as u64;
                let end = self.pos + len as usize;
                let b = &self.buf[self.pos..end];
                self.pos = end;
                Value::Len(b, off)
            }
            1 => {
                let end = self.pos + 8;
                let Some(b) = self.buf.get(self.pos..end) else {
                    return Err(self.err(start, true, "file ends inside a fixed64 field"));
                };
                self.pos = end;
                Value::Fixed64(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            }
            5 => {
                let end = self.pos + 4;
                let Some(b) = self.buf.get(self.pos..end) else {
                    return Err(self.err(start, true, "file ends inside a fixed32 field"));
                };
                self.pos = end;
                Value::Fixed32(u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
            }
            w => return Err(self.err(start, false, format!("unsupported wire type {w}"))),
        };
        Ok(Some((field, value)))
    }

    #[cold]
    fn bad_key(&self, at: usize, key: u64) -> WireError {
        self.err(at, false, format!("invalid field key {key}"))
    }

    #[cold]
    fn overrun(&self, at: usize, field: u32, len: u64, remaining: u64) -> WireError {
        self.err(
            at,
            true,
            format!("field {field} claims {len} bytes but only {remaining} remain"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_fields_and_reports_truncation_offset() {
        // field 1 varint 150, field 2 "hi"
        let msg = [0x08, 0x96, 0x01, 0x12, 0x02, b'h', b'i'];
        let mut r = Reader::file(&msg);
        let (f, v) = r.next().unwrap().unwrap();
        assert_eq!((f, v.as_u64()), (1, 150));
        let (f, v) = r.next().unwrap().unwrap();
        assert_eq!((f, v.str()), (2, "hi"));
        assert!(r.next().unwrap().is_none());

        let cut = &msg[..6];
        let mut r = Reader::file(cut);
        r.next().unwrap();
        let e = r.next().unwrap_err();
        assert_eq!(e.offset, 3);
        assert!(e.truncated);
    }

    #[test]
    fn overrun_inside_a_message_is_corruption_not_truncation() {
        let msg = [0x12, 0x05, b'h'];
        let mut r = Reader::new(&msg, 100);
        let e = r.next().unwrap_err();
        assert_eq!(e.offset, 100);
        assert!(!e.truncated);
    }
}
