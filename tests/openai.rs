//! The OpenAI-compatible front door (`[openai] listen`), through real
//! clients: the official `openai` Python SDK (from PyPI, in the venv of
//! `scripts/grpcio-python.sh`) and `curl`, against the real daemon and
//! `tt-worker` on fake cards. What is checked is what an OpenAI user sees:
//! bodies, SSE framing, status codes, error JSON, `Retry-After`, and that a
//! client going away cancels its sequence at the worker.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tt_serving_tests::chaos_support as chaos;
use tt_serving_tests::{
    curl, model_table, output_text, sdk_python, tiny_model, wait_until, Daemon, DaemonOptions,
    FakeHw,
};

const TOKEN: &str = "sk-openai-test-token-1234";

/// A tokens file the daemon accepts (mode 0600).
fn tokens_file(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("tokens");
    std::fs::write(&path, format!("# clients\n{TOKEN}\n")).expect("write tokens");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path
}

/// A daemon with the front door on a free port, bearer tokens, and `models`
/// (model tables; `[limits]` and other tables may come first in `before`).
fn start(hw: &FakeHw, secrets: &Path, before: &str, models: String) -> Daemon {
    let tokens = tokens_file(secrets);
    Daemon::start(
        hw,
        DaemonOptions {
            extra: format!(
                "[openai]\nlisten = \"127.0.0.1:0\"\n\n[inference]\ntokens_file = \"{}\"\n{before}\n{models}",
                tokens.display()
            ),
            ..Default::default()
        },
    )
}

/// `http://host:port` of the front door, from `ttctl status`.
fn base(daemon: &Daemon) -> String {
    let address = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        !address.is_empty(),
        "status shows no openai_address: {:#}",
        daemon.status()["daemon"]
    );
    format!("http://{address}")
}

