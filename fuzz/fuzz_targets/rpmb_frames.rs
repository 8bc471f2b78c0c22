#![no_main]
//! `vhost_user_emmc::fuzzing::rpmb_frames` under libFuzzer.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vhost_user_emmc::fuzzing::rpmb_frames(data));
