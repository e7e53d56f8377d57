//! The config parser and validator on arbitrary text: never a panic, every
//! refusal names a problem, accepted configs round-trip through TOML.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tt_servingd::fuzzing::config_text(data);
});
