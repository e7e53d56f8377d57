use super::*;
use crate::client::Daemon;
use crate::logs::run as logs_run;

const BACKLOG: &str = "loading weights\n\
                       warning: slow disk\n\
                       [ttctl] ... 3 lines skipped (the reader fell behind) ...\n";

#[tokio::test]
async fn logs_prints_the_recent_lines_and_ends() {
    let daemon = fake();
    let seen = daemon.seen.clone();
    let h = serve(daemon);
    let (out, failure) = ttctl(&h.socket, &["logs", "qwen"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(out, BACKLOG);
    let (_, failure) = ttctl(&h.socket, &["logs", "qwen", "-n", "5"]).await;
    assert!(failure.is_none(), "{failure:?}");
    let asked: Vec<(String, u32, bool)> = seen
        .lock()
        .unwrap()
        .logs
        .iter()
        .map(|r| (r.slot.clone(), r.lines, r.follow))
        .collect();
    assert_eq!(
        asked,
        [("qwen".into(), 100, false), ("qwen".into(), 5, false)]
    );
}

#[tokio::test]
async fn logs_follow_runs_until_ctrl_c_and_exits_0() {
    let h = serve(fake());
    let mut daemon = Daemon::connect(&h.socket).await.unwrap();
    let args = LogsArgs {
        slot: "qwen".into(),
        lines: 100,
        follow: true,
    };
    let out = SharedOut::default();
    let mut writer = out.clone();
    let (ctrl_c, pressed) = tokio::sync::oneshot::channel::<()>();
    let following = logs_run(&mut daemon, &args, &mut writer, async {
        let _ = pressed.await;
        Ok(())
    });
    let operator = async {
        while out.0.lock().unwrap().len() < BACKLOG.len() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // The daemon keeps the stream open; only Ctrl-C ends it.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        ctrl_c.send(()).unwrap();
    };
    let (result, ()) = tokio::join!(following, operator);
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap(),
        BACKLOG
    );
}

#[tokio::test]
async fn logs_follow_ended_by_the_daemon_exits_3() {
    let daemon = fake();
    let seen = daemon.seen.clone();
    let h = serve(daemon);
    let (out, failure) = ttctl(&h.socket, &["logs", "stopping", "-f", "-n", "0"]).await;
    assert_eq!(out, BACKLOG);
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 3, "{failure:?}");
    assert!(
        failure
            .message()
            .contains("ended the log stream of slot stopping"),
        "{failure:?}"
    );
    let request = seen.lock().unwrap().logs[0].clone();
    assert_eq!((request.lines, request.follow), (0, true));
}

#[tokio::test]
async fn logs_of_an_unknown_slot_exits_1_naming_the_slots() {
    let h = serve(fake());
    let (_, failure) = ttctl(&h.socket, &["logs", "qwn", "--follow"]).await;
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (1, "no slot `qwn`; slots: qwen")
    );
}
