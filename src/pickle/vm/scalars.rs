//! Constant, number, string and bytes opcodes: values pushed on the stack (inline when they fit
//! a [`Val`], arena nodes pointing into the input otherwise).

use super::{PickleErrorKind, R, Vm};
use crate::pickle::opcodes as op;
use crate::pickle::value::{Node, Val};

impl<'a> Vm<'a, '_> {
    /// `NONE` … `BYTEARRAY8`: push one value.
    #[inline(always)]
    pub(super) fn scalar_op(&mut self, op: u8) -> R<()> {
        use PickleErrorKind::*;
        match op {
            op::NONE => self.push(Val::NONE)?,
            op::NEWTRUE => self.push(Val::TRUE)?,
            op::NEWFALSE => self.push(Val::FALSE)?,
            op::BININT1 => {
                let b = self.byte()?;
                self.push(Val::small_int(b as i64).unwrap_or(Val::NONE))?;
            }
            op::BININT2 => {
                let v = self.u16()?;
                self.push(Val::small_int(v as i64).unwrap_or(Val::NONE))?;
            }
            op::BININT => {
                let v = self.u32()? as i32 as i64;
                self.push(Val::small_int(v).unwrap_or(Val::NONE))?;
            }
            op::LONG1 => {
                let n = self.byte()? as usize;
                let b = self.take(n)?;
                let v = self.new_long(b)?;
                self.push(v)?;
            }
            op::LONG4 => {
                let n = self.u32()? as i32;
                if n < 0 {
                    return Err(self.err(Invalid, "LONG4 with a negative length"));
                }
                let n = self.len_of(n as u64)?;
                let b = self.take(n)?;
                let v = self.new_long(b)?;
                self.push(v)?;
            }
            op::BINFLOAT => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                let v = self.new_node(Node::Float(f64::from_be_bytes(a)))?;
                self.push(v)?;
            }
            // ---- strings and bytes ----
            op::SHORT_BINUNICODE => {
                let n = self.byte()? as usize;
                let b = self.take(n)?;
                let v = self.new_str(b)?;
                self.push(v)?;
            }
            op::BINUNICODE => {
                let n = self.u32()? as u64;
                let n = self.len_of(n)?;
                let b = self.take(n)?;
                let v = self.new_str(b)?;
                self.push(v)?;
            }
            op::BINUNICODE8 => {
                let n = self.u64()?;
                let n = self.len_of(n)?;
                let b = self.take(n)?;
                let v = self.new_str(b)?;
                self.push(v)?;
            }
            op::BINSTRING => {
                let n = self.u32()? as i32;
                if n < 0 {
                    return Err(self.err(Invalid, "BINSTRING with a negative length"));
                }
                let n = self.len_of(n as u64)?;
                let b = self.take(n)?;
                let v = self.text_str(b)?;
                self.push(v)?;
            }
            op::SHORT_BINSTRING => {
                let n = self.byte()? as usize;
                let b = self.take(n)?;
                let v = self.text_str(b)?;
                self.push(v)?;
            }
            op::BINBYTES => {
                let n = self.u32()? as u64;
                let n = self.len_of(n)?;
                let b = self.take(n)?;
                let v = self.new_bytes(b)?;
                self.push(v)?;
            }
            op::SHORT_BINBYTES => {
                let n = self.byte()? as usize;
                let b = self.take(n)?;
                let v = self.new_bytes(b)?;
                self.push(v)?;
            }
            op::BINBYTES8 | op::BYTEARRAY8 => {
                let n = self.u64()?;
                let n = self.len_of(n)?;
                let b = self.take(n)?;
                let v = self.new_bytes(b)?;
                self.push(v)?;
            }
            _ => unreachable!("scalar_op called with opcode 0x{op:02x}"),
        }
        Ok(())
    }

    pub(super) fn new_str(&mut self, bytes: &'a [u8]) -> R<Val> {
        let start = bytes.as_ptr() as usize - self.d.as_ptr() as usize;
        if bytes.is_ascii() || std::str::from_utf8(bytes).is_ok() {
            if let Some(v) = Val::inline_str(start, bytes.len()) {
                return Ok(v);
            }
        }
        let len = u32::try_from(bytes.len())
            .map_err(|_| self.err(PickleErrorKind::Limit, "string longer than 4 GiB"))?;
        let (lo, hi) = crate::pickle::value::join_offset(start)
            .ok_or_else(|| self.err(PickleErrorKind::Limit, "input larger than 256 TiB"))?;
        let node = match std::str::from_utf8(bytes) {
            Ok(_) => Node::Str { lo, hi, len },
            // CPython writes lone surrogates with 'surrogatepass'; keep the text, lossy.
            Err(_) => Node::OwnedStr(Box::new(String::from_utf8_lossy(bytes).into_owned())),
        };
        self.new_node(node)
    }

    pub(super) fn new_bytes(&mut self, bytes: &'a [u8]) -> R<Val> {
        let start = bytes.as_ptr() as usize - self.d.as_ptr() as usize;
        let len = u32::try_from(bytes.len())
            .map_err(|_| self.err(PickleErrorKind::Limit, "bytes longer than 4 GiB"))?;
        let (lo, hi) = crate::pickle::value::join_offset(start)
            .ok_or_else(|| self.err(PickleErrorKind::Limit, "input larger than 256 TiB"))?;
        self.new_node(Node::Bytes { lo, hi, len })
    }

    pub(super) fn new_long(&mut self, bytes: &[u8]) -> R<Val> {
        // Fast path: fits in an inline int.
        if bytes.len() <= 8 {
            let mut v: i64 = 0;
            for (i, &b) in bytes.iter().enumerate() {
                v |= (b as i64) << (8 * i);
            }
            if !bytes.is_empty() && bytes.len() < 8 && bytes[bytes.len() - 1] & 0x80 != 0 {
                v -= 1i64 << (8 * bytes.len());
            }
            if let Some(val) = Val::small_int(v) {
                return Ok(val);
            }
        }
        self.new_node(Node::BigInt(Box::new(bytes.to_vec())))
    }

    pub(super) fn int_val(&mut self, v: i64) -> R<Val> {
        match Val::small_int(v) {
            Some(val) => Ok(val),
            None => self.new_node(Node::BigInt(Box::new(v.to_le_bytes().to_vec()))),
        }
    }

    pub(super) fn text_str(&mut self, s: &'a [u8]) -> R<Val> {
        match std::str::from_utf8(s) {
            Ok(_) => self.new_str(s),
            Err(_) => self.new_node(Node::OwnedStr(Box::new(
                String::from_utf8_lossy(s).into_owned(),
            ))),
        }
    }
}
