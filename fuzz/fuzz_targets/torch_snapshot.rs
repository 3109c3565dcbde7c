//! Snapshot bytes (pickle or JSON) → the `Snapshot` model → the PyTorch analyses.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    memlsp::fuzzing::torch_snapshot(data);
});
