//! Availability while a slot recovers: real daemon, real `tt-worker` with
//! the tiny model, fake cards. A model whose only replica was killed is on
//! its way back (reset, warm start); requests that may wait for it do, in
//! the model's queue; the others are refused at once with a retry hint
//! (`grpc-retry-pushback-ms`). `TTW_FAULT_SLOW_LOAD_MS` makes every start
//! (the first one included, so the daemon's estimate knows it) long enough
//! for a request to arrive while the slot is still loading.

use std::time::Duration;
use tonic::Code;
use tt_fakehw::Fault;
use tt_serving_tests::chaos_support::{self as chaos, End, RequestRecord};
use tt_serving_tests::{model_table, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw};

/// Slack over a request's deadline for a loaded 2-core machine: the bound
/// is that nothing outlives its deadline, not a speed claim.
const SLACK: Duration = Duration::from_secs(5);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// Model `m` on card 0, every start loading for 3 s, with `extra` lines in
/// its table.
fn start(hw: &FakeHw, model: &std::path::Path, extra: &str) -> Daemon {
    let table = format!(
        "env = {{ TTW_TEST_FAULTS = \"1\", TTW_FAULT_SLOW_LOAD_MS = \"3000\" }}\n{extra}\n[models.m.restart]\nbackoff_ms = 50\n"
    );
    let daemon = Daemon::start(
        hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], model, &table),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    daemon
}

/// SIGKILL the worker of `m` and return once the slot has left Ready (it
/// then loads for 3 s more). Returns the killed pid.
fn kill_worker(daemon: &Daemon) -> u64 {
    let pid = daemon.slot("m")["worker_pid"].as_u64().unwrap_or(0);
    assert!(pid > 0, "no worker: {:#}", daemon.slot("m"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the worker");
    wait_until("the slot to leave ready after the kill", || {
        (daemon.slot("m")["state"] != "ready").then_some(())
    });
    pid
}

/// One request with a gRPC deadline, read to its end; with the status when
/// it ended in an error (the record keeps only its code and message, the
/// test needs its metadata).
async fn send(address: &str, deadline: Duration) -> (RequestRecord, Option<tonic::Status>) {
    use tt_serving_proto::v1 as pb;
    let began = std::time::Instant::now();
    let work = async {
        let channel = chaos::connect(address).await?;
        let mut client = pb::inference_client::InferenceClient::new(channel);
        let mut request = tonic::Request::new(pb::GenerateRequest {
            model: "m".into(),
            input: Some(pb::generate_request::Input::Prompt("hello".into())),
            max_tokens: 4,
            ..Default::default()
        });
        request.set_timeout(deadline);
        let mut stream = client.generate(request).await?.into_inner();
        let mut tokens = 0;
        while let Some(chunk) = stream.message().await? {
            match chunk.chunk {
                Some(pb::generate_response::Chunk::Delta(d)) => tokens += d.token_ids.len(),
                Some(pb::generate_response::Chunk::Final(_)) => return Ok(tokens),
                _ => {}
            }
        }
        Err(tonic::Status::unknown("stream ended without a final chunk"))
    };
    // A guard well past the deadline turns a hang into a failure.
    let result = tokio::time::timeout(deadline + Duration::from_secs(60), work).await;
    let (end, status) = match result {
        Err(_) => (End::Hung, None),
        Ok(Ok(tokens)) => (End::Answered { tokens }, None),
        Ok(Err(status)) => (
            End::Errored {
                code: status.code(),
                message: status.message().into(),
            },
            Some(status),
        ),
    };
    let record = RequestRecord {
        end,
        took: began.elapsed(),
        deadline,
    };
    (record, status)
}

/// The retry pushback a refusal carries, in milliseconds.
fn pushback_ms(status: &tonic::Status) -> i64 {
    let value = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap_or_else(|| panic!("no grpc-retry-pushback-ms on {status:?}"));
    value
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("grpc-retry-pushback-ms {value:?} is not a number"))
}

fn waiting(daemon: &Daemon) -> f64 {
    chaos::scrape(daemon).sum("tt_serving_num_requests_waiting", &[("model", "m")])
}

#[test]
fn a_request_waits_for_the_recovering_replica_in_its_queue_place_and_is_answered() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(&hw, &model, "max_queue = 1");
    let address = daemon.inference_address();
    let rt = runtime();

    let killed = kill_worker(&daemon);
    let a = address.clone();
    let waiter = rt.spawn(async move { send(&a, Duration::from_secs(60)).await });
    // It waits in the queue (no slot is ready to take it)...
    wait_until("the request to wait in the queue", || {
        (waiting(&daemon) == 1.0).then_some(())
    });
    assert_ne!(daemon.slot("m")["state"], "ready");
    // ...holding the model's one place: the next one finds the queue full.
    let (full, status) = rt.block_on(send(&address, Duration::from_secs(60)));
    let status = status.unwrap_or_else(|| panic!("a second waiter was admitted: {full:?}"));
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_queue"), "{status:?}");
    // The first is answered by the new worker once the slot is back.
    let (answered, _) = rt.block_on(waiter).expect("request task");
    assert!(
        matches!(answered.end, End::Answered { .. }),
        "the waiting request ended {answered:?}"
    );
    let slot = daemon.wait_slot_state("m", "ready");
    assert_ne!(slot["worker_pid"].as_u64(), Some(killed), "{slot:#}");

    // A second kill: this time the daemon knows how long a recovery takes
    // (reset and a 3 s load), so a request whose deadline is shorter is
    // told at once, with a hint, rather than kept until its deadline.
    kill_worker(&daemon);
    let short = Duration::from_millis(1000);
    let (record, status) = rt.block_on(send(&address, short));
    println!("short-deadline request during the second recovery: {record:?}");
    chaos::assert_bounded(std::slice::from_ref(&record), Duration::ZERO, SLACK);
    match record.kind().as_str() {
        "Unavailable" => {
            let status = status.expect("a refusal");
            let ms = pushback_ms(&status);
            assert!((100..=30_000).contains(&ms), "pushback {ms} ms: {status:?}");
            assert!(
                status.message().contains("after this request's deadline"),
                "{status:?}"
            );
        }
        // Only if it arrived when the slot was nearly back.
        "DeadlineExceeded" | "ok" => {}
        other => panic!("a short-deadline request during a recovery ended {other}: {record:?}"),
    }
    daemon.wait_slot_state("m", "ready");
}

