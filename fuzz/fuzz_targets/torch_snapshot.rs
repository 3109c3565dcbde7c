//! Snapshot bytes (pickle or JSON) → the `Snapshot` model → the PyTorch analyses.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::torch_snapshot(data);
});
