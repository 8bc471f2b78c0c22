#![no_main]
//! `vhost_user_emmc::fuzzing::card_commands` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vhost_user_emmc::fuzzing::card_commands(data));
