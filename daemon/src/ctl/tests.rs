//! ttctl against a fake Control server on a real unix socket: the real
//! connector, real gRPC streams, and the exit code each outcome maps to.

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use clap::Parser;
use tokio_stream::Stream;
use tonic::Streaming;
use tonic::{Request, Response, Status};
use tt_serving_proto::v1::control_server::{Control, ControlServer};
use tt_serving_proto::v1::generate_request::Input;
use tt_serving_proto::v1::generate_response::Chunk;
use tt_serving_proto::v1::{
    BorrowEvent, BorrowRequest, CacheVariant, Card, CardState, DaemonInfo, FinishReason,
    GenerateRequest, GenerateResponse, GenerationFinal, ListCacheRequest, ListCacheResponse,
    LogLine, LogsRequest, ReloadReport, ReloadRequest, RemoveCacheRequest, RemoveCacheResponse,
    ResetCardRequest, ResetPhase, ResetProgress, Slot, SlotReply, SlotRequest, SlotState,
    StatusRequest, StatusResponse, Timings, TokenDelta, Usage,
};

use super::*;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Answers from fixed data; card, slot, model and variant arguments pick
/// the scenario.
struct FakeDaemon {
    /// What WatchStatus streams; it ends after these unless `hang_after_watch`.
    snapshots: Vec<StatusResponse>,
    /// Keep the watch stream open after the snapshots, like a live daemon.
    hang_after_watch: bool,
    /// The requests that carry parameters, as received.
    seen: Arc<Mutex<Seen>>,
    /// Lets the `slow` generation go on past its first delta.
    release: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct Seen {
    generate: Vec<GenerateRequest>,
    logs: Vec<LogsRequest>,
}

fn delta(text: &str) -> Result<GenerateResponse, Status> {
    Ok(GenerateResponse {
        chunk: Some(Chunk::Delta(TokenDelta {
            text: text.into(),
            token_ids: vec![1],
        })),
    })
}

fn final_chunk(reason: FinishReason, completion_tokens: u32) -> Result<GenerateResponse, Status> {
    Ok(GenerateResponse {
        chunk: Some(Chunk::Final(GenerationFinal {
            finish_reason: reason as i32,
            usage: Some(Usage {
                prompt_tokens: 5,
                completion_tokens,
            }),
            timings: Some(Timings {
                queue_us: 100,
                prefill_us: 30_000,
                decode_us: 100_000,
                time_to_first_token_us: 35_200,
            }),
            slot: "qwen".into(),
        })),
    })
}

fn log(stream: &str, text: &str) -> LogLine {
    LogLine {
        unix_ms: 1,
        stream: stream.into(),
        text: text.into(),
    }
}

fn variant(model: &str, key: &str, state: &str, used_by: &[&str]) -> CacheVariant {
    CacheVariant {
        model: model.into(),
        key: key.into(),
        state: state.into(),
        reason: if state == "incomplete" {
            "weights/layer3.bin is missing".into()
        } else {
            String::new()
        },
        bytes: if state == "warm" { 3 << 30 } else { 1 << 20 },
        files: if state == "warm" { 12 } else { 0 },
        used_by: used_by.iter().map(|s| s.to_string()).collect(),
        inputs: [("tp".to_string(), "1".to_string())].into(),
    }
}

/// One listing covers every verdict: `qwen` warm, `smol` cold, `big`
/// incomplete, `old` only a variant no slot uses, `mixed` an unused warm
/// variant next to the used cold one.
fn cache_listing() -> ListCacheResponse {
    ListCacheResponse {
        cache_dir: "/var/cache/tt-serving".into(),
        variants: vec![
            variant("big", "b000000000000001", "incomplete", &["big"]),
            variant("mixed", "a000000000000001", "warm", &[]),
            variant("mixed", "a000000000000002", "cold", &["mixed/0", "mixed/1"]),
            variant("old", "0000000000000001", "warm", &[]),
            variant("qwen", "3f2a9c0d1e2b4a5c", "warm", &["qwen"]),
            variant("qwen", "ffff000000000000", "cold", &[]),
            variant("smol", "5000000000000001", "cold", &["smol"]),
        ],
        models: ["big", "fresh", "mixed", "old", "qwen", "smol"]
            .map(String::from)
            .to_vec(),
    }
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
        reloads: vec![],
        queues: vec![],
    }
}

