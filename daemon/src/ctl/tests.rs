//! ttctl against a fake Control server on a real unix socket: the real
//! connector, real gRPC streams, and the exit code each outcome maps to.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use clap::Parser;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tt_serving_proto::v1::control_server::{Control, ControlServer};
use tt_serving_proto::v1::{
    Card, CardState, DaemonInfo, GenerateRequest, GenerateResponse, ListCacheRequest,
    ListCacheResponse, LogLine, LogsRequest, RemoveCacheRequest, RemoveCacheResponse,
    ResetCardRequest, ResetPhase, ResetProgress, Slot, SlotReply, SlotRequest, SlotState,
    StatusRequest, StatusResponse,
};

use super::*;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Answers from fixed data; card arguments pick the reset scenario.
struct FakeDaemon {
    /// What WatchStatus streams; it ends after these unless `hang_after_watch`.
    snapshots: Vec<StatusResponse>,
    /// Keep the watch stream open after the snapshots, like a live daemon.
    hang_after_watch: bool,
}

fn snapshot(slot_state: SlotState) -> StatusResponse {
    StatusResponse {
        daemon: Some(DaemonInfo {
            version: "0.1.0".into(),
            pid: 812,
            summary: "fake".into(),
            driver_version: "2.0.0".into(),
            ..Default::default()
        }),
        cards: vec![Card {
            bdf: "0000:01:00.0".into(),
            index: Some(0),
            card_type: "p150a".into(),
            state: CardState::Ready as i32,
            slot: "qwen".into(),
            ..Default::default()
        }],
        slots: vec![Slot {
            name: "qwen".into(),
            model: "qwen".into(),
            cards: vec!["0000:01:00.0".into()],
            state: slot_state as i32,
            ..Default::default()
        }],
    }
}

fn progress(bdf: &str, phase: ResetPhase, attempt: u32, message: &str) -> ResetProgress {
    ResetProgress {
        bdf: bdf.into(),
        phase: phase as i32,
        attempt,
        message: message.into(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Control for FakeDaemon {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(snapshot(SlotState::Ready)))
    }

    type WatchStatusStream = Boxed<StatusResponse>;

    async fn watch_status(
        &self,
        _: Request<StatusRequest>,
    ) -> Result<Response<Self::WatchStatusStream>, Status> {
        let sent = tokio_stream::iter(self.snapshots.clone().into_iter().map(Ok));
        if self.hang_after_watch {
            use tokio_stream::StreamExt;
            Ok(Response::new(Box::pin(sent.chain(tokio_stream::pending()))))
        } else {
            Ok(Response::new(Box::pin(sent)))
        }
    }

    type ResetCardStream = Boxed<ResetProgress>;

    async fn reset_card(
        &self,
        request: Request<ResetCardRequest>,
    ) -> Result<Response<Self::ResetCardStream>, Status> {
        let bdf = "0000:01:00.0";
        let steps = match request.into_inner().card.as_str() {
            "1" | "0000:01:00.0" => vec![
                progress(
                    bdf,
                    ResetPhase::RunningTtSmi,
                    1,
                    "running tt-smi -r 0000:01:00.0",
                ),
                progress(bdf, ResetPhase::WaitingForDevice, 1, ""),
                ResetProgress {
                    new_index: Some(3),
                    finished: true,
                    ok: true,
                    ..progress(bdf, ResetPhase::Done, 1, "back as /dev/tenstorrent/3")
                },
            ],
            "2" => vec![
                progress(
                    bdf,
                    ResetPhase::RunningTtSmi,
                    1,
                    "running tt-smi -r 0000:01:00.0",
                ),
                progress(bdf, ResetPhase::Retrying, 1, "heartbeat did not advance"),
                ResetProgress {
                    finished: true,
                    ok: false,
                    ..progress(
                        bdf,
                        ResetPhase::Failed,
                        2,
                        "heartbeat did not advance after 2 attempts",
                    )
                },
            ],
            "5" => {
                return Err(Status::failed_precondition(
                    "card 0000:05:00.0 is locked by pid 4242 (bench-sweep)",
                ))
            }
            "7" => vec![progress(bdf, ResetPhase::RunningTtSmi, 1, "")],
            other => return Err(Status::not_found(format!("no card {other}"))),
        };
        Ok(Response::new(Box::pin(tokio_stream::iter(
            steps.into_iter().map(Ok),
        ))))
    }

    // The commands ttctl does not have yet.

    async fn restart_slot(&self, _: Request<SlotRequest>) -> Result<Response<SlotReply>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    type LogsStream = Boxed<LogLine>;

    async fn logs(&self, _: Request<LogsRequest>) -> Result<Response<Self::LogsStream>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    type GenerateStream = Boxed<GenerateResponse>;

    async fn generate(
        &self,
        _: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn list_cache(
        &self,
        _: Request<ListCacheRequest>,
    ) -> Result<Response<ListCacheResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn remove_cache(
        &self,
        _: Request<RemoveCacheRequest>,
    ) -> Result<Response<RemoveCacheResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }
}

/// A fake daemon listening on a socket in a fresh temp dir.
struct Harness {
    /// Holds the socket's directory until the test ends.
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
}

fn serve(fake: FakeDaemon) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    serve_at(fake, &socket);
    Harness { _dir: dir, socket }
}

