//! The daemon's command line. (Also makes `cargo test --workspace` build
//! `tt-servingd`, which the cross-process tests in `tests/` run; ttctl's
//! tests do the same for `ttctl`.)

use std::process::Command;

#[test]
fn example_config_printed_by_the_binary_is_valid() {
    let out = Command::new(env!("CARGO_BIN_EXE_tt-servingd"))
        .arg("print-example-config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let config = tt_servingd::config::parse(&text).expect("example passes validation");
    assert!(!config.models.is_empty(), "the example shows a model table");
    for section in ["[daemon]", "[hardware]", "[reset]", "[models."] {
        assert!(text.contains(section), "example lacks {section}");
    }
}

#[test]
fn bad_arguments_exit_2_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_tt-servingd"))
        .arg("frobnicate")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}
