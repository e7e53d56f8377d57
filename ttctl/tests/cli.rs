//! ttctl's command line as a process. (Also makes `cargo test --workspace`
//! build `ttctl`, which the cross-process tests in `tests/` run.)

use std::process::Command;

#[test]
fn bad_arguments_exit_2_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_ttctl"))
        .args(["card", "reset"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}

#[test]
fn an_absent_daemon_is_exit_3_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    let out = Command::new(env!("CARGO_BIN_EXE_ttctl"))
        .arg("--socket")
        .arg(&socket)
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&socket.display().to_string()), "{err}");
}