/// Slot `qwen` in `state` since `since` (unix ms), on its `starts`th start.
fn restart_slot(state: SlotState, starts: u64, since: u64, pid: u32, reason: &str) -> Slot {
    Slot {
        name: "qwen".into(),
        model: "qwen".into(),
        state: state as i32,
        since_unix_ms: since,
        starts,
        worker_pid: pid,
        reason: reason.into(),
        ..Default::default()
    }
}

/// What WatchStatus streams while slot `qwen` restarts.
fn restarting(slots: Vec<Slot>) -> FakeDaemon {
    FakeDaemon {
        snapshots: slots
            .into_iter()
            .map(|slot| StatusResponse {
                slots: vec![slot],
                ..snapshot(SlotState::Ready)
            })
            .collect(),
        hang_after_watch: true,
        ..fake()
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
    // ttctl reload is tested against the real daemon (tests/reload.rs); this
    // stands for a daemon older than the command.
    async fn reload(&self, _: Request<ReloadRequest>) -> Result<Response<ReloadReport>, Status> {
        Err(Status::unimplemented("reload"))
    }

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

    async fn restart_slot(
        &self,
        request: Request<SlotRequest>,
    ) -> Result<Response<SlotReply>, Status> {
        match request.into_inner().slot.as_str() {
            // As the request found it: ready on its first worker.
            "qwen" => Ok(Response::new(SlotReply {
                slot: Some(restart_slot(SlotState::Ready, 1, 1_000, 4242, "serving")),
            })),
            // A daemon older than the start counter.
            "old" => Ok(Response::new(SlotReply {
                slot: Some(Slot {
                    name: "old".into(),
                    ..restart_slot(SlotState::Ready, 0, 1_000, 4242, "serving")
                }),
            })),
            other => Err(Status::not_found(format!("no slot `{other}`; slots: qwen"))),
        }
    }

    type LogsStream = Boxed<LogLine>;

    async fn logs(
        &self,
        request: Request<LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        use tokio_stream::StreamExt;
        let request = request.into_inner();
        self.seen.lock().unwrap().logs.push(request.clone());
        let backlog = vec![
            Ok(log("stdout", "loading weights")),
            Ok(log("stderr", "warning: slow disk")),
            Ok(log(
                "ttctl",
                "... 3 lines skipped (the reader fell behind) ...",
            )),
        ];
        let backlog = tokio_stream::iter(backlog);
        match (request.slot.as_str(), request.follow) {
            ("qwen", false) | ("stopping", _) => Ok(Response::new(Box::pin(backlog))),
            // A live slot: the stream stays open for new lines.
            ("qwen", true) => Ok(Response::new(Box::pin(
                backlog.chain(tokio_stream::pending()),
            ))),
            (other, _) => Err(Status::not_found(format!("no slot `{other}`; slots: qwen"))),
        }
    }

    type GenerateStream = Boxed<GenerateResponse>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let request = request.into_inner();
        self.seen.lock().unwrap().generate.push(request.clone());
        let chunks = match request.model.as_str() {
            "qwen" => vec![
                delta("Paris"),
                delta(""),
                delta(", of course."),
                final_chunk(FinishReason::Stop, 3),
            ],
            "lines" => vec![delta("one\ntwo\n"), final_chunk(FinishReason::Length, 2)],
            "slow" => {
                let release = self.release.clone();
                let rest = slow_rest(release);
                return Ok(Response::new(Box::pin(tokio_stream::StreamExt::chain(
                    tokio_stream::iter(vec![delta("first")]),
                    rest,
                ))));
            }
            "cut" => vec![delta("partial")],
            "dying" => vec![
                delta("par"),
                Err(Status::unavailable(
                    "the worker of slot dying failed mid-request (Unknown: broken pipe); the \
                     slot is recovering, retry shortly",
                )),
            ],
            "drain" => vec![delta("half"), final_chunk(FinishReason::Cancelled, 1)],
            "busy" => {
                return Err(Status::resource_exhausted(
                    "model `busy` has 8 requests waiting (max_queue); retry in a few seconds",
                ))
            }
            "down" => {
                return Err(Status::unavailable(
                    "model `down` has no ready slot (slot down is Loading for 3s: loading)",
                ))
            }
            "bad" => {
                return Err(Status::invalid_argument(
                    "sampling.top_p: 2 is outside [0, 1]",
                ))
            }
            other => {
                return Err(Status::not_found(format!(
                    "unknown model `{other}`; known models: qwen"
                )))
            }
        };
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn list_cache(
        &self,
        _: Request<ListCacheRequest>,
    ) -> Result<Response<ListCacheResponse>, Status> {
        Ok(Response::new(cache_listing()))
    }

    async fn remove_cache(
        &self,
        request: Request<RemoveCacheRequest>,
    ) -> Result<Response<RemoveCacheResponse>, Status> {
        match request.into_inner().key.as_str() {
            "0000000000000001" => Ok(Response::new(RemoveCacheResponse {
                path: "/var/cache/tt-serving/old/0000000000000001".into(),
                bytes: 3 << 30,
            })),
            "3f2a9c0d1e2b4a5c" => Err(Status::failed_precondition(
                "cache variant 3f2a9c0d1e2b4a5c is in use by slot(s) qwen (Ready); removing \
                 it under a running worker would break it",
            )),
            other => Err(Status::not_found(format!(
                "no cache variant `{other}`; `ttctl cache ls` lists them"
            ))),
        }
    }

    // The commands ttctl does not have yet.

    type BorrowCardsStream = Boxed<BorrowEvent>;

    async fn borrow_cards(
        &self,
        _: Request<Streaming<BorrowRequest>>,
    ) -> Result<Response<Self::BorrowCardsStream>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    type BuildCacheStream = Boxed<tt_serving_proto::v1::BuildCacheProgress>;

    async fn build_cache(
        &self,
        _: Request<tt_serving_proto::v1::BuildCacheRequest>,
    ) -> Result<Response<Self::BuildCacheStream>, Status> {
        Err(Status::unimplemented("not faked"))
    }
}

/// The rest of the `slow` generation, sent once the test saw the first
/// delta printed.
fn slow_rest(release: Arc<tokio::sync::Notify>) -> Boxed<GenerateResponse> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        release.notified().await;
        let _ = tx.send(delta(" then more")).await;
        let _ = tx.send(final_chunk(FinishReason::Stop, 2)).await;
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
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
        seen: Arc::default(),
        release: Arc::default(),
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
    let (out, _, failure) = ttctl_with_stderr(socket, args).await;
    (out, failure)
}

