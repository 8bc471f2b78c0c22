#![no_main]
//! `emmc_frontend::fuzzing::card_commands` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| emmc_frontend::fuzzing::card_commands(data));
