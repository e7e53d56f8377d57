//! The fake daemon: a Control server answering from fixed data on a real
//! unix socket, so ttctl runs with its real connector and real gRPC
//! streams. The argument a test passes (card, slot, model, variant) picks
//! the scenario.

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tt_serving_proto::v1::control_server::{Control, ControlServer};
use tt_serving_proto::v1::generate_response::Chunk;
use tt_serving_proto::v1::{
    AuditRequest, AuditResponse, BorrowEvent, BorrowRequest, CacheVariant, Card, CardState,
    DaemonInfo, FinishReason, GenerateRequest, GenerateResponse, GenerationFinal, ListCacheRequest,
    ListCacheResponse, LogLine, LogsRequest, ReloadReport, ReloadRequest, RemoveCacheRequest,
    RemoveCacheResponse, ResetCardRequest, ResetPhase, ResetProgress, Slot, SlotReply, SlotRequest,
    SlotState, StatusRequest, StatusResponse, Timings, TokenDelta, Usage, UsageRequest,
    UsageResponse,
};

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Answers from fixed data; card, slot, model and variant arguments pick
/// the scenario.
pub(super) struct FakeDaemon {
    /// What WatchStatus streams; it ends after these unless `hang_after_watch`.
    pub(super) snapshots: Vec<StatusResponse>,
    /// Keep the watch stream open after the snapshots, like a live daemon.
    pub(super) hang_after_watch: bool,
    /// The requests that carry parameters, as received.
    pub(super) seen: Arc<Mutex<Seen>>,
    /// Lets the `slow` generation go on past its first delta.
    pub(super) release: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
pub(super) struct Seen {
    pub(super) generate: Vec<GenerateRequest>,
    pub(super) logs: Vec<LogsRequest>,
}

fn delta(text: &str) -> Result<GenerateResponse, Status> {
    Ok(GenerateResponse {
        chunk: Some(Chunk::Delta(TokenDelta {
            text: text.into(),
            token_ids: vec![1],
            ..Default::default()
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
                cached_prompt_tokens: 0,
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
pub(super) fn cache_listing() -> ListCacheResponse {
    ListCacheResponse {
        cache_dir: "/var/cache/tt-serving".into(),
        variants: vec![
            variant("big", "b000000000000001", "incomplete", &["big"]),
            variant("mixed", "a000000000000001", "warm", &[]),
            variant("mixed", "a000000000000002", "cold", &["mixed/0", "mixed/1"]),
            variant("old", "0000000000000001", "warm", &[]),
            CacheVariant {
                inputs: [
                    ("tp", "1"),
                    ("engine engine", "vllm-tt"),
                    ("engine worker", "tt-worker-openai 0.1.0"),
                    ("engine worker build", "size=1 mtime=2.000000003"),
                    ("engine python ttnn", "0.81.1"),
                    ("engine python tt-umd", "0.9.14"),
                    ("cards", "p150a"),
                    ("mesh", "(1,1)"),
                ]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
                ..variant("qwen", "3f2a9c0d1e2b4a5c", "warm", &["qwen"])
            },
            variant("qwen", "ffff000000000000", "cold", &[]),
            variant("smol", "5000000000000001", "cold", &["smol"]),
        ],
        models: ["big", "fresh", "mixed", "old", "qwen", "smol"]
            .map(String::from)
            .to_vec(),
    }
}

pub(super) fn snapshot(slot_state: SlotState) -> StatusResponse {
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
        accuracy: vec![],
    }
}

/// Slot `qwen` in `state` since `since` (unix ms), on its `starts`th start.
pub(super) fn restart_slot(
    state: SlotState,
    starts: u64,
    since: u64,
    pid: u32,
    reason: &str,
) -> Slot {
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
pub(super) fn restarting(slots: Vec<Slot>) -> FakeDaemon {
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

    // Slot stop and start are tested against the real daemon
    // (tests/slots.rs).
    async fn stop_slot(&self, _: Request<SlotRequest>) -> Result<Response<SlotReply>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn start_slot(&self, _: Request<SlotRequest>) -> Result<Response<SlotReply>, Status> {
        Err(Status::unimplemented("not in the fake"))
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

    // ttctl audit is tested against the real daemon (tests/audit.rs).
    async fn audit(&self, _: Request<AuditRequest>) -> Result<Response<AuditResponse>, Status> {
        Err(Status::unimplemented("audit"))
    }

    async fn usage(&self, _: Request<UsageRequest>) -> Result<Response<UsageResponse>, Status> {
        Err(Status::unimplemented("usage"))
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

    type TrialStream = Boxed<tt_serving_proto::v1::TrialEvent>;

    async fn trial(
        &self,
        _: Request<Streaming<tt_serving_proto::v1::TrialRequest>>,
    ) -> Result<Response<Self::TrialStream>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    type VerifyCacheStream = Boxed<tt_serving_proto::v1::VerifyCacheProgress>;

    /// Every variant of the model verifies, after one progress line.
    async fn verify_cache(
        &self,
        request: Request<tt_serving_proto::v1::VerifyCacheRequest>,
    ) -> Result<Response<Self::VerifyCacheStream>, Status> {
        use tt_serving_proto::v1::VerifyCacheProgress;
        let model = request.into_inner().model;
        let progress = |message: String, finished: bool| VerifyCacheProgress {
            message,
            finished,
            ok: finished,
            bytes_done: 1 << 20,
            bytes_total: 1 << 20,
        };
        Ok(Response::new(Box::pin(tokio_stream::iter([
            Ok(progress(
                format!("{model}: 1/1 files, 1 of 1 MiB hashed"),
                false,
            )),
            Ok(progress(format!("{model}: verified"), true)),
        ]))))
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

pub(super) fn fake() -> FakeDaemon {
    FakeDaemon {
        snapshots: vec![snapshot(SlotState::Loading), snapshot(SlotState::Ready)],
        hang_after_watch: false,
        seen: Arc::default(),
        release: Arc::default(),
    }
}

/// A fake daemon listening on a socket in a fresh temp dir.
pub(super) struct Harness {
    /// Holds the socket's directory until the test ends.
    _dir: tempfile::TempDir,
    pub(super) socket: std::path::PathBuf,
}

pub(super) fn serve(fake: FakeDaemon) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    serve_at(fake, &socket);
    Harness { _dir: dir, socket }
}

pub(super) fn serve_at(fake: FakeDaemon, socket: &Path) {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ControlServer::new(fake))
            .serve_with_incoming(incoming),
    );
}
