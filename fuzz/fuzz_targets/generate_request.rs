//! Request validation on arbitrary protobuf bytes: never a panic; what is
//! accepted is within every rule and limit; refusals name the field.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tt_servingd::fuzzing::generate_request(data);
});
