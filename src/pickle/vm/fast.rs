//! The VM's fast paths: runs of simple opcodes after a memo reference, and frames lists whose
//! run of memo references the sink has seen before.

use super::{FAST_OPS_MAX, R, Vm, sink_error};
use crate::pickle::opcodes as op;
use crate::pickle::value::Val;

impl<'a> Vm<'a, '_> {
    /// After a memo reference: the simple opcodes that follow (more memo references — a frames
    /// list is dozens in a row —, small ints and strings, `MEMOIZE`), run in one loop without the
    /// main loop's bookkeeping; also the keys and scalar values of a trace entry. Stops before the first opcode it does not handle, or
    /// that would fail, and leaves that one to the main loop (which reports any error).
    #[inline]
    pub(super) fn fast_ops(&mut self) {
        let d = self.d;
        let mut p = self.p;
        for _ in 0..FAST_OPS_MAX {
            let Some(&op) = d.get(p) else { break };
            let arg = p + 1;
            let (v, next) = match op {
                op::BINGET | op::LONG_BINGET => {
                    let (idx, next) = if op == op::BINGET {
                        match d.get(arg) {
                            Some(&b) => (b as usize, arg + 1),
                            None => break,
                        }
                    } else {
                        match d.get(arg..arg + 4) {
                            Some(s) => (
                                u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize,
                                arg + 4,
                            ),
                            None => break,
                        }
                    };
                    match self.memo.get(idx) {
                        Some(&v) => (v, next),
                        None => break,
                    }
                }
                op::BININT1 => match d.get(arg) {
                    Some(&b) => (Val::small_int(b as i64).unwrap_or(Val::NONE), arg + 1),
                    None => break,
                },
                op::BININT2 => match d.get(arg..arg + 2) {
                    Some(s) => (
                        Val::small_int(u16::from_le_bytes([s[0], s[1]]) as i64)
                            .unwrap_or(Val::NONE),
                        arg + 2,
                    ),
                    None => break,
                },
                op::BININT => match d.get(arg..arg + 4) {
                    Some(s) => (
                        Val::small_int(i32::from_le_bytes([s[0], s[1], s[2], s[3]]) as i64)
                            .unwrap_or(Val::NONE),
                        arg + 4,
                    ),
                    None => break,
                },
                op::LONG1 => {
                    // LONG1 of 1..=7 bytes always fits an inline int. The length is copied out
                    // before it is checked: a guard on `Some(&n)` checks the input byte and then
                    // reads it again, and a mapped capture truncated in between (its page now
                    // zeros, `sigbus`) would give a length of 0 that was never checked.
                    let n = match d.get(arg).copied() {
                        Some(n) if (1..=7).contains(&n) => n as usize,
                        _ => break,
                    };
                    // One 8-byte load where the input goes on that far (a copy of `n` bytes
                    // then a load of 8 stalls on store forwarding), shifted so the int's top
                    // byte is the word's and its sign extends from there.
                    let raw = match d.get(arg + 1..arg + 9) {
                        Some(s) => {
                            u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
                        }
                        None => {
                            let Some(b) = d.get(arg + 1..arg + 1 + n) else {
                                break;
                            };
                            let mut buf = [0u8; 8];
                            buf[..n].copy_from_slice(b);
                            u64::from_le_bytes(buf)
                        }
                    };
                    let unused = 64 - 8 * n as u32;
                    let v = ((raw << unused) as i64) >> unused;
                    match Val::small_int(v) {
                        Some(v) => (v, arg + 1 + n),
                        None => break,
                    }
                }
                op::SHORT_BINUNICODE => {
                    let n = match d.get(arg) {
                        Some(&n) => n as usize,
                        None => break,
                    };
                    match d.get(arg + 1..arg + 1 + n) {
                        Some(b) if b.is_ascii() => match Val::inline_str(arg + 1, n) {
                            Some(v) => (v, arg + 1 + n),
                            None => break,
                        },
                        _ => break,
                    }
                }
                op::MEMOIZE => {
                    // MEMOIZE the top of the stack (not across a MARK).
                    match self.stack.last() {
                        Some(&v) if self.marks.last().is_none_or(|&m| m < self.stack.len()) => {
                            self.memo.push(v);
                            self.note_memo(v, self.memo.len() - 1);
                            p = arg;
                            continue;
                        }
                        _ => break,
                    }
                }
                _ => break,
            };
            if self.stack.len() >= self.limits.max_stack {
                break;
            }
            self.stack.push(v);
            p = next;
        }
        self.p = p;
    }

    /// At the first `BINGET` right after the `MARK` of a sunk list: offer the whole run up to
    /// its `APPENDS` to the sink ([`Sink::sequence_run`]); `true` when the sink took it.
    pub(super) fn skip_known_run(&mut self) -> R<bool> {
        let n = self.stack.len();
        if self.marks.last() != Some(&n) || n == 0 {
            return Ok(false);
        }
        let Some(seq) = self.stack[n - 1].sunk_list_seq() else {
            return Ok(false);
        };
        let (d, start) = (self.d, self.op_at);
        if let Some(sink) = self.sink.as_deref_mut() {
            // A run the sink knows, recognised by its bytes without scanning it.
            let known = sink
                .sequence_run_at(seq, &d[start..], self.memo_generation)
                .map_err(|m| sink_error(start, m))?;
            if let Some(len) = known {
                let q = start + len;
                if d.get(q) != Some(&op::APPENDS) {
                    return Err(sink_error(start, "a known run does not end here".into()));
                }
                self.marks.pop();
                (self.op_at, self.p) = (q, q + 1);
                return Ok(true);
            }
        }
        let (mut q, mut items) = (start, 0);
        while items < 1000 {
            match d.get(q) {
                Some(&op::BINGET) => q += 2,
                Some(&op::LONG_BINGET) => q += 5,
                _ => break,
            }
            items += 1;
        }
        // A batch of 1000 may be followed by more for the same list.
        if items >= 1000 || q >= d.len() || d[q] != op::APPENDS {
            return Ok(false);
        }
        let Some(sink) = self.sink.as_deref_mut() else {
            return Ok(false);
        };
        let taken = sink
            .sequence_run(seq, &d[start..q], self.memo_generation)
            .map_err(|m| sink_error(start, m))?;
        if taken {
            self.marks.pop();
            (self.op_at, self.p) = (q, q + 1);
        }
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use crate::pickle::opcodes as op;

    /// `LONG1` ints of every length the fast path takes, positive and negative, after a memo
    /// reference (where `fast_ops` reads them), the last one too near the end for a whole word.
    #[test]
    fn long1_after_a_memo_reference_decodes_as_python_does() {
        let mut want: Vec<i64> = Vec::new();
        for n in 1..=7u32 {
            let top = 1i64 << (8 * n - 1);
            want.extend([top - 1, -top, -1, 0, 255 % top, -(top / 3) - 7]);
        }
        // Last, one byte: with `APPENDS` and `STOP` after it, fewer than 8 bytes follow its
        // length, so it is read by the copy, not the word load.
        want.push(-2);
        let mut b = vec![op::PROTO, 4, op::EMPTY_LIST, op::MEMOIZE, op::MARK];
        b.extend([op::SHORT_BINUNICODE, 1, b'k', op::MEMOIZE]);
        for &v in &want {
            // The shortest two's-complement form Python's pickle writes.
            let mut n = 1;
            while n < 8 && !(-(1i64 << (8 * n - 1))..(1i64 << (8 * n - 1))).contains(&v) {
                n += 1;
            }
            b.extend([op::BINGET, 1, op::LONG1, n as u8]);
            b.extend_from_slice(&v.to_le_bytes()[..n]);
        }
        b.extend([op::APPENDS, op::STOP]);
        let t = crate::pickle::decode(&b).unwrap();
        // The list: the key string left on the stack, then (key, int) pairs.
        let got: Vec<i64> = t.items(t.root)[1..]
            .chunks(2)
            .map(|p| {
                t.int(p[1])
                    .unwrap_or_else(|| panic!("{}", t.describe(p[1])))
            })
            .collect();
        assert_eq!(got, want);
    }
}
