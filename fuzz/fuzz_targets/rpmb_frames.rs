#![no_main]
//! `emmc_frontend::fuzzing::rpmb_frames` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| emmc_frontend::fuzzing::rpmb_frames(data));
