//! The front door under slow, stuck and greedy clients (#54), end to end:
//! the real daemon, the real tt-worker on fake cards, real sockets.
//!
//! - gRPC streams whose client never reads: the client's HTTP/2 window is
//!   set to 512 bytes (`initial_stream_window_size`) and nothing is read,
//!   so flow control stops the daemon's writes after a few tokens, exactly
//!   as a stuck client's does; the router's buffer then fills and, after
//!   `inference.write_timeout_secs`, the request is cut and its place
//!   freed. A client that reads slowly but steadily on the same window is
//!   not cut.
//! - A body that never arrives gets 408 and its connection closed.
//! - A key over its `max_in_flight=N` is refused naming the key and cap.
//! - A request the model cannot start within its deadline (or the model's
//!   `max_queue_wait_secs`) is refused at once with `Retry-After`.
//!
//! The worker's hold file (`TTW_FAULT_HOLD_FILE`: while it exists the
//! engine takes no step) keeps requests in the batch for as long as a test
//! needs, without racing a clock.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tt_serving_proto::v1::generate_response::Chunk;
use tt_serving_proto::v1::inference_client::InferenceClient;
use tt_serving_proto::v1::{generate_request::Input, GenerateRequest};
use tt_serving_tests::chaos_support as chaos;
use tt_serving_tests::{
    curl, curl_with, generate, model_table, output_text, tiny_model, wait_until, Daemon,
    DaemonOptions, FakeHw,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A Generate stream on its own connection whose HTTP/2 window is
/// `window` bytes: the daemon may send no more than that until the client
/// reads.
async fn open_stream(
    address: &str,
    window: u32,
    max_tokens: u32,
) -> tonic::Streaming<tt_serving_proto::v1::GenerateResponse> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .initial_stream_window_size(window)
        .connect()
        .await
        .expect("connect to the public port");
    InferenceClient::new(channel)
        .generate(GenerateRequest {
            model: "m".into(),
            input: Some(Input::Prompt("a story about a stuck client".into())),
            max_tokens,
            ignore_eos: true,
            ..Default::default()
        })
        .await
        .expect("the stream starts")
        .into_inner()
}

/// Requests of model `m` counted with `outcome`.
fn outcome(daemon: &Daemon, outcome: &str) -> f64 {
    chaos::scrape(daemon).sum(
        "tt_serving_requests_total",
        &[("model", "m"), ("outcome", outcome)],
    )
}

fn running(daemon: &Daemon) -> f64 {
    chaos::scrape(daemon).sum("tt_serving_num_requests_running", &[("model", "m")])
}

/// A daemon serving model `m` (tiny, TP=1 on card 0) with `model_extra`
/// in its table and `extra` before it.
fn serve(hw: &FakeHw, dir: &Path, extra: &str, model_extra: &str) -> Daemon {
    let model = tiny_model(dir);
    let daemon = Daemon::start(
        hw,
        DaemonOptions {
            extra: format!(
                "{extra}\n{}",
                model_table("m", 1, &[0], &model, model_extra)
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    daemon
}

#[test]
fn streams_that_never_read_are_cut_and_free_the_models_places_for_others() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    // Two places, both to be taken by clients that never read.
    let daemon = serve(
        &hw,
        dir.path(),
        "[inference]\nwrite_timeout_secs = 2\n\n[limits]\nstream_buffer_chunks = 4\n",
        "max_in_flight = 2\n",
    );
    let address = daemon.inference_address();
    let rt = runtime();
    let mut stuck = Vec::new();
    for _ in 0..2 {
        stuck.push(rt.block_on(open_stream(&address, 512, 200)));
    }
    // Both hold a place now; neither reads.
    wait_until("both stuck streams to be running", || {
        (running(&daemon) == 2.0).then_some(())
    });

    // Another client is answered within a few seconds: the stuck ones are
    // cut after the 2 s write timeout and their places go to it.
    let asked = Instant::now();
    let answer = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(20), generate(&address, "m", "hello", 4)).await
        })
        .expect("another client's request is answered, not held behind the stuck ones")
        .expect("another client's request succeeds");
    assert!(!answer.tokens.is_empty(), "{answer:?}");
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "answered only after {waited:?}"
    );

    // Both were cut and counted; nothing runs; the slot is free.
    wait_until("the two stuck streams to be counted client_stalled", || {
        (outcome(&daemon, "client_stalled") == 2.0).then_some(())
    });
    assert_eq!(running(&daemon), 0.0, "a cut request still runs");
    assert_eq!(
        daemon.slot("m")["requests_in_flight"].as_u64(),
        Some(0),
        "{}",
        daemon.slot("m")
    );
    let log = daemon.log_text();
    assert!(
        log.contains("cut a client that took nothing of its stream")
            && log.contains("inference.write_timeout_secs"),
        "no log line for the stall: {log}"
    );

    // A stuck client that reads at last gets what was buffered, then an
    // error saying why its stream ended short.
    for mut stream in stuck {
        let ended = rt.block_on(async {
            let mut tokens = 0;
            loop {
                match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
                    Err(_) => panic!("a cut stream neither ends nor fails"),
                    Ok(Ok(Some(chunk))) => {
                        if let Some(Chunk::Delta(d)) = chunk.chunk {
                            tokens += d.token_ids.len();
                        }
                    }
                    Ok(Ok(None)) => panic!("a cut stream ended as if complete"),
                    Ok(Err(status)) => return (tokens, status),
                }
            }
        });
        let (tokens, status) = ended;
        assert!(tokens < 200, "the cut stream got all its tokens");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("inference.write_timeout_secs"),
            "{status:?}"
        );
    }

    // The ledger counts them as stalled.
    wait_until("the usage ledger to count the stalls", || {
        let out = daemon.ttctl(&["usage", "--json"]);
        let stalled: u64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|u| u["stalled"].as_u64())
            .sum();
        (stalled == 2).then_some(())
    });
}

