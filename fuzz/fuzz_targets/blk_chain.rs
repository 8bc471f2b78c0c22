#![no_main]
//! `emmc_frontend::fuzzing::blk_chain` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| emmc_frontend::fuzzing::blk_chain(data));
