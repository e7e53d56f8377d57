use super::*;

#[tokio::test]
async fn no_daemon_exits_3_with_how_to_start_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    let (_, failure) = ttctl(&socket, &["status"]).await;
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 3);
    assert!(
        failure
            .message()
            .starts_with("tt-servingd is not running: no control socket at "),
        "{failure:?}"
    );
    assert!(failure
        .message()
        .contains("systemctl start tenstorrent-serving"));
}

#[tokio::test]
async fn new_commands_without_a_daemon_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    for args in [
        &["generate", "qwen", "hi"][..],
        &["logs", "qwen", "-f"],
        &["slot", "restart", "qwen"],
        &["cache", "ls"],
        &["cache", "verify", "qwen"],
        &["cache", "rm", "x"],
        &["audit", "--since", "1h"],
    ] {
        let (_, failure) = ttctl(&socket, args).await;
        assert_eq!(failure.unwrap().exit_code(), 3, "{args:?}");
    }
}
