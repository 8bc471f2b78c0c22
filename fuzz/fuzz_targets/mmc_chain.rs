#![no_main]
//! `emmc_frontend::fuzzing::mmc_chain` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| emmc_frontend::fuzzing::mmc_chain(data));
