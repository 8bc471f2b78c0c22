#![no_main]
//! `vhost_user_emmc::fuzzing::model_toml` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vhost_user_emmc::fuzzing::model_toml(data));