#[test]
fn a_client_that_reads_slowly_but_steadily_is_not_cut() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = serve(
        &hw,
        dir.path(),
        "[inference]\nwrite_timeout_secs = 2\n\n[limits]\nstream_buffer_chunks = 4\n",
        "max_in_flight = 2\n",
    );
    let address = daemon.inference_address();
    let rt = runtime();
    // A message every 100 ms on a 512-byte window: the buffer stays full
    // (the engine is far faster), but the client keeps taking from it.
    let (tokens, finish) = rt.block_on(async {
        let mut stream = open_stream(&address, 512, 40).await;
        let mut tokens = 0;
        let mut finish = None;
        while let Some(chunk) = stream.message().await.expect("the slow stream is not cut") {
            match chunk.chunk {
                Some(Chunk::Delta(d)) => tokens += d.token_ids.len(),
                Some(Chunk::Final(f)) => finish = Some(f.finish_reason),
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (tokens, finish)
    });
    assert_eq!(tokens, 40, "the slow reader got every token");
    assert!(finish.is_some(), "the slow reader got the final chunk");
    assert_eq!(outcome(&daemon, "client_stalled"), 0.0);
    assert_eq!(outcome(&daemon, "ok"), 1.0);
}

#[test]
fn a_body_that_does_not_arrive_gets_408_and_its_connection_closed() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = serve(
        &hw,
        dir.path(),
        "[openai]\nlisten = \"127.0.0.1:0\"\nbody_read_timeout_secs = 1\n",
        "",
    );
    let door = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!door.is_empty(), "no openai_address in status");
    let mut stream = TcpStream::connect(&door).expect("connect to the door");
    // The head says 100 bytes; ten come, then nothing.
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: door\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\":"
    )
    .unwrap();
    let sent = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    // The door answers and closes: read to the end.
    let end = stream.read_to_end(&mut answer);
    let waited = sent.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(
        end.is_ok(),
        "the connection was not closed after the answer ({end:?}): {text}"
    );
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("openai.body_read_timeout_secs"), "{text}");
    assert!(
        waited < Duration::from_secs(5),
        "answered after {waited:?}: {text}"
    );
    // The door goes on serving others.
    let answer = curl(
        "POST",
        &format!("http://{door}/v1/completions"),
        None,
        Some(r#"{"model":"m","prompt":"hello","max_tokens":2}"#),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
}

const TEAM_A: &str = "sk-slow-clients-a-0001";
const TEAM_B: &str = "sk-slow-clients-b-0002";

/// A daemon with the OpenAI door, a tokens file (team-a capped at one
/// request in flight) and model `m` held by `hold` while it exists.
fn held_door(hw: &FakeHw, dir: &Path, hold: &Path, model_extra: &str) -> (Daemon, String) {
    use std::os::unix::fs::PermissionsExt;
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!("{TEAM_A} team-a max_in_flight=1\n{TEAM_B} team-b\n"),
    )
    .unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let daemon = serve(
        hw,
        dir,
        &format!(
            "[openai]\nlisten = \"127.0.0.1:0\"\n\n[inference]\ntokens_file = \"{}\"\n",
            tokens.display()
        ),
        &format!(
            "{model_extra}env = {{ TTW_TEST_FAULTS = \"1\", TTW_FAULT_HOLD_FILE = \"{}\" }}\n",
            hold.display()
        ),
    );
    let door = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!door.is_empty(), "no openai_address in status");
    (daemon, format!("http://{door}/v1/completions"))
}