/// Run ttctl; return stdout, what it wrote to stderr besides the failure
/// message, and the failure, if any.
async fn ttctl_with_stderr(socket: &Path, args: &[&str]) -> (String, String, Option<Failure>) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let result = execute(cli(socket, args), &mut out, &mut err, false).await;
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
        result.err(),
    )
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

fn seen_generate(fake: &Arc<Mutex<Seen>>) -> GenerateRequest {
    fake.lock().unwrap().generate.last().cloned().unwrap()
}

#[tokio::test]
async fn generate_prints_the_text_then_the_summary_on_stderr() {
    let daemon = fake();
    let seen = daemon.seen.clone();
    let h = serve(daemon);
    let (out, err, failure) =
        ttctl_with_stderr(&h.socket, &["generate", "qwen", "The capital of France is"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(out, "Paris, of course.\n");
    assert_eq!(
        err,
        "[stop] 5 prompt tokens, 3 completion tokens, slot qwen, TTFT 35.2 ms, \
         decode 20.0 tok/s\n"
    );
    let request = seen_generate(&seen);
    assert_eq!(request.model, "qwen");
    assert_eq!(
        request.input,
        Some(Input::Prompt("The capital of France is".into()))
    );
    assert_eq!(request.max_tokens, 64, "the default");
    assert_eq!(request.sampling, None, "greedy unless asked");
    assert!(request.stop.is_empty());
}

#[tokio::test]
async fn generate_sends_sampling_stop_strings_and_chat() {
    let daemon = fake();
    let seen = daemon.seen.clone();
    let h = serve(daemon);
    let (_, failure) = ttctl(
        &h.socket,
        &[
            "generate",
            "qwen",
            "Hi there",
            "--max-tokens",
            "8",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--top-k",
            "40",
            "--seed",
            "7",
            "--stop",
            ".",
            "--stop",
            "\n\n",
            "--chat",
        ],
    )
    .await;
    assert!(failure.is_none(), "{failure:?}");
    let request = seen_generate(&seen);
    assert_eq!(request.max_tokens, 8);
    let sampling = request.sampling.unwrap();
    assert_eq!(
        (
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            sampling.seed
        ),
        (0.7, 0.9, 40, Some(7))
    );
    assert_eq!(request.stop, [".", "\n\n"]);
    let Some(Input::Chat(chat)) = request.input else {
        panic!("--chat sends a conversation: {:?}", request.input);
    };
    assert_eq!(chat.messages.len(), 1);
    assert_eq!(
        (
            chat.messages[0].role.as_str(),
            chat.messages[0].content.as_str()
        ),
        ("user", "Hi there")
    );

    // One sampling option alone still sends the settings, the rest zero.
    let (_, failure) = ttctl(&h.socket, &["generate", "qwen", "x", "--seed", "3"]).await;
    assert!(failure.is_none(), "{failure:?}");
    let sampling = seen_generate(&seen).sampling.unwrap();
    assert_eq!(
        (
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            sampling.seed
        ),
        (0.0, 0.0, 0, Some(3))
    );
}

#[tokio::test]
async fn generate_prints_each_delta_as_it_arrives() {
    let daemon = fake();
    let release = daemon.release.clone();
    let h = serve(daemon);
    let out = SharedOut::default();
    let mut writer = out.clone();
    let mut err = Vec::new();
    let generating = execute(
        cli(&h.socket, &["generate", "slow", "hi"]),
        &mut writer,
        &mut err,
        false,
    );
    let watcher = async {
        // The first delta shows up while the daemon holds back the rest.
        while !String::from_utf8_lossy(&out.0.lock().unwrap()).contains("first") {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(&*out.0.lock().unwrap(), b"first");
        release.notify_one();
    };
    let (result, ()) = tokio::join!(generating, watcher);
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(&*out.0.lock().unwrap(), b"first then more\n");
    assert!(String::from_utf8(err).unwrap().starts_with("[stop] "));
}

#[tokio::test]
async fn generate_text_ending_in_a_newline_gets_no_extra_one() {
    let h = serve(fake());
    let (out, err, failure) = ttctl_with_stderr(&h.socket, &["generate", "lines", "x"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(out, "one\ntwo\n");
    assert!(
        err.starts_with("[length] 5 prompt tokens, 2 completion tokens"),
        "{err}"
    );
    assert!(err.ends_with("decode 10.0 tok/s\n"), "{err}");
}

#[tokio::test]
async fn generate_stream_without_a_final_chunk_exits_1() {
    let h = serve(fake());
    let (out, err, failure) = ttctl_with_stderr(&h.socket, &["generate", "cut", "x"]).await;
    assert_eq!(out, "partial\n", "the text so far stays, its line ended");
    assert_eq!(err, "", "no summary without a final chunk");
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert!(
        failure.message().contains("without its final chunk"),
        "{failure:?}"
    );
}

#[tokio::test]
async fn generate_failing_mid_stream_exits_1_with_the_daemons_message() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["generate", "dying", "x"]).await;
    assert_eq!(out, "par\n");
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert_eq!(
        failure.message(),
        "the worker of slot dying failed mid-request (Unknown: broken pipe); the slot is \
         recovering, retry shortly"
    );
}

#[tokio::test]
async fn generate_cancelled_by_the_daemon_prints_the_summary_and_exits_1() {
    let h = serve(fake());
    let (out, err, failure) = ttctl_with_stderr(&h.socket, &["generate", "drain", "x"]).await;
    assert_eq!(out, "half\n");
    assert!(err.starts_with("[cancelled] "), "{err}");
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert!(failure.message().contains("cancelled"), "{failure:?}");
}

#[tokio::test]
async fn generate_refusals_keep_the_daemons_message() {
    let h = serve(fake());
    for (model, message) in [
        ("nope", "unknown model `nope`; known models: qwen"),
        (
            "down",
            "model `down` has no ready slot (slot down is Loading for 3s: loading)",
        ),
        (
            "busy",
            "model `busy` has 8 requests waiting (max_queue); retry in a few seconds",
        ),
        ("bad", "sampling.top_p: 2 is outside [0, 1]"),
    ] {
        let (out, err, failure) = ttctl_with_stderr(&h.socket, &["generate", model, "x"]).await;
        assert_eq!((out.as_str(), err.as_str()), ("", ""), "{model}");
        let failure = failure.unwrap();
        assert_eq!((failure.exit_code(), failure.message()), (1, message));
    }
}

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
    let mut daemon = client::Daemon::connect(&h.socket).await.unwrap();
    let args = LogsArgs {
        slot: "qwen".into(),
        lines: 100,
        follow: true,
    };
    let out = SharedOut::default();
    let mut writer = out.clone();
    let (ctrl_c, pressed) = tokio::sync::oneshot::channel::<()>();
    let following = logs::run(&mut daemon, &args, &mut writer, async {
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

#[tokio::test]
async fn slot_restart_follows_the_slot_until_a_new_worker_is_ready() {
    use SlotState::*;
    let h = serve(restarting(vec![
        // Before the supervisor acted: not news, not printed.
        restart_slot(Ready, 1, 1_000, 4242, "serving"),
        restart_slot(Draining, 1, 2_000, 4242, "restart requested"),
        restart_slot(Starting, 2, 3_000, 0, "starting the worker (warm start)"),
        restart_slot(Loading, 2, 4_000, 4250, "warm start: worker loading"),
        restart_slot(Ready, 2, 5_000, 4250, "serving (warm start took 0.2s)"),
    ]));
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "qwen"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        out,
        "restart of slot qwen requested (it was ready, worker pid 4242); following it until a new worker is ready (Ctrl-C stops following, not the restart)\n\
         slot qwen: draining: restart requested\n\
         slot qwen: starting: starting the worker (warm start)\n\
         slot qwen: loading: warm start: worker loading\n\
         slot qwen is ready again with a new worker (pid 4250): serving (warm start took 0.2s)\n"
    );
}

#[tokio::test]
async fn slot_restart_that_fails_exits_1_with_the_daemons_reason() {
    use SlotState::*;
    let h = serve(restarting(vec![
        restart_slot(Draining, 1, 2_000, 4242, "restart requested"),
        restart_slot(
            Failed,
            2,
            3_000,
            0,
            "worker exited with status 3 while loading; retrying in 50 ms (attempt 2 of 5)",
        ),
    ]));
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "qwen"]).await;
    assert!(
        out.ends_with("slot qwen: draining: restart requested\n"),
        "{out}"
    );
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (
            1,
            "restart of slot qwen failed: worker exited with status 3 while loading; retrying in 50 ms (attempt 2 of 5) (`ttctl logs qwen` shows the worker's output)"
        )
    );
}

#[tokio::test]
async fn slot_restart_without_waiting_claims_no_state_it_has_not_reached() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "qwen", "--no-wait"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        out,
        "restart of slot qwen requested (it was ready, worker pid 4242); it restarts in the background: follow it with `ttctl status --watch`\n"
    );
    // An older daemon cannot tell the new worker from the old: ttctl says
    // so instead of waiting for a sign that never comes.
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "old"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert!(
        out.ends_with(
            "this tt-servingd does not report restarts: follow it with `ttctl status --watch`\n"
        ),
        "{out}"
    );
    let (out, failure) = ttctl(&h.socket, &["slot", "restart", "qwen/3"]).await;
    assert_eq!(out, "");
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (1, "no slot `qwen/3`; slots: qwen")
    );
}