/// A streamed `/v1/completions` left running in a background curl (to hold
/// a place, or to be killed as a client that leaves).
fn stream_in_background(base: &str, body: &str) -> std::process::Child {
    Command::new("curl")
        .args(["-sS", "-N", "--http1.1", "-X", "POST"])
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .args(["-H", "Content-Type: application/json", "-d", body])
        .arg(format!("{base}/v1/completions"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start curl")
}

/// The real model when CI provides it (words the SDK checks can read),
/// else the tiny synthetic one.
fn model_file(dir: &Path) -> PathBuf {
    match std::env::var_os("TT_SMOLLM2_GGUF") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => tiny_model(dir),
    }
}

#[test]
fn the_openai_python_sdk_completes_chats_streams_and_gets_typed_errors() {
    let Some(python) = sdk_python() else { return };
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path());
    let daemon = start(
        &hw,
        dir.path(),
        "",
        model_table("smol", 1, &[0], &model, ""),
    );
    daemon.wait_slot_state("smol", "ready");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/openai_sdk.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("{}/v1", base(&daemon)))
        .arg("smol")
        .arg(TOKEN)
        .stdin(Stdio::null())
        .output()
        .expect("run the openai SDK client");
    let text = output_text(&out);
    assert!(
        out.status.success(),
        "the openai SDK client failed:\n{text}"
    );
    let r: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {text}"));
    eprintln!("openai SDK: {r:#}");

    assert_eq!(r["models"], serde_json::json!(["smol"]));

    let c = &r["completion"];
    assert_eq!(c["object"], "text_completion");
    assert!(!c["text"].as_str().unwrap_or_default().is_empty(), "{c}");
    assert!(c["prompt_tokens"].as_u64().unwrap_or(0) > 0, "{c}");
    let completion_tokens = c["completion_tokens"].as_u64().unwrap_or(0);
    assert!((1..=8).contains(&completion_tokens), "{c}");
    assert_eq!(
        c["total_tokens"].as_u64(),
        Some(c["prompt_tokens"].as_u64().unwrap_or(0) + completion_tokens)
    );
    // The SDK finds the prompt tokens the engine's prefix cache supplied
    // where OpenAI puts them, in every usage: at most the prompt.
    for usage in [&r["completion"], &r["completion_stream"], &r["chat"]] {
        let cached = usage["cached_tokens"].as_u64();
        assert!(
            cached.is_some_and(|n| n <= usage["prompt_tokens"].as_u64().unwrap_or(0)),
            "usage.prompt_tokens_details.cached_tokens: {usage}"
        );
    }
    assert!(["stop", "length"].contains(&c["finish_reason"].as_str().unwrap_or("")));
    // Greedy: the stream carries the same text, and its usage chunk the same
    // counts.
    let s = &r["completion_stream"];
    assert_eq!(s["text"], c["text"], "{s}");
    assert_eq!(s["finish_reason"], c["finish_reason"], "{s}");
    assert_eq!(s["prompt_tokens"], c["prompt_tokens"], "{s}");
    assert_eq!(s["completion_tokens"], c["completion_tokens"], "{s}");
    assert!(
        s["chunks"].as_u64().unwrap_or(0) >= 3,
        "text, finish, usage: {s}"
    );

    let chat = &r["chat"];
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["role"], "assistant");
    assert!(!chat["content"].as_str().unwrap_or_default().is_empty());
    assert!(chat["completion_tokens"].as_u64().unwrap_or(0) <= 6);
    let chat_stream = &r["chat_stream"];
    assert_eq!(chat_stream["content"], chat["content"], "{chat_stream}");
    assert_eq!(chat_stream["roles"], serde_json::json!(["assistant"]));
    assert_eq!(chat_stream["finish_reason"], chat["finish_reason"]);

    assert_eq!(
        r["ignore_eos_tokens"], 12,
        "ignore_eos gives exactly max_tokens"
    );
    let lp = &r["completion_logprobs"];
    assert_eq!(lp["top"], serde_json::json!([2, 2, 2]), "{lp}");
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .map(|t| t.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(tokens.concat(), lp["text"].as_str().unwrap_or("?"), "{lp}");
    assert!(lp["token_logprobs"]
        .as_array()
        .is_some_and(|l| l.iter().all(|x| x.as_f64().is_some_and(|v| v <= 0.0))));
    let chat_lp = &r["chat_logprobs"];
    assert_eq!(chat_lp["top"], serde_json::json!([3, 3, 3]), "{chat_lp}");
    assert_eq!(
        chat_lp["first_is_top"], true,
        "greedy picks the most likely: {chat_lp}"
    );

    assert_eq!(r["raw"]["status"], 200);
    assert_eq!(r["raw"]["content_type"], "application/json");

    let expect = |name: &str, class: &str, status: u64, param: Option<&str>| {
        let e = &r[name];
        assert_eq!(e["class"], class, "{name}: {e}");
        assert_eq!(e["status"], status, "{name}: {e}");
        if let Some(param) = param {
            assert_eq!(e["param"], param, "{name}: {e}");
            assert!(
                e["message"].as_str().unwrap_or_default().contains(param),
                "{name}: the message names {param}: {e}"
            );
        }
    };
    expect("unknown_model", "NotFoundError", 404, Some("model"));
    assert!(
        r["unknown_model"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("known models: smol"),
        "{}",
        r["unknown_model"]
    );
    expect("refused_param", "BadRequestError", 400, Some("logit_bias"));
    expect("bad_type", "BadRequestError", 400, Some("max_tokens"));
    expect("unknown_field", "BadRequestError", 400, Some("frobnicate"));
    expect("n_two", "BadRequestError", 400, Some("n"));
    expect("wrong_token", "AuthenticationError", 401, None);
}

/// The events of an SSE body: each `data:` payload, in order. Every event
/// is one `data: ...` line followed by a blank line, as OpenAI frames them.
fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "the stream ends with an event: {body:?}"
    );
    body.trim_end()
        .split("\n\n")
        .map(|event| {
            let payload = event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("an event that is not one data line: {event:?}"));
            assert!(!payload.contains('\n'), "one line per event: {event:?}");
            payload.to_string()
        })
        .collect()
}