const BODY: &str = r#"{"model":"m","prompt":"hello","max_tokens":2}"#;

#[test]
fn a_key_over_its_in_flight_cap_is_refused_naming_the_key_and_the_cap() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("hold");
    let (daemon, url) = held_door(&hw, dir.path(), &hold, "max_in_flight = 4\n");
    std::fs::write(&hold, "").unwrap();
    std::thread::scope(|s| {
        let first = s.spawn(|| curl("POST", &url, Some(TEAM_A), Some(BODY)));
        wait_until("team-a's first request to be running", || {
            (running(&daemon) == 1.0).then_some(())
        });
        // Team-a's second: refused at once, naming the key and its cap.
        let refused = curl("POST", &url, Some(TEAM_A), Some(BODY));
        assert_eq!(refused.status, 429, "{refused:?}");
        let error = refused.error();
        assert_eq!(error["code"], "key_in_flight_limit", "{error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("team-a") && message.contains("max_in_flight=1"),
            "{message}"
        );
        assert!(
            !message.contains(TEAM_A),
            "the refusal shows the token: {message}"
        );
        // Another key still gets a place of the same model.
        let other = s.spawn(|| curl("POST", &url, Some(TEAM_B), Some(BODY)));
        wait_until("team-b's request to be running beside team-a's", || {
            (running(&daemon) == 2.0).then_some(())
        });
        std::fs::remove_file(&hold).unwrap();
        for answer in [first.join().unwrap(), other.join().unwrap()] {
            assert_eq!(answer.status, 200, "{answer:?}");
        }
    });
    // Its place back, team-a is served again.
    let again = curl("POST", &url, Some(TEAM_A), Some(BODY));
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(outcome(&daemon, "key_limit"), 1.0);
}

#[test]
fn a_request_that_cannot_start_in_time_is_refused_at_once_with_retry_after() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("hold");
    let (daemon, url) = held_door(
        &hw,
        dir.path(),
        &hold,
        "max_in_flight = 1\nmax_queue_wait_secs = 1\n",
    );
    // Teach the queue how long a request holds its place: one held 1.5 s.
    std::fs::write(&hold, "").unwrap();
    std::thread::scope(|s| {
        let first = s.spawn(|| curl("POST", &url, Some(TEAM_B), Some(BODY)));
        wait_until("the first request to be running", || {
            (running(&daemon) == 1.0).then_some(())
        });
        std::thread::sleep(Duration::from_millis(1500));
        std::fs::remove_file(&hold).unwrap();
        assert_eq!(first.join().unwrap().status, 200);
    });

    // The one place taken again; a request that must start within 300 ms
    // is refused at once, with when to come back.
    std::fs::write(&hold, "").unwrap();
    std::thread::scope(|s| {
        let running_one = s.spawn(|| curl("POST", &url, Some(TEAM_B), Some(BODY)));
        wait_until("a request to hold the only place", || {
            (running(&daemon) == 1.0).then_some(())
        });
        let asked = Instant::now();
        let refused = curl_with(
            "POST",
            &url,
            Some(TEAM_B),
            Some(BODY),
            &[("x-request-timeout-ms", "300")],
        );
        let took = asked.elapsed();
        assert_eq!(refused.status, 503, "{refused:?}");
        assert_eq!(refused.error()["code"], "overloaded", "{refused:?}");
        let message = refused.error()["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            message.contains("`m`") && message.contains("deadline (300 ms)"),
            "{message}"
        );
        assert!(refused.header("retry-after").is_some(), "{refused:?}");
        assert!(
            took < Duration::from_millis(1000),
            "refused only after {took:?}"
        );

        // Without a deadline the model's own queue wait bounds it.
        let refused = curl("POST", &url, Some(TEAM_B), Some(BODY));
        assert_eq!(refused.status, 503, "{refused:?}");
        let message = refused.error()["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            message.contains("models.m.max_queue_wait_secs"),
            "{message}"
        );
        assert!(refused.header("retry-after").is_some(), "{refused:?}");

        std::fs::remove_file(&hold).unwrap();
        assert_eq!(running_one.join().unwrap().status, 200);
    });
    // Refused ones cost nothing: with the place free, requests are served.
    let served = curl("POST", &url, Some(TEAM_B), Some(BODY));
    assert_eq!(served.status, 200, "{served:?}");
    assert_eq!(outcome(&daemon, "overloaded"), 2.0);
    let out = daemon.ttctl(&["status"]);
    assert!(out.status.success(), "{}", output_text(&out));
}