#[tokio::test]
async fn cache_ls_prints_the_table_or_json() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["cache", "ls"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert!(
        out.starts_with("MODEL  VARIANT           STATE       SIZE     FILES  USED BY\n"),
        "{out}"
    );
    assert!(
        out.contains("    reason: weights/layer3.bin is missing\n"),
        "{out}"
    );

    let (out, failure) = ttctl(&h.socket, &["cache", "ls", "--json"]).await;
    assert!(failure.is_none(), "{failure:?}");
    let cache: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cache["cache_dir"], "/var/cache/tt-serving");
    assert_eq!(cache["variants"].as_array().unwrap().len(), 7);
    let qwen = &cache["variants"][4];
    assert_eq!(
        (&qwen["model"], &qwen["key"]),
        (&"qwen".into(), &"3f2a9c0d1e2b4a5c".into())
    );
    assert_eq!(qwen["used_by"], serde_json::json!(["qwen"]));
    assert_eq!(qwen["inputs"]["tp"], "1");
}

#[tokio::test]
async fn cache_verify_exits_0_only_when_the_used_variant_is_warm() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["cache", "verify", "qwen"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert!(out.contains("3f2a9c0d1e2b4a5c  warm"), "{out}");
    assert!(out.contains("ffff000000000000  cold"), "{out}");
    assert!(
        out.ends_with("qwen: variant 3f2a9c0d1e2b4a5c is warm: the next start of qwen is warm\n"),
        "{out}"
    );

    for (model, says) in [
        ("smol", "is cold"),
        ("mixed", "(used by mixed/0, mixed/1) is cold"),
        ("big", "is incomplete: weights/layer3.bin is missing"),
        ("old", "no slot uses them"),
    ] {
        let (out, failure) = ttctl(&h.socket, &["cache", "verify", model]).await;
        assert!(
            out.contains("VARIANT"),
            "{model}: the variants are listed: {out}"
        );
        let failure = failure.unwrap();
        assert_eq!(failure.exit_code(), 1, "{model}: {failure:?}");
        assert!(failure.message().contains(says), "{model}: {failure:?}");
        assert!(
            failure
                .message()
                .ends_with("a cold build will happen at the next start"),
            "{model}: {failure:?}"
        );
    }

    let (out, failure) = ttctl(&h.socket, &["cache", "verify", "fresh"]).await;
    assert_eq!(out, "");
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (1, "no cache for fresh yet: the next start builds it cold")
    );

    // A name no model has is not "a cold build at the next start": there
    // is no next start. The error names the models there are.
    let (out, failure) = ttctl(&h.socket, &["cache", "verify", "ghost"]).await;
    assert_eq!(out, "");
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (
            1,
            "unknown model `ghost`; the config names these models: big, fresh, mixed, old, qwen, smol"
        )
    );
}