#[test]
fn with_the_wait_off_a_request_fails_at_once_with_a_retry_pushback() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(&hw, &model, "recovery_wait_secs = 0");
    let address = daemon.inference_address();
    let rt = runtime();

    kill_worker(&daemon);
    let (record, status) = rt.block_on(send(&address, Duration::from_secs(60)));
    let status = status.unwrap_or_else(|| panic!("the request was admitted: {record:?}"));
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("recovery_wait_secs = 0"),
        "{status:?}"
    );
    assert!(status.message().contains("retry in about"), "{status:?}");
    // The estimate comes from the first start (a 3 s load), bounded to
    // [100 ms, 30 s].
    let ms = pushback_ms(&status);
    assert!((100..=30_000).contains(&ms), "pushback {ms} ms: {status:?}");
    assert_eq!(waiting(&daemon), 0.0, "a refused request holds no place");
    daemon.wait_slot_state("m", "ready");
}

#[test]
fn a_quarantined_slot_is_not_waited_for_and_the_hint_says_not_to_retry() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(&hw, &model, "");
    let address = daemon.inference_address();
    let rt = runtime();
    // tt-smi -r exits 0, but the card never comes back: after the kill the
    // reset fails its proof and the slot is quarantined.
    hw.root
        .set_fault(&FakeHw::bdf(0), Fault::NeverReturns)
        .expect("set the fault");
    kill_worker(&daemon);
    // Sent during the reset, this one waits until the quarantine, then is
    // refused at once (not at its deadline).
    let a = address.clone();
    let early = rt.spawn(async move { send(&a, Duration::from_secs(60)).await });
    daemon.wait_slot_state("m", "quarantined");
    let (late, late_status) = rt.block_on(send(&address, Duration::from_secs(60)));
    let (early, early_status) = rt.block_on(early).expect("request task");
    for (record, status) in [(early, early_status), (late, late_status)] {
        let status = status.unwrap_or_else(|| panic!("admitted: {record:?}"));
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().contains("Quarantined"), "{status:?}");
        assert!(
            status.message().contains("no slot is on its way back"),
            "{status:?}"
        );
        assert_eq!(pushback_ms(&status), -1, "{status:?}");
    }
}

#[test]
fn a_slot_whose_start_never_succeeded_is_not_waited_for_between_attempts() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // Every start fails (as with a broken config); the slot retries every
    // 10 s by itself.
    let table = "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_EXIT_AT_START = \"3\" }\n[models.m.restart]\nbackoff_ms = 10000\n";
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, table),
            ..Default::default()
        },
    );
    wait_until("the first start to fail", || {
        let slot = daemon.slot("m");
        (slot["state"] == "failed" && slot["retry_at_unix_ms"].as_u64().unwrap_or(0) > 0)
            .then_some(())
    });
    let (record, status) =
        runtime().block_on(send(&daemon.inference_address(), Duration::from_secs(60)));
    let status = status.unwrap_or_else(|| panic!("the request was admitted: {record:?}"));
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("no slot has served yet"),
        "{status:?}"
    );
    // The hint is the wait for the next attempt.
    let ms = pushback_ms(&status);
    assert!((100..=10_000).contains(&ms), "pushback {ms} ms: {status:?}");
}
