#![no_main]
//! `vhost_user_emmc::fuzzing::blk_chain` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vhost_user_emmc::fuzzing::blk_chain(data));
