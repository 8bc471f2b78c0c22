#![no_main]
//! `emmc_frontend::fuzzing::model_toml` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| emmc_frontend::fuzzing::model_toml(data));