fn serve_at(fake: FakeDaemon, socket: &Path) {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ControlServer::new(fake))
            .serve_with_incoming(incoming),
    );
}

fn fake() -> FakeDaemon {
    FakeDaemon {
        snapshots: vec![snapshot(SlotState::Loading), snapshot(SlotState::Ready)],
        hang_after_watch: false,
    }
}

fn cli(socket: &Path, args: &[&str]) -> Cli {
    let mut argv = vec!["ttctl".to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv.push("--socket".into());
    argv.push(socket.display().to_string());
    Cli::try_parse_from(argv).unwrap()
}

/// Run ttctl; return stdout and the failure, if any.
async fn ttctl(socket: &Path, args: &[&str]) -> (String, Option<Failure>) {
    let mut out = Vec::new();
    let result = execute(cli(socket, args), &mut out, false).await;
    (String::from_utf8(out).unwrap(), result.err())
}

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
    let status: StatusJson = serde_json::from_str(&out).unwrap();
    assert_eq!(status.daemon.pid, 812);
    assert_eq!(status.cards[0].state, "ready");
    assert_eq!(status.slots[0].state, "ready");
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
            let status: StatusJson = serde_json::from_str(line).unwrap();
            status.slots[0].state.clone()
        })
        .collect();
    assert_eq!(states, ["loading", "ready"]);
}

#[test]
fn watch_on_a_terminal_redraws_in_place() {
    let mut frames = status::Frames::new(false, true);
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
    let mut frames = status::Frames::new(false, false);
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
    let mut lines = status::Frames::new(true, false);
    assert!(lines.next(&ticked, 0).unwrap().is_some());
    assert_eq!(lines.next(&ticked, 0).unwrap(), None);
    ticked.cards[0].heartbeat += 1;
    assert!(lines.next(&ticked, 0).unwrap().is_some());
}

/// A writer the test can read while ttctl still holds it.
#[derive(Clone, Default)]
struct SharedOut(Arc<Mutex<Vec<u8>>>);

impl Write for SharedOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
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
    let watching = execute(cli(&front, &["status", "--watch"]), &mut writer, false);
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

#[tokio::test]
async fn proven_reset_streams_each_step_and_succeeds() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["card", "reset", "1"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        out,
        "[0000:01:00.0] attempt 1: running tt-smi -r 0000:01:00.0\n\
         [0000:01:00.0] attempt 1: waiting for the device to reappear\n\
         [0000:01:00.0] attempt 1: back as /dev/tenstorrent/3\n"
    );
}

#[tokio::test]
async fn unproven_reset_exits_1_with_the_reason() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["card", "reset", "2"]).await;
    assert_eq!(
        out,
        "[0000:01:00.0] attempt 1: running tt-smi -r 0000:01:00.0\n\
         [0000:01:00.0] attempt 1: heartbeat did not advance\n"
    );
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert_eq!(
        failure.message(),
        "heartbeat did not advance after 2 attempts"
    );
}

#[tokio::test]
async fn daemon_refusals_are_printed_as_the_daemon_wrote_them() {
    let h = serve(fake());
    let (_, failure) = ttctl(&h.socket, &["card", "reset", "9"]).await;
    let failure = failure.unwrap();
    assert_eq!((failure.exit_code(), failure.message()), (1, "no card 9"));

    let (_, failure) = ttctl(&h.socket, &["card", "reset", "5"]).await;
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert_eq!(
        failure.message(),
        "card 0000:05:00.0 is locked by pid 4242 (bench-sweep)"
    );
}

#[tokio::test]
async fn reset_stream_ending_without_a_result_is_a_failure() {
    let h = serve(fake());
    let (_, failure) = ttctl(&h.socket, &["card", "reset", "7"]).await;
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert!(
        failure.message().contains("without a result"),
        "{failure:?}"
    );
}

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

#[test]
fn socket_is_global_and_defaults_to_the_module_path() {
    let before =
        Cli::try_parse_from(["ttctl", "--socket", "/a.sock", "card", "reset", "1"]).unwrap();
    assert_eq!(before.socket, Path::new("/a.sock"));
    let after = Cli::try_parse_from([
        "ttctl",
        "card",
        "reset",
        "0000:01:00.0",
        "--socket",
        "/b.sock",
    ])
    .unwrap();
    assert_eq!(after.socket, Path::new("/b.sock"));
    assert!(matches!(
        after.command,
        Command::Card(CardCommand::Reset { ref card }) if card == "0000:01:00.0"
    ));
    if std::env::var_os("TTCTL_SOCKET").is_none() {
        let default = Cli::try_parse_from(["ttctl", "status"]).unwrap();
        assert_eq!(default.socket, Path::new(DEFAULT_SOCKET));
    }
}

#[test]
fn usage_errors_exit_2_and_help_documents_exit_codes() {
    for argv in [
        &["ttctl"][..],
        &["ttctl", "card"],
        &["ttctl", "card", "reset"],
        &["ttctl", "status", "--bogus"],
    ] {
        let err = Cli::try_parse_from(argv).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{argv:?}: {err}");
    }
    let help = Cli::try_parse_from(["ttctl", "--help"])
        .unwrap_err()
        .to_string();
    assert!(help.contains("Exit codes:"), "{help}");
    assert!(help.contains("3  tt-servingd cannot be reached"), "{help}");
    assert!(help.contains("TTCTL_SOCKET"), "{help}");
}
