#![no_main]
//! `emmc_frontend::fuzzing::packed_header` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| emmc_frontend::fuzzing::packed_header(data));
