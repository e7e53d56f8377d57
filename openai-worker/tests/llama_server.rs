//! The worker running llama.cpp's real `llama-server` with the real
//! SmolLM2 GGUF: the engine a machine without cards can run. Needs
//! `TT_LLAMA_SERVER` (`export TT_LLAMA_SERVER="$(scripts/llama-server.sh)"`,
//! a ~10 minute build cached under ~/.cache/tt-serving/) and the model
//! (`TT_SMOLLM2_GGUF`, or the default path scripts/fetch-smollm2.sh uses).
//! Without `TT_LLAMA_SERVER` each test says so loudly and passes; under CI
//! (`CI` set) it fails instead, so CI cannot skip it silently.

mod common;

use common::*;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tt_serving_proto::v1 as pb;

fn llama_server() -> Option<(PathBuf, PathBuf)> {
    let Some(server) = std::env::var_os("TT_LLAMA_SERVER") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but TT_LLAMA_SERVER is not: export TT_LLAMA_SERVER=\"$(scripts/llama-server.sh)\" before the tests"
        );
        // Straight to stderr, past the test harness's capture: a skip must
        // be seen even when the test "passes".
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: TT_LLAMA_SERVER is not set, so the llama-server tests did not run; \
             export TT_LLAMA_SERVER=\"$(scripts/llama-server.sh)\" (a ~10 minute build, cached) to run them"
        );
        return None;
    };
    let server = PathBuf::from(server);
    assert!(
        server.is_file(),
        "TT_LLAMA_SERVER={} is not a file; rebuild it with scripts/llama-server.sh",
        server.display()
    );
    let model = std::env::var_os("TT_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/tt-serving/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        model.is_file(),
        "the SmolLM2 GGUF is not at {}; run scripts/fetch-smollm2.sh and export TT_SMOLLM2_GGUF=\"$(scripts/fetch-smollm2.sh)\"",
        model.display()
    );
    Some((server, model))
}

fn llama(server: &std::path::Path, model: &std::path::Path) -> Opts {
    let mut o = Opts::vllm().arg("--engine").arg("llama-server");
    o.checkpoint = model.display().to_string();
    o.engine = [
        &server.display().to_string(),
        "-m",
        "{checkpoint}",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "-c",
        "2048",
        "-np",
        "2",
        "--metrics",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    o
}

/// The llama-server process (the worker's child) and its port.
fn engine_of(w: &Worker) -> (i32, u16) {
    let kids = children(w.child.id() as i32);
    let pid = *kids.first().expect("the worker has no engine child");
    let port = cmdline_value(pid, "--port")
        .and_then(|p| p.parse().ok())
        .expect("no --port in llama-server's command line");
    (pid, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_serves_a_prompt_and_a_chat_through_the_worker() {
    let Some((server, model)) = llama_server() else {
        return;
    };
    let w = Worker::start(&llama(&server, &model)).await;
    let info = w.info().await.unwrap();
    assert!(info.context_length > 0, "{info:?}");
    assert!(!info.model_name.is_empty());
    assert!(info.engine_version.contains("llama-server"), "{info:?}");
    let mut c = w.client().await;
    let out = run(&mut c, prompt_request("The capital of France is", 8))
        .await
        .unwrap();
    assert!(!out.text.is_empty(), "{out:?}");
    let usage = out.final_.usage.unwrap();
    assert!(usage.prompt_tokens >= 5, "{usage:?}");
    // Eight tokens, unless the model ended its answer first.
    let length = out.final_.finish_reason == pb::FinishReason::Length as i32;
    assert!(
        (length && usage.completion_tokens == 8)
            || (!length && (1..8).contains(&usage.completion_tokens)),
        "{out:?}"
    );
    // Its OpenAI endpoints return no token ids: one delta per token.
    assert!(out.ids.is_empty());
    // Greedy is deterministic.
    let again = run(&mut c, prompt_request("The capital of France is", 8))
        .await
        .unwrap();
    assert_eq!(again.text, out.text);
    let chat = run(&mut c, chat_request(&[("user", "Say hello.")], 16))
        .await
        .unwrap();
    assert!(!chat.text.trim().is_empty(), "{chat:?}");
    assert!(chat.final_.usage.unwrap().prompt_tokens > 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_aborts_a_dropped_stream() {
    let Some((server, model)) = llama_server() else {
        return;
    };
    let w = Worker::start(&llama(&server, &model)).await;
    let (_, port) = engine_of(&w);
    let mut c = w.client().await;
    // ignore_eos: the story cannot end before the stream is dropped.
    let mut request = prompt_request("Write a very long story about a dragon.", 1500);
    if let Some(r) = request.request.as_mut() {
        r.ignore_eos = true;
    }
    let mut stream = c.generate(request).await.unwrap().into_inner();
    stream.message().await.unwrap().unwrap();
    wait_until(
        "llama-server to count the request",
        Duration::from_secs(10),
        || engine_gauge(port, "llamacpp:requests_processing") == 1.0,
    );
    drop(stream);
    drop(c);
    wait_until(
        "llama-server to free the slot",
        Duration::from_secs(10),
        || engine_gauge(port, "llamacpp:requests_processing") == 0.0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_stops_with_the_worker_and_its_death_is_named() {
    let Some((server, model)) = llama_server() else {
        return;
    };
    let mut w = Worker::start(&llama(&server, &model)).await;
    let (pid, _) = engine_of(&w);
    let mut c = w.client().await;
    c.shutdown(pb::ShutdownRequest {
        drain_timeout_ms: 1000,
    })
    .await
    .unwrap();
    assert_eq!(w.wait_exit(Duration::from_secs(30)).code(), Some(0));
    assert!(!group_alive(pid));

    let mut w = Worker::start(&llama(&server, &model)).await;
    let (pid, _) = engine_of(&w);
    let started = Instant::now();
    kill(pid, libc::SIGKILL);
    let st = w.wait_exit(Duration::from_secs(30));
    assert_eq!(st.code(), Some(137), "{}", w.output());
    assert!(w.stderr().contains("was killed by SIGKILL"));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!group_alive(pid));
}