#[test]
fn curl_sees_openai_sse_framing_usage_and_done() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(&hw, dir.path(), "", model_table("m", 1, &[0], &model, ""));
    daemon.wait_slot_state("m", "ready");
    let base = base(&daemon);

    let answer = curl(
        "POST",
        &format!("{base}/v1/chat/completions"),
        Some(TOKEN),
        Some(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}"#,
        ),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&answer.body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
        .collect();
    // First the role, then text deltas, the finish, and the usage chunk.
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let id = chunks[0]["id"].clone();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["id"], id, "one id for the whole stream: {c}");
        assert_eq!(c["model"], "m");
    }
    let finishes: Vec<&serde_json::Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finishes.len(), 1, "{chunks:?}");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], serde_json::json!([]), "{usage}");
    assert_eq!(usage["usage"]["completion_tokens"], 5, "{usage}");
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 0);
    assert!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64(),
        "usage.prompt_tokens_details.cached_tokens, as OpenAI sends it: {usage}"
    );

    // Without stream_options: no usage chunk.
    let answer = curl(
        "POST",
        &format!("{base}/v1/completions"),
        Some(TOKEN),
        Some(r#"{"model":"m","prompt":"hello","max_tokens":3,"temperature":0,"stream":true}"#),
    );
    let events = sse_events(&answer.body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert!(
        events.iter().all(|e| !e.contains("\"usage\"")),
        "{events:?}"
    );
}

#[test]
fn bad_requests_get_openai_errors_with_the_matching_status() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let daemon = start(
        &hw,
        dir.path(),
        "[limits]\nmax_prompt_bytes = 4096\n",
        model_table("m", 1, &[0], &model, ""),
    );
    daemon.wait_slot_state("m", "ready");
    let base = base(&daemon);
    let completions = format!("{base}/v1/completions");
    let post = |token: Option<&str>, body: &str| curl("POST", &completions, token, Some(body));

    let no_token = post(None, r#"{"model":"m","prompt":"x"}"#);
    assert_eq!(no_token.status, 401, "{no_token:?}");
    assert_eq!(no_token.error()["type"], "authentication_error");
    let wrong = post(Some("not-the-token"), r#"{"model":"m","prompt":"x"}"#);
    assert_eq!(wrong.status, 401, "{wrong:?}");
    assert!(
        !wrong.body.contains("not-the-token"),
        "a wrong token is not echoed: {wrong:?}"
    );

    let bad_json = post(Some(TOKEN), r#"{"model":"m","prompt":"#);
    assert_eq!(bad_json.status, 400, "{bad_json:?}");
    assert!(bad_json.error()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("not valid JSON"));

    let missing = post(Some(TOKEN), r#"{"model":"m"}"#);
    assert_eq!(missing.status, 400, "{missing:?}");
    assert!(missing.error()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("prompt"));

    let wrong_type = post(
        Some(TOKEN),
        r#"{"model":"m","prompt":"x","temperature":"hot"}"#,
    );
    assert_eq!(wrong_type.status, 400, "{wrong_type:?}");
    assert_eq!(wrong_type.error()["param"], "temperature");

    let penalty = post(
        Some(TOKEN),
        r#"{"model":"m","prompt":"x","logit_bias":{"1":2}}"#,
    );
    assert_eq!(penalty.status, 400, "{penalty:?}");
    assert_eq!(penalty.error()["param"], "logit_bias");

    let chat_style = post(Some(TOKEN), r#"{"model":"m","prompt":"x","logprobs":true}"#);
    assert_eq!(chat_style.status, 400, "{chat_style:?}");
    assert_eq!(chat_style.error()["param"], "logprobs");

    let unknown = post(Some(TOKEN), r#"{"model":"nope","prompt":"x"}"#);
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert_eq!(unknown.error()["code"], "model_not_found");
    assert!(unknown.error()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("known models: m"));

    // A prompt over limits.max_prompt_bytes but inside the body limit is
    // the router's 400; a body over the body limit is refused while read.
    let long = post(
        Some(TOKEN),
        &format!(r#"{{"model":"m","prompt":"{}"}}"#, "a".repeat(5000)),
    );
    assert_eq!(long.status, 400, "{long:?}");
    assert!(long.body.contains("limits.max_prompt_bytes"), "{long:?}");
    let huge = post(
        Some(TOKEN),
        &format!(r#"{{"model":"m","prompt":"{}"}}"#, "a".repeat(2 << 20)),
    );
    assert_eq!(huge.status, 413, "{:?}", huge.status);
    assert!(
        huge.body.contains("limits.max_prompt_bytes"),
        "{}",
        huge.body
    );

    let nowhere = curl("GET", &format!("{base}/v2/things"), Some(TOKEN), None);
    assert_eq!(nowhere.status, 404, "{nowhere:?}");
    assert!(nowhere.body.contains("/v1/chat/completions"));

    // Still serving after all that.
    let ok = post(
        Some(TOKEN),
        r#"{"model":"m","prompt":"x","max_tokens":2,"temperature":0}"#,
    );
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json()["usage"]["completion_tokens"], 2);
}

/// A parameter the serving engine does not take is a 400 naming the
/// parameter and the engine, never ignored, and at once: not after
/// waiting for a place behind a request that holds the only one.
#[test]
fn a_parameter_the_engine_lacks_is_refused_naming_it_and_the_engine() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // The ping takes 4 tokens, the served request 3; the next one hangs.
    let table = "max_in_flight = 1\nenv = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_WITHHOLD_PARAMETERS = \"presence_penalty\", TTW_FAULT_HANG_AFTER_TOKENS = \"8\" }\n";
    let daemon = start(
        &hw,
        dir.path(),
        "",
        model_table("m", 1, &[0], &model, table),
    );
    daemon.wait_slot_state("m", "ready");
    let url = format!("{}/v1/chat/completions", base(&daemon));
    // What the engine takes is served.
    let served = curl(
        "POST",
        &url,
        Some(TOKEN),
        Some(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"frequency_penalty":0.5,"max_tokens":3,"ignore_eos":true}"#,
        ),
    );
    assert_eq!(served.status, 200, "{served:?}");
    // The only place taken by a request that hangs.
    let mut holder = stream_in_background(
        &base(&daemon),
        r#"{"model":"m","prompt":"hello","max_tokens":50,"stream":true}"#,
    );
    wait_until("the place to be taken", || {
        (chaos::scrape(&daemon).sum("tt_serving_num_requests_running", &[("model", "m")]) == 1.0)
            .then_some(())
    });
    let asked = Instant::now();
    let refused = curl(
        "POST",
        &url,
        Some(TOKEN),
        Some(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"presence_penalty":0.5}"#),
    );
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "refused at once: {:?}",
        asked.elapsed()
    );
    let error = refused.error();
    assert_eq!(error["param"], "presence_penalty", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("engine tt-worker"),
        "{error}"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn health_and_models_follow_readiness_and_a_model_without_a_replica_gets_503() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    // `broken` never starts: its checkpoint does not exist.
    let models = format!(
        "{}{}",
        model_table("m", 1, &[0], &model, ""),
        model_table("broken", 1, &[1], Path::new("/nonexistent/b.gguf"), "")
    );
    let daemon = start(&hw, dir.path(), "", models);
    daemon.wait_slot_state("m", "ready");
    let base = base(&daemon);

    // /health needs no token, like gRPC health.
    let health = curl("GET", &format!("{base}/health"), None, None);
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(health.json()["ready_slots"], serde_json::json!(["m"]));
    let broken = curl("GET", &format!("{base}/health?model=broken"), None, None);
    assert_eq!(broken.status, 503, "{broken:?}");
    assert!(broken.json()["reason"]
        .as_str()
        .unwrap_or_default()
        .contains("slot broken is"));
    let unknown = curl("GET", &format!("{base}/health?model=zzz"), None, None);
    assert_eq!(unknown.status, 404, "{unknown:?}");

    let models = curl("GET", &format!("{base}/v1/models"), Some(TOKEN), None).json();
    let entry = |name: &str| {
        models["data"]
            .as_array()
            .and_then(|d| d.iter().find(|m| m["id"] == name).cloned())
            .unwrap_or_else(|| panic!("{name} in {models}"))
    };
    assert_eq!(entry("m")["max_model_len"], 256);
    assert_eq!(entry("m")["ready_replicas"], 1);
    // What a client may ask of the engine: tt-worker takes all seven.
    let params = entry("m")["supported_parameters"].clone();
    for p in ["presence_penalty", "ignore_eos", "min_tokens", "logprobs"] {
        assert!(
            params.as_array().is_some_and(|a| a.iter().any(|x| x == p)),
            "{p} in {params}"
        );
    }
    assert_eq!(
        entry("broken")["supported_parameters"],
        serde_json::json!([])
    );
    assert!(entry("broken")["max_model_len"].is_null());

    let refused = curl(
        "POST",
        &format!("{base}/v1/completions"),
        Some(TOKEN),
        Some(r#"{"model":"broken","prompt":"x"}"#),
    );
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.error()["type"], "unavailable_error");
    assert!(refused.error()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("broken"));
}

/// A worker that hangs after 8 tokens (the readiness ping takes 4): its one
/// place taken and the queue full: 429 with
/// `Retry-After`. Then a client that disconnects mid-stream: its sequence
/// is cancelled at the worker (the daemon's running gauge drops and the
/// request counts as `cancelled`), as over gRPC.
#[test]
fn a_full_queue_is_429_and_a_client_that_leaves_cancels_its_sequence() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let table = "max_in_flight = 1\nmax_queue = 1\nenv = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_HANG_AFTER_TOKENS = \"8\" }\n";
    let daemon = start(
        &hw,
        dir.path(),
        "",
        model_table("m", 1, &[0], &model, table),
    );
    daemon.wait_slot_state("m", "ready");
    let base = base(&daemon);
    let body = r#"{"model":"m","prompt":"hello","max_tokens":50,"temperature":0,"stream":true}"#;

    // Two streams: one running (hung after 2 tokens), one queued.
    let spawn_stream = || stream_in_background(&base, body);
    let mut running = spawn_stream();
    let scrape = || chaos::scrape(&daemon);
    wait_until("one request running", || {
        (scrape().sum("tt_serving_num_requests_running", &[("model", "m")]) == 1.0).then_some(())
    });
    let mut queued = spawn_stream();
    wait_until("one request waiting", || {
        (scrape().sum("tt_serving_num_requests_waiting", &[("model", "m")]) == 1.0).then_some(())
    });
    let full = curl(
        "POST",
        &format!("{base}/v1/completions"),
        Some(TOKEN),
        Some(r#"{"model":"m","prompt":"x","max_tokens":1}"#),
    );
    assert_eq!(full.status, 429, "{full:?}");
    assert_eq!(full.error()["type"], "rate_limit_error");
    let retry: u64 = full
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("Retry-After: {full:?}"));
    assert!(retry >= 1);

    // The clients leave: both sequences end at the worker.
    let started = Instant::now();
    for child in [&mut queued, &mut running] {
        child.kill().expect("kill curl");
        child.wait().expect("reap curl");
    }
    wait_until("the cancelled requests to leave the worker", || {
        let m = scrape();
        (m.sum("tt_serving_num_requests_running", &[("model", "m")]) == 0.0
            && m.sum("tt_serving_num_requests_waiting", &[("model", "m")]) == 0.0
            && m.sum(
                "tt_serving_requests_total",
                &[("model", "m"), ("outcome", "cancelled")],
            ) == 2.0)
            .then_some(())
    });
    assert!(started.elapsed() < Duration::from_secs(30));

    // A deadline (x-request-timeout-ms) that passes while the worker hangs
    // is a 504; a malformed one is a 400 naming the header.
    let deadline = |value: &str| {
        let out = Command::new("curl")
            .args(["-sS", "-i", "--http1.1", "--max-time", "60", "-X", "POST"])
            .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
            .args(["-H", &format!("x-request-timeout-ms: {value}")])
            .args(["-H", "Content-Type: application/json", "-d"])
            .arg(r#"{"model":"m","prompt":"hi","max_tokens":20}"#)
            .arg(format!("{base}/v1/completions"))
            .output()
            .expect("run curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let asked = Instant::now();
    let late = deadline("1500");
    assert!(late.starts_with("HTTP/1.1 504"), "{late}");
    assert!(late.contains("timeout_error"), "{late}");
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    let malformed = deadline("soon");
    assert!(malformed.starts_with("HTTP/1.1 400"), "{malformed}");
    assert!(malformed.contains("x-request-timeout-ms"), "{malformed}");

    let health = curl("GET", &format!("{base}/health?model=m"), None, None);
    assert_eq!(health.status, 200, "the slot is still serving: {health:?}");
}

/// What lm-evaluation-harness's `local-completions` sends (docs/ACCURACY.md):
/// a batch of prompts in one request; a prompt as token ids with `echo`,
/// `logprobs` and one token (its log-likelihood requests), the prompt's
/// tokens scored first with a null for the first; `max_tokens: 0` with
/// `echo` scoring the prompt alone. And the forms no stream can answer,
/// refused by name.
#[test]
fn what_evaluation_harnesses_send_is_served() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = model_file(dir.path());
    let daemon = start(
        &hw,
        dir.path(),
        "",
        model_table("m", 1, &[0], &model, "max_in_flight = 4\n"),
    );
    daemon.wait_slot_state("m", "ready");
    let completions = format!("{}/v1/completions", base(&daemon));
    let post = |body: serde_json::Value| {
        let answer = curl("POST", &completions, Some(TOKEN), Some(&body.to_string()));
        (answer.status, answer.json())
    };
    let one = |prompt: &str| {
        let (status, body) = post(serde_json::json!({
            "model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0,
            "stop": ["\n\n"],
        }));
        assert_eq!(status, 200, "{body}");
        body["choices"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };

    // A batch: one choice per prompt, in order, each what it gets alone.
    let prompts = ["The capital of France is", "One, two, three,", "The sea is"];
    let (status, batch) = post(serde_json::json!({
        "model": "m", "prompt": prompts, "max_tokens": 6, "temperature": 0, "seed": 1234,
        "stop": ["\n\n"],
    }));
    assert_eq!(status, 200, "{batch}");
    let choices = batch["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3, "{batch}");
    for (i, prompt) in prompts.iter().enumerate() {
        assert_eq!(choices[i]["index"], i, "{batch}");
        assert_eq!(
            choices[i]["text"].as_str().unwrap(),
            one(prompt),
            "prompt {i}"
        );
    }
    let usage = &batch["usage"];
    assert!(usage["completion_tokens"].as_u64().unwrap() >= 3, "{usage}");

    // The prompt's tokens, as the engine counted them: scored alone.
    let (status, scored) = post(serde_json::json!({
        "model": "m", "prompt": prompts[0], "max_tokens": 0, "echo": true, "logprobs": 1,
        "temperature": 0,
    }));
    assert_eq!(status, 200, "{scored}");
    let c = &scored["choices"][0];
    assert_eq!(c["text"], prompts[0], "echo alone is the prompt: {scored}");
    assert_eq!(c["finish_reason"], "length", "{scored}");
    assert_eq!(scored["usage"]["completion_tokens"], 0, "{scored}");
    let n = scored["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let logprobs = &c["logprobs"];
    assert_eq!(
        logprobs["token_logprobs"].as_array().unwrap().len(),
        n,
        "{logprobs}"
    );
    assert!(logprobs["token_logprobs"][0].is_null(), "{logprobs}");
    assert!(logprobs["top_logprobs"][0].is_null(), "{logprobs}");
    let joined: String = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined, prompts[0], "the tokens spell the prompt");

    // The same prompt followed by one generated token (lm-eval's
    // log-likelihood request, `max_tokens: 1`): the prompt scores the same,
    // and the greedy token is its best alternative, as lm-eval's is_greedy
    // check reads it.
    let (status, by_text) = post(serde_json::json!({
        "model": "m", "prompt": prompts[0], "max_tokens": 1, "echo": true, "logprobs": 1,
        "temperature": 0, "seed": 1234,
    }));
    assert_eq!(status, 200, "{by_text}");
    let lp = &by_text["choices"][0]["logprobs"];
    let token_logprobs = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(
        token_logprobs.len(),
        n + 1,
        "the prompt and one token: {lp}"
    );
    assert_eq!(
        &token_logprobs[..n],
        &logprobs["token_logprobs"].as_array().unwrap()[..],
        "the prompt scores the same with or without a token after it"
    );
    for (k, top) in lp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .skip(1)
    {
        let top = top.as_object().expect("one alternative per token");
        assert_eq!(top.len(), 1, "{top:?}");
        let best = top.values().next().unwrap().as_f64().unwrap();
        assert!(
            best >= token_logprobs[k].as_f64().unwrap() - 1e-6,
            "position {k}"
        );
    }
    assert_eq!(
        token_logprobs[n].as_f64().unwrap(),
        lp["top_logprobs"][n]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .as_f64()
            .unwrap(),
        "greedy: the generated token is the best"
    );

    // lm-eval's tokenized form: a batch of prompts as token ids. The echo
    // is their tokens' text, and each prompt is scored.
    let (status, by_ids) = post(serde_json::json!({
        "model": "m", "prompt": [[5, 6, 7], [8, 9]], "max_tokens": 1, "echo": true,
        "logprobs": 1, "temperature": 0, "seed": 1234,
    }));
    assert_eq!(status, 200, "{by_ids}");
    for (i, len) in [(0, 3), (1, 2)] {
        let c = &by_ids["choices"][i];
        let lp = &c["logprobs"];
        assert_eq!(
            lp["token_logprobs"].as_array().unwrap().len(),
            len + 1,
            "{c}"
        );
        let tokens: String = lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(
            c["text"].as_str().unwrap(),
            tokens,
            "echo of ids is their text: {c}"
        );
    }
    assert_eq!(by_ids["usage"]["prompt_tokens"], 5, "{by_ids}");

    // Refused by name: what a stream cannot answer, and a length of 0
    // without echo.
    for (body, param) in [
        (
            serde_json::json!({"model": "m", "prompt": ["a", "b"], "stream": true}),
            "prompt",
        ),
        (
            serde_json::json!({"model": "m", "prompt": "a", "echo": true, "stream": true}),
            "echo",
        ),
        (
            serde_json::json!({"model": "m", "prompt": "a", "max_tokens": 0}),
            "max_tokens",
        ),
        (
            serde_json::json!({"model": "m", "prompt": [], "max_tokens": 1}),
            "prompt",
        ),
        (
            serde_json::json!({"model": "m", "prompt": [[]], "max_tokens": 1}),
            "prompt[0]",
        ),
    ] {
        let (status, error) = post(body.clone());
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["param"], param, "{body}: {error}");
    }
}