#[tokio::test]
async fn cache_rm_prints_what_it_freed_and_passes_refusals_on() {
    let h = serve(fake());
    let (out, failure) = ttctl(&h.socket, &["cache", "rm", "0000000000000001"]).await;
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        out,
        "removed /var/cache/tt-serving/old/0000000000000001: freed 3.0 GiB (3221225472 bytes)\n"
    );

    let (_, failure) = ttctl(&h.socket, &["cache", "rm", "3f2a9c0d1e2b4a5c"]).await;
    let failure = failure.unwrap();
    assert_eq!(failure.exit_code(), 1);
    assert!(
        failure
            .message()
            .starts_with("cache variant 3f2a9c0d1e2b4a5c is in use by slot(s) qwen"),
        "{failure:?}"
    );

    let (_, failure) = ttctl(&h.socket, &["cache", "rm", "nope"]).await;
    let failure = failure.unwrap();
    assert_eq!(
        (failure.exit_code(), failure.message()),
        (1, "no cache variant `nope`; `ttctl cache ls` lists them")
    );
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
    ] {
        let (_, failure) = ttctl(&socket, args).await;
        assert_eq!(failure.unwrap().exit_code(), 3, "{args:?}");
    }
}

#[test]
fn top_interval_outside_its_range_is_a_usage_error_naming_the_range() {
    for (value, says) in [
        ("0.05", "0.05 is outside 0.1..3600 seconds"),
        ("7200", "7200 is outside 0.1..3600 seconds"),
        ("soon", "not a number of seconds"),
    ] {
        let err = Cli::try_parse_from(["ttctl", "top", "--interval", value]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{value}: {err}");
        assert!(err.to_string().contains(says), "{value}: {err}");
    }
    let cli =
        Cli::try_parse_from(["ttctl", "top", "--interval", "0.1", "--iterations", "3"]).unwrap();
    let Command::Top(args) = cli.command else {
        panic!("{cli:?}");
    };
    assert_eq!((args.interval, args.iterations), (0.1, 3));
}

#[test]
fn new_commands_parse_with_their_defaults() {
    let cli = Cli::try_parse_from(["ttctl", "generate", "qwen", "Hello"]).unwrap();
    let Command::Generate(args) = cli.command else {
        panic!("{cli:?}");
    };
    assert_eq!(
        (args.model.as_str(), args.prompt.as_str()),
        ("qwen", "Hello")
    );
    assert_eq!(args.max_tokens, 64);
    assert!(!args.chat && args.stop.is_empty() && args.seed.is_none());
    assert_eq!(generate::request(&args).sampling, None);

    let cli = Cli::try_parse_from(["ttctl", "logs", "qwen/1"]).unwrap();
    let Command::Logs(args) = cli.command else {
        panic!("{cli:?}");
    };
    assert_eq!(
        (args.slot.as_str(), args.lines, args.follow),
        ("qwen/1", 100, false)
    );
    let cli = Cli::try_parse_from(["ttctl", "logs", "-f", "-n", "20", "qwen"]).unwrap();
    assert!(matches!(
        cli.command,
        Command::Logs(LogsArgs {
            lines: 20,
            follow: true,
            ..
        })
    ));

    assert!(matches!(
        Cli::try_parse_from(["ttctl", "cache", "ls", "--json"])
            .unwrap()
            .command,
        Command::Cache(CacheCommand::Ls { json: true })
    ));
    assert!(matches!(
        Cli::try_parse_from(["ttctl", "slot", "restart", "m/0"]).unwrap().command,
        Command::Slot(SlotCommand::Restart { ref slot, no_wait: false }) if slot == "m/0"
    ));
}

#[test]
fn usage_errors_exit_2_and_help_documents_exit_codes() {
    for argv in [
        &["ttctl"][..],
        &["ttctl", "card"],
        &["ttctl", "card", "reset"],
        &["ttctl", "status", "--bogus"],
        &["ttctl", "generate", "qwen"],
        &["ttctl", "generate", "qwen", "hi", "--max-tokens", "many"],
        &["ttctl", "generate", "qwen", "hi", "--stop"],
        &["ttctl", "logs"],
        &["ttctl", "logs", "qwen", "-n", "-1"],
        &["ttctl", "slot"],
        &["ttctl", "slot", "restart"],
        &["ttctl", "cache"],
        &["ttctl", "cache", "verify"],
        &["ttctl", "cache", "rm"],
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

#[test]
fn next_start_is_warm_only_from_the_variant_the_config_selects() {
    let listing = cache_listing();
    let judged = |model: &str| cache::check(model, &listing).next_start;
    let variant = |key: &str| listing.variants.iter().find(|v| v.key == key).unwrap();
    assert_eq!(
        judged("qwen"),
        cache::NextStart::Warm(vec![variant("3f2a9c0d1e2b4a5c")])
    );
    assert_eq!(
        judged("smol"),
        cache::NextStart::NotWarm(variant("5000000000000001"))
    );
    assert_eq!(
        judged("mixed"),
        cache::NextStart::NotWarm(variant("a000000000000002"))
    );
    assert_eq!(
        judged("big"),
        cache::NextStart::NotWarm(variant("b000000000000001"))
    );
    // `old` is configured but no slot uses its variant.
    assert_eq!(judged("old"), cache::NextStart::NoneSelected);
    assert_eq!(judged("fresh"), cache::NextStart::NoCache);
    assert_eq!(
        judged("ghost"),
        cache::NextStart::UnknownModel {
            models: &listing.models
        }
    );
    let mut removed = cache_listing();
    removed.models.retain(|m| m != "qwen");
    let check = cache::check("qwen", &removed);
    assert_eq!(check.variants.len(), 2);
    assert_eq!(
        check.next_start,
        cache::NextStart::LeftOver {
            models: &removed.models
        }
    );
}
