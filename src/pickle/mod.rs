//! A safe pickle VM: decodes data, never executes anything.
//!
//! `serde-pickle` cannot read real snapshots (shared objects inside shared objects make it fail
//! with `Recursive` or silently insert `None`; `../shared/docs/CRATES.md` §5). This VM keeps one
//! arena node per object and a memo of node ids, so sharing is preserved and nothing is cloned.
//! Code opcodes (`GLOBAL`, `REDUCE`, `BUILD`, …) become inert records; see [`vm`].

pub mod json;
pub mod opcodes;
pub mod sink;
pub mod value;
pub mod vm;

pub use value::{Kind, Tree, Val, bigint_to_i128};
pub use vm::{Limits, PickleError, PickleErrorKind, Sink, decode, decode_streaming, decode_with};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_dicts_inside_shared_lists_stay_shared() {
        // f={'line':1}; L=[f,f]; pickle.dumps([L,L], protocol=4) — the shape serde-pickle breaks on.
        let data = b"\x80\x04\x95\x19\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94(}\x94\x8c\x04line\x94K\x01sh\x02eh\x01e.";
        let t = decode(data).unwrap();
        let outer = t.items(t.root);
        assert_eq!(outer.len(), 2);
        assert_eq!(outer[0], outer[1], "the inner list is one object");
        let inner = t.items(outer[0]);
        assert_eq!(inner.len(), 2);
        assert_eq!(inner[0], inner[1], "the frame dict is one object");
        assert_eq!(t.int(t.get(inner[0], "line").unwrap()), Some(1));
        assert_eq!(t.protocol, Some(4));
    }

    #[test]
    fn scalars_after_a_memo_reference_decode_like_anywhere_else() {
        // k='key'; [k, v0, k, v1, k, …] for ints of every width, strings, None, bools, a float:
        // each value follows a BINGET, the VM's fast path.
        let data = b"\x80\x04\x95\xae\x00\x00\x00\x00\x00\x00\x00]\x94(\x8c\x03key\x94K\x01h\x01K\xffh\x01M\x00\x01h\x01M\xff\xffh\x01J\x00\x00\x01\x00h\x01J\xff\xff\xff\xffh\x01J\x7f\xff\xff\xffh\x01J\xff\xff\xff\x7fh\x01J\x00\x00\x00\x80h\x01\x8a\x06\x00\x00\x00\x00\x00\x01h\x01\x8a\x06\x00\x00\x00\x00\x00\xffh\x01\x8a\x07\xff\xff\xff\xff\xff\xff\x7fh\x01\x8a\x07\x00\x00\x00\x00\x00\x00\x80h\x01\x8a\x08\x00\x00\x00\x00\x00\x00\x00@h\x01\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00\x01h\x01\x8c\x03abc\x94h\x01\x8c\x02\xc3\xa9\x94h\x01\x8c\x03N/A\x94h\x01Nh\x01\x88h\x01\x89h\x01G@\x0c\x00\x00\x00\x00\x00\x00h\x01e.";
        let t = decode(data).unwrap();
        let items = t.items(t.root);
        assert_eq!(items.len(), 45);
        let vals: Vec<Val> = items.iter().skip(1).step_by(2).copied().collect();
        let ints: Vec<Option<i128>> = vals[..15].iter().map(|&v| t.int128(v)).collect();
        let want: Vec<i128> = vec![
            1,
            255,
            256,
            65535,
            65536,
            -1,
            -129,
            (1 << 31) - 1,
            -(1 << 31),
            1 << 40,
            -(1 << 40),
            (1 << 55) - 1,
            -(1 << 55),
            1 << 62,
            1 << 64,
        ];
        assert_eq!(ints, want.into_iter().map(Some).collect::<Vec<_>>());
        assert_eq!(t.str(vals[15]), Some("abc"));
        assert_eq!(t.str(vals[16]), Some("é"));
        assert_eq!(t.str(vals[17]), Some("N/A"));
        assert_eq!(t.kind(vals[18]), Kind::None);
        assert_eq!(
            (t.bool(vals[19]), t.bool(vals[20])),
            (Some(true), Some(false))
        );
        assert_eq!(t.float(vals[21]), Some(3.5));
        assert!(
            items.iter().step_by(2).all(|&k| k == items[0]),
            "every key is one object"
        );
        // Cut short anywhere inside the fast path: an error with an offset, never a panic.
        for cut in 14..data.len() - 1 {
            let e = decode(&data[..cut]).unwrap_err();
            assert!(e.offset as usize <= cut, "{cut}: {e}");
        }
    }

    #[test]
    fn big_ints_and_negative_ints_decode() {
        // pickle.dumps([2**64-1, -1, 2**100], protocol=2)
        let data = b"\x80\x02]q\x00(\x8a\t\xff\xff\xff\xff\xff\xff\xff\xff\x00J\xff\xff\xff\xff\x8a\r\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10e.";
        let t = decode(data).unwrap();
        let items = t.items(t.root);
        assert_eq!(t.uint(items[0]), Some(u64::MAX));
        assert_eq!(t.int(items[1]), Some(-1));
        assert_eq!(t.int128(items[2]), Some(1i128 << 100));
    }

    #[test]
    fn code_is_recorded_never_run() {
        // Protocol 0: os.system('touch MARKER')
        let data = b"cos\nsystem\n(S'touch MARKER'\ntR.";
        let t = decode(data).unwrap();
        assert_eq!(t.describe(t.root), "a call to os.system");
    }

    #[test]
    fn truncation_and_empty_input_are_reported_with_offsets() {
        let e = decode(b"").unwrap_err();
        assert_eq!(e.kind, PickleErrorKind::Truncated);
        assert_eq!(e.offset, 0);
        let e = decode(b"\x80\x04]\x94(K\x01K\x02").unwrap_err();
        assert_eq!(e.kind, PickleErrorKind::Truncated);
        // A 2^62 length allocates nothing and names the opcode's offset.
        let e = decode(b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x40abc").unwrap_err();
        assert_eq!(e.offset, 2);
        assert!(e.message.contains("4611686018427387904"), "{}", e.message);
    }

    #[test]
    fn deep_nesting_hits_the_limit() {
        let mut data = vec![0x80, 4];
        data.extend(std::iter::repeat_n(b']', 1_000_000));
        data.extend(std::iter::repeat_n(b'a', 999_999));
        data.push(b'.');
        let e = decode(&data).unwrap_err();
        assert_eq!(e.kind, PickleErrorKind::Limit);
        assert!(e.message.contains("nested"), "{}", e.message);
    }

    #[test]
    fn refused_opcodes_say_why() {
        let e = decode(b"\x80\x02P1\n.").unwrap_err();
        assert_eq!(e.kind, PickleErrorKind::Refused);
        let e = decode(b"\x80\x05\x97.").unwrap_err();
        assert_eq!(e.kind, PickleErrorKind::Refused);
    }

    #[test]
    fn dict_with_repeated_setitem_keeps_python_semantics() {
        // {'a': 1} then SETITEM 'a' = 2 and 'b' = 3
        let data = b"\x80\x04}\x94(\x8c\x01a\x94K\x01u\x8c\x01aK\x02s\x8c\x01bK\x03s.";
        let t = decode(data).unwrap();
        assert_eq!(t.len(t.root), 2);
        assert_eq!(t.int(t.get(t.root, "a").unwrap()), Some(2));
        assert_eq!(t.int(t.get(t.root, "b").unwrap()), Some(3));
    }

    #[test]
    fn a_dict_grown_by_100k_setitems_stays_linear() {
        // {} then 100,000 × (BININT i, BININT1 1, SETITEM), then key 7 again: quadratic before the
        // key index (minutes), milliseconds now.
        let mut data = vec![0x80, 4, b'}'];
        for i in 0..100_000u32 {
            data.push(b'J');
            data.extend_from_slice(&i.to_le_bytes());
            data.extend_from_slice(b"K\x01s");
        }
        data.extend_from_slice(b"J\x07\x00\x00\x00K\x09s.");
        let start = std::time::Instant::now();
        let t = decode(&data).unwrap();
        assert_eq!(t.len(t.root), 100_000);
        let seven = t.pairs(t.root).find(|(k, _)| t.int(*k) == Some(7)).unwrap();
        assert_eq!(t.int(seven.1), Some(9), "an equal key replaces the value");
        assert!(start.elapsed().as_secs() < 5, "{:?}", start.elapsed());
    }

    #[test]
    fn text_longs_that_fit_are_inline_ints() {
        // [2**40, 2**70, -2**40] at protocols 1 and 0: LONG opcodes, as those protocols write
        // every address; only 2**70 needs a node.
        for data in [
            &b"]q\x00(L1099511627776L\nL1180591620717411303424L\nL-1099511627776L\ne."[..],
            &b"(lp0\nL1099511627776L\naL1180591620717411303424L\naL-1099511627776L\na."[..],
        ] {
            let t = decode(data).unwrap();
            let items = t.items(t.root);
            assert_eq!(t.kind(items[0]), Kind::Int(1 << 40));
            assert_eq!(t.kind(items[2]), Kind::Int(-(1 << 40)));
            assert_eq!(t.int128(items[1]), Some(1 << 70));
            assert_eq!(t.node_count(), 2, "the list and 2**70");
        }
    }

    #[test]
    fn many_streamed_lists_stay_linear() {
        struct Count(usize);
        impl Sink for Count {
            fn key(&self) -> &str {
                "device_traces"
            }
            fn entry(&mut self, _: &Tree<'_>, _: u32, _: &[Val]) -> Result<(), String> {
                self.0 += 1;
                Ok(())
            }
        }
        // {'device_traces': [[{'a': 1}], [{'a': 1}], … 50,000 lists]}
        let mut data = b"\x80\x04}\x8c\x0ddevice_traces](".to_vec();
        for _ in 0..50_000 {
            data.extend_from_slice(b"](}(\x8c\x01aK\x01ue");
        }
        data.extend_from_slice(b"es.");
        let mut sink = Count(0);
        let start = std::time::Instant::now();
        let t = decode_streaming(&data, &Limits::default(), Some(&mut sink)).unwrap();
        assert_eq!(sink.0, 50_000);
        assert_eq!(t.len(t.get(t.root, "device_traces").unwrap()), 50_000);
        assert!(start.elapsed().as_secs() < 5, "{:?}", start.elapsed());
    }

    #[test]
    fn an_entry_dict_referenced_again_is_an_error_and_an_empty_one_reads_twice() {
        // z={}; e={'a': 1}; {'device_traces': [[z, e, z]]}: z is never filled, so it is an
        // empty entry both times.
        let data = b"\x80\x04\x95(\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94(}\x94}\x94\x8c\x01a\x94K\x01sh\x04eas.";
        let mut sink = Seqs::default();
        decode_streaming(data, &Limits::default(), Some(&mut sink)).unwrap();
        let keys: Vec<usize> = sink.entries.iter().map(Vec::len).collect();
        assert_eq!(keys, vec![0, 1, 0], "in the list's order");
        // e={'a': 1}; {'device_traces': [[e, {'b': 2}, e]]}: e was read when it was filled, and
        // its content is gone: an error at the memo reference, never an empty entry.
        let data = b"\x80\x04\x95/\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94(}\x94\x8c\x01a\x94K\x01s}\x94\x8c\x01b\x94K\x02sh\x04eas.";
        let mut sink = Seqs::default();
        let err = decode_streaming(data, &Limits::default(), Some(&mut sink)).unwrap_err();
        assert_eq!(err.kind, PickleErrorKind::Invalid);
        assert!(
            err.to_string()
                .contains("the same dict object as an earlier item"),
            "{err}"
        );
    }

    /// Records what a sink sees: entries as (key, sequence number), the batches it was given,
    /// the dicts of sunk lists (their keys) and the numbers of the dicts in each batch.
    #[derive(Default)]
    struct Seqs {
        entries: Vec<Vec<(String, Option<u32>)>>,
        batches: Vec<(u32, usize)>,
        next: u32,
        dicts: Vec<Vec<String>>,
        items: Vec<Vec<Option<u32>>>,
    }
    impl Sink for Seqs {
        fn key(&self) -> &str {
            "device_traces"
        }
        fn entry(&mut self, t: &Tree<'_>, _: u32, pairs: &[Val]) -> Result<(), String> {
            let e = pairs
                .chunks_exact(2)
                .map(|p| (t.str(p[0]).unwrap_or("?").to_string(), t.sunk(p[1])))
                .collect();
            self.entries.push(e);
            Ok(())
        }
        fn takes_sequences(&self) -> bool {
            true
        }
        fn new_sequence(&mut self) -> Result<u32, String> {
            self.next += 1;
            Ok(self.next - 1)
        }
        fn sequence(&mut self, t: &Tree<'_>, seq: u32, items: &[Val]) -> Result<(), String> {
            self.batches.push((seq, items.len()));
            self.items
                .push(items.iter().map(|&v| t.sunk_dict(v)).collect());
            Ok(())
        }
        fn sequence_dict(
            &mut self,
            t: &Tree<'_>,
            prev: Option<u32>,
            pairs: &[Val],
        ) -> Result<u32, String> {
            assert_eq!(prev, None);
            let keys = pairs.chunks_exact(2);
            self.dicts.push(
                keys.map(|p| t.str(p[0]).unwrap_or("?").to_string())
                    .collect(),
            );
            Ok(self.dicts.len() as u32 - 1)
        }
    }

    #[test]
    fn dicts_inside_sunk_lists_go_to_the_sink_and_keep_their_number() {
        // F={'a':1}; {'device_traces': [[{'f': [F, {}], 'g': [F], 'h': [{'b': 2}]}]], 'after': F}
        let data = b"\x80\x04\x95U\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\rdevice_traces\x94]\x94]\x94}\x94(\x8c\x01f\x94]\x94(}\x94\x8c\x01a\x94K\x01s}\x94e\x8c\x01g\x94]\x94h\x07a\x8c\x01h\x94]\x94}\x94\x8c\x01b\x94K\x02sauaa\x8c\x05after\x94h\x07u.";
        let mut sink = Seqs::default();
        let t = decode_streaming(data, &Limits::default(), Some(&mut sink)).unwrap();
        assert_eq!(
            sink.dicts,
            vec![vec!["a".to_string()], vec![], vec!["b".to_string()]],
            "F by its SETITEM, the empty dict when its list got it, {{'b': 2}}"
        );
        assert_eq!(
            sink.items,
            vec![vec![Some(0), Some(1)], vec![Some(0)], vec![Some(2)]],
            "F referenced again keeps its number"
        );
        let after = t.get(t.root, "after").unwrap();
        assert_eq!(t.sunk_dict(after), Some(0), "also outside the trace");
        assert_eq!(
            t.node_count(),
            3,
            "no node for the dicts: root, traces and trace list"
        );
    }

    #[test]
    fn lists_inside_streamed_dicts_go_to_the_sink_and_stay_shared() {
        // L=[1,2]; {'device_traces': [[{'f': L, 'g': []}, {'f': L}]]}, protocol 4
        let data = b"\x80\x04\x958\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\rdevice_traces\x94]\x94]\x94(}\x94(\x8c\x01f\x94]\x94(K\x01K\x02e\x8c\x01g\x94]\x94u}\x94h\x05h\x06seas.";
        let mut sink = Seqs::default();
        let t = decode_streaming(data, &Limits::default(), Some(&mut sink)).unwrap();
        assert_eq!(sink.batches, vec![(0, 2)], "the list is handed over once");
        let f = |e: &Vec<(String, Option<u32>)>, k: &str| {
            e.iter().find(|(key, _)| key == k).map(|(_, v)| *v)
        };
        assert_eq!(f(&sink.entries[0], "f"), Some(Some(0)));
        assert_eq!(
            f(&sink.entries[0], "g"),
            Some(Some(1)),
            "an empty list has a number too"
        );
        assert_eq!(
            f(&sink.entries[1], "f"),
            Some(Some(0)),
            "the shared list keeps its number"
        );
        assert_eq!(t.len(t.get(t.root, "device_traces").unwrap()), 1);
    }

    #[test]
    fn long_lists_inside_streamed_dicts_arrive_in_batches() {
        // {'device_traces': [[{'f': list(range(1500))}]]}: APPENDS batches of 1000 and 500.
        let mut data = b"\x80\x04}\x8c\rdevice_traces]](}(\x8c\x01f](".to_vec();
        for _ in 0..1000 {
            data.extend_from_slice(b"K\x01");
        }
        data.extend_from_slice(b"e(");
        for _ in 0..500 {
            data.extend_from_slice(b"K\x02");
        }
        data.extend_from_slice(b"eueas.");
        let mut sink = Seqs::default();
        decode_streaming(&data, &Limits::default(), Some(&mut sink)).unwrap();
        assert_eq!(sink.batches, vec![(0, 1000), (0, 500)]);
        assert_eq!(sink.entries[0][0].1, Some(0));
    }
}
