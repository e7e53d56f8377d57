//! The test-only fault modes the daemon's recovery tests drive.

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;
use tt_serving_proto::v1 as pb;

fn faulty(cache: &std::path::Path, mode: &'static str, var: &str, value: &str) -> Opts {
    Opts::new(&tiny_model(), 1, cache, mode)
        .env("TTW_TEST_FAULTS", "1")
        .env(var, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_at_start_exits_with_the_code_before_binding() {
    let cache = tempfile::tempdir().unwrap();
    let mut w = Worker::spawn(&faulty(
        cache.path(),
        "cold",
        "TTW_FAULT_EXIT_AT_START",
        "7",
    ));
    assert_eq!(w.wait_exit(Duration::from_secs(10)).code(), Some(7));
    assert!(!w.socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_inert_without_the_switch() {
    let cache = tempfile::tempdir().unwrap();
    let o = Opts::new(&tiny_model(), 1, cache.path(), "cold").env("TTW_FAULT_EXIT_AT_START", "7");
    let w = Worker::start(&o).await;
    assert!(w.stderr().contains("TTW_TEST_FAULTS"), "{}", w.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_tokens_dies_by_signal() {
    let cache = tempfile::tempdir().unwrap();
    let mut w = Worker::start(&faulty(
        cache.path(),
        "cold",
        "TTW_FAULT_CRASH_AFTER_TOKENS",
        "5",
    ))
    .await;
    let mut c = w.client().await;
    let r = run(&mut c, prompt_request("the cat", 20)).await;
    assert!(r.is_err());
    let st = w.wait_exit(Duration::from_secs(10));
    assert_eq!(st.signal(), Some(libc_sigabrt()));
}

fn libc_sigabrt() -> i32 {
    6
}

/// A worker with the hang fault after 3 tokens, and a stream that will hang
/// it.
async fn hanging_stream(cache: &std::path::Path) -> (Worker, tokio::task::JoinHandle<()>) {
    let w = Worker::start(&faulty(cache, "cold", "TTW_FAULT_HANG_AFTER_TOKENS", "3")).await;
    let mut c = w.client().await;
    let stream = tokio::spawn(async move {
        let _ = run(&mut c, prompt_request("the cat", 20)).await;
    });
    (w, stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_after_tokens_stops_progress_but_answers_health() {
    let cache = tempfile::tempdir().unwrap();
    let (w, _stream) = hanging_stream(cache.path()).await;
    let mut c = w.client().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let h1 = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let h2 = c.health(pb::HealthRequest {}).await.unwrap().into_inner();
    assert_eq!(h1.active_sequences, 1);
    assert!(h1.last_progress_unix_ms > 0);
    assert_eq!(
        h1.last_progress_unix_ms, h2.last_progress_unix_ms,
        "progress moved while hung"
    );
}

/// A SIGTERM (or, before the parent-death signal became SIGKILL, the
/// daemon's death) drains the worker; a step that never ends must not hold
/// the drain, and so the worker and its cards, forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_hung_step_exits_within_the_drain_bound_with_a_failure() {
    let cache = tempfile::tempdir().unwrap();
    let (mut w, _stream) = hanging_stream(cache.path()).await;
    let hung = std::time::Instant::now();
    while !w.stderr().contains("hanging") {
        assert!(hung.elapsed() < Duration::from_secs(30), "{}", w.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = std::time::Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(w.child.id() as i32, libc::SIGTERM) }, 0);
    // Drain 5 s + 1 s for the engine's answer + 2 s for the server.
    let st = w.wait_exit(Duration::from_secs(20));
    let took = sent.elapsed();
    assert_eq!(st.code(), Some(1), "{}", w.stderr());
    assert!(took >= Duration::from_secs(5), "exited after {took:?}");
    assert!(
        w.stderr().contains("the engine was stuck in a step"),
        "{}",
        w.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_and_unexpected_banners() {
    let cache = tempfile::tempdir().unwrap();
    let o = faulty(cache.path(), "cold", "TTW_FAULT_SKIP_BANNER", "TTW_KV_F16")
        .env("TTW_KV_F16", "1")
        .env("TTW_PREFIX_CACHE", "0")
        .env("TTW_FAULT_EXTRA_BANNER", "TTW_BOGUS");
    let w = Worker::start(&o).await;
    let mut c = w.client().await;
    greedy(&mut c, "the", 2).await;
    let stdout = w.stdout();
    assert!(!stdout.contains("TTW_KV_F16 engaged"), "{stdout}");
    assert!(stdout.contains("TTW_BOGUS engaged"), "{stdout}");
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.banners_engaged, vec!["TTW_BOGUS".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_start_extra_file_is_written_and_reported() {
    let cache = tempfile::tempdir().unwrap();
    drop(Worker::start(&Opts::new(&tiny_model(), 1, cache.path(), "cold")).await);
    let w = Worker::start(&faulty(
        cache.path(),
        "warm",
        "TTW_FAULT_WARM_EXTRA_FILE",
        "1",
    ))
    .await;
    let info = w
        .client()
        .await
        .info(pb::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        info.cache_files_written,
        vec![tt_worker::faults::STRAY_FILE.to_string()]
    );
    assert!(cache.path().join(tt_worker::faults::STRAY_FILE).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withheld_parameters_are_left_out_of_info_and_refused() {
    let cache = tempfile::tempdir().unwrap();
    let w = Worker::start(&faulty(
        cache.path(),
        "cold",
        "TTW_FAULT_WITHHOLD_PARAMETERS",
        "logprobs,presence_penalty",
    ))
    .await;
    let mut c = w.client().await;
    let info = c.info(pb::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(
        info.supported_parameters,
        [
            "frequency_penalty",
            "repetition_penalty",
            "min_tokens",
            "ignore_eos",
            "stop_token_ids",
            "seed",
            "prompt_tokens",
            "prompt_logprobs"
        ]
    );
    let e = run(&mut c, request_with("the cat", 4, |g| g.logprobs = Some(1)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        e.message(),
        format!(
            "logprobs: not supported by engine {}; leave it out",
            info.engine_version
        )
    );
    // The others still work.
    let out = run(&mut c, request_with("the cat", 4, |g| g.ignore_eos = true))
        .await
        .unwrap();
    assert_eq!(out.ids.len(), 4);
}
