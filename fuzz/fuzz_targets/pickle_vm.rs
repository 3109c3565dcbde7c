//! The pickle VM on arbitrary bytes: decode, then walk everything the tree exposes.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../harness.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    harness::pickle_vm(data);
});
