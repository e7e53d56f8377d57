use tt_serving_proto::v1::SlotState;

use super::*;
use crate::status::Frames;

#[tokio::test]
async fn status_prints_the_tables() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["status"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert!(
        out.starts_with("tt-servingd 0.1.0 (pid 812, driver 2.0.0): fake\n"),
        "{out}"
    );
    assert!(out.contains("0000:01:00.0"), "{out}");
    assert!(out.contains("NAME  MODEL"), "{out}");
}

#[tokio::test]
async fn status_json_is_one_parseable_object() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["status", "--json"]).await;
    assert!(failure.is_none(), "{failure:?}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["daemon"]["pid"], 812);
    assert_eq!(status["cards"][0]["state"], "ready");
    assert_eq!(status["slots"][0]["state"], "ready");
}

#[tokio::test]
async fn watch_prints_every_snapshot_separated_by_a_blank_line() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["status", "--watch"]).await;
    // The fake ends the stream like a stopping daemon: exit 3.
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 3, "{failure:?}");
    assert!(
        failure.message().contains("ended the status stream"),
        "{failure:?}"
    );
    let frames: Vec<&str> = out.split("\n\ntt-servingd").collect();
    assert_eq!(frames.len(), 2, "{out}");
    assert!(frames[0].contains("loading"), "{out}");
    assert!(frames[1].contains("ready"), "{out}");
    assert!(!out.contains('\x1b'), "no escape codes when not a terminal");
}

#[tokio::test]
async fn watch_json_prints_one_object_per_line() {
    let h = serve(fake());
    let (out, _) = ttctl(&h.socket, &["status", "--watch", "--json"]).await;
    let states: Vec<String> = out
        .lines()
        .map(|line| {
            let status: serde_json::Value = serde_json::from_str(line).unwrap();
            status["slots"][0]["state"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(states, ["loading", "ready"]);
}

#[test]
fn watch_on_a_terminal_redraws_in_place() {
    let mut frames = Frames::new(false, true);
    let first = frames
        .next(&snapshot(SlotState::Loading), 0)
        .unwrap()
        .unwrap();
    assert!(first.starts_with("\x1b[H\x1b[2Jtt-servingd"), "{first:?}");
    let second = frames
        .next(&snapshot(SlotState::Ready), 0)
        .unwrap()
        .unwrap();
    assert!(second.starts_with("\x1b[H\x1b[2Jtt-servingd"), "{second:?}");
}

#[test]
fn watch_skips_snapshots_that_print_the_same() {
    let mut frames = Frames::new(false, false);
    let mut ticked = snapshot(SlotState::Ready);
    ticked.cards[0].heartbeat = 5;
    ticked.cards[0].heartbeat_ok = true;
    assert!(frames.next(&ticked, 0).unwrap().is_some());
    // A heartbeat tick is a change to the daemon but not to the table.
    ticked.cards[0].heartbeat += 1;
    assert_eq!(frames.next(&ticked, 0).unwrap(), None);
    ticked.slots[0].state = SlotState::Failed as i32;
    let text = frames.next(&ticked, 0).unwrap().unwrap();
    assert!(text.starts_with("\ntt-servingd"), "{text:?}");

    // JSON shows the counter, so the tick is a line of its own.
    let mut lines = Frames::new(true, false);
    assert!(lines.next(&ticked, 0).unwrap().is_some());
    assert_eq!(lines.next(&ticked, 0).unwrap(), None);
    ticked.cards[0].heartbeat += 1;
    assert!(lines.next(&ticked, 0).unwrap().is_some());
}

#[tokio::test]
async fn daemon_dying_mid_watch_is_a_lost_connection() {
    // ttctl reaches the fake through a proxy; killing the proxy cuts the
    // connection the way a crashing daemon does.
    let dir = tempfile::tempdir().unwrap();
    let daemon_socket = dir.path().join("daemon.sock");
    serve_at(
        FakeDaemon {
            snapshots: vec![snapshot(SlotState::Ready)],
            hang_after_watch: true,
            ..fake()
        },
        &daemon_socket,
    );
    let front = dir.path().join("control.sock");
    let listener = tokio::net::UnixListener::bind(&front).unwrap();
    let proxy = tokio::spawn(async move {
        let (mut client, _) = listener.accept().await.unwrap();
        let mut daemon = tokio::net::UnixStream::connect(daemon_socket)
            .await
            .unwrap();
        let _ = tokio::io::copy_bidirectional(&mut client, &mut daemon).await;
    });

    let out = SharedOut::default();
    let mut writer = out.clone();
    let mut err = io::sink();
    let watching = execute(
        cli(&front, &["status", "--watch"]),
        &mut writer,
        &mut err,
        false,
    );
    let killer = async {
        while out.0.lock().unwrap().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        proxy.abort();
    };
    let (result, ()) = tokio::join!(watching, killer);
    let failure = result.unwrap_err();
    assert_eq!(failure.exit_code(), 3, "{failure:?}");
    assert!(
        failure
            .message()
            .contains("lost the connection to tt-servingd"),
        "{failure:?}"
    );
}
