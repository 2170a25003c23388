//! libFuzzer entry point: the same structured program as the stable runner
//! (`crates/nvme-fuzz`), with coverage feedback. A panic is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nvme_fuzz::run_one(data);
});
