//! The pickle VM on arbitrary bytes: decode, then walk everything the tree exposes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    memlsp::fuzzing::pickle_vm(data);
});
