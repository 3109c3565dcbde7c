//! The pickle VM on arbitrary bytes: decode, then walk everything the tree exposes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memlsp::pickle::{Limits, decode, decode_with};

fuzz_target!(|data: &[u8]| {
    if let Ok(tree) = decode(data) {
        // Touch every node through the public accessors (no recursion: the graph may be cyclic).
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![tree.root];
        while let Some(v) = stack.pop() {
            if !seen.insert(v) || seen.len() > 100_000 {
                continue;
            }
            let _ = tree.describe(v);
            let _ = (tree.str(v), tree.bytes(v), tree.int128(v), tree.float(v));
            stack.extend_from_slice(tree.items(v));
            for (k, x) in tree.pairs(v) {
                stack.push(k);
                stack.push(x);
            }
            if let Some((c, a, s)) = tree.call(v) {
                stack.extend([c, a, s]);
            }
        }
    }
    let strict = Limits {
        refuse_globals: true,
        max_depth: 16,
        ..Limits::default()
    };
    let _ = decode_with(data, &strict);
});
