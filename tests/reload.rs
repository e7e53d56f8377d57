//! Live reconfiguration end to end: a real daemon and real `tt-worker`
//! processes with the tiny model on fake cards; the config file is rewritten
//! and reloaded with `ttctl reload` or SIGHUP.

use serde_json::Value;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use tt_serving_proto::v1::generate_response::Chunk;
use tt_serving_proto::v1::inference_client::InferenceClient;
use tt_serving_proto::v1::{generate_request::Input, GenerateRequest};
use tt_serving_tests::{
    generate, model_table, output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw,
};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("tokio runtime")
}

fn options(models: String) -> DaemonOptions {
    DaemonOptions {
        extra: models,
        ..Default::default()
    }
}

/// `ttctl reload --json [args]`: (exit code, report).
fn reload(daemon: &Daemon, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["reload", "--json"];
    all.extend_from_slice(args);
    let out = daemon.ttctl(&all);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("reload report is not JSON ({e}): {}", output_text(&out)));
    (out.status.code().unwrap_or(-1), report)
}

/// slot -> action in a report.
fn actions(report: &Value) -> Vec<(String, String)> {
    report["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .map(|s| {
                    (
                        s["slot"].as_str().unwrap_or("").to_string(),
                        s["action"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn step<'a>(report: &'a Value, slot: &str) -> &'a Value {
    report["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["slot"] == slot))
        .unwrap_or_else(|| panic!("no step for {slot} in {report}"))
}

fn pid(slot: &Value) -> u64 {
    slot["worker_pid"].as_u64().unwrap_or(0)
}

fn alive(pid: u64) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

/// Whether anyone holds the card's lock file (a non-blocking flock of our
/// own succeeds only when nobody does).
fn lock_is_free(lock_dir: &Path, bdf: &str) -> bool {
    use nix::fcntl::{Flock, FlockArg};
    let Ok(file) = std::fs::File::open(lock_dir.join(format!("{bdf}.lock"))) else {
        return true;
    };
    Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok()
}

#[test]
fn a_changed_model_restarts_while_the_other_keeps_its_stream_and_worker() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let b_flags =
        |kv: &str| format!("flags = {{ TTW_KV_F16 = \"{kv}\" }}\ncache_flags = [\"TTW_KV_F16\"]\n");
    let config = |kv: &str| {
        model_table("a", 1, &[0], &model, "") + &model_table("b", 1, &[1], &model, &b_flags(kv))
    };
    let daemon = Daemon::start(&hw, options(config("0")));
    let a = daemon.wait_slot_state("a", "ready");
    let b = daemon.wait_slot_state("b", "ready");
    let address = daemon.inference_address();
    let rt = runtime();

    // A stream on A stays open across the reload: one chunk read now, the
    // rest after.
    let mut stream = rt.block_on(async {
        let mut client = InferenceClient::connect(format!("http://{address}"))
            .await
            .expect("connect");
        let mut stream = client
            .generate(GenerateRequest {
                model: "a".into(),
                input: Some(Input::Prompt("once upon a time".into())),
                max_tokens: 200,
                ..Default::default()
            })
            .await
            .expect("A accepts the request")
            .into_inner();
        let first = stream.message().await.expect("first chunk");
        assert!(matches!(first.and_then(|c| c.chunk), Some(Chunk::Delta(_))));
        stream
    });
    assert_eq!(daemon.slot("a")["requests_in_flight"], 1);

    daemon.rewrite_config(&hw, &options(config("1")));
    let (code, report) = reload(&daemon, &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "applied");
    assert_eq!(
        actions(&report),
        vec![("a".into(), "keep".into()), ("b".into(), "restart".into())]
    );
    let why = step(&report, "b")["reason"].as_str().unwrap_or("");
    assert!(why.contains("flags.TTW_KV_F16: \"0\" → \"1\""), "{why}");
    assert!(why.contains("new cache variant"), "{why}");
    let result = step(&report, "b")["result"].as_str().unwrap_or("");
    assert!(result.starts_with("Ready (cold start"), "{result}");

    // B came back as a new worker on a new cache variant, built cold.
    let b2 = daemon.wait_slot_state("b", "ready");
    assert_ne!(pid(&b2), pid(&b));
    assert!(!alive(pid(&b)), "the old worker of B is gone");
    assert_eq!(b2["cache_mode"], "cold");
    // A was never touched: same worker, same Ready since before.
    let a2 = daemon.slot("a");
    assert_eq!(a2["state"], "ready");
    assert_eq!(pid(&a2), pid(&a));
    assert_eq!(a2["since_unix_ms"], a["since_unix_ms"]);

    // A's stream finishes whole.
    let (tokens, finish) = rt.block_on(async {
        let mut tokens = 1;
        let mut finish = None;
        while let Some(chunk) = stream.message().await.expect("A's stream continues") {
            match chunk.chunk {
                Some(Chunk::Delta(d)) => tokens += d.token_ids.len(),
                Some(Chunk::Final(f)) => finish = Some(f),
                _ => {}
            }
        }
        (
            tokens,
            finish.expect("A's stream ends with its final chunk"),
        )
    });
    assert!(tokens > 1, "{tokens}");
    assert_eq!(finish.slot, "a");
    // B answers with the new definition.
    let answer = rt
        .block_on(generate(&address, "b", "hello", 4))
        .expect("B serves after the reload");
    assert_eq!(answer.last.slot, "b");
    // The new worker ran with the flag on (its banner was checked at
    // readiness).
    let logs = output_text(&daemon.ttctl(&["logs", "b"]));
    assert!(logs.contains("TTW_KV_F16 engaged"), "{logs}");
}

#[test]
fn dry_run_shows_the_plan_a_reload_then_applies_for_added_and_removed_replicas() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let replicas = |cards: &[usize]| {
        let sets: Vec<String> = cards
            .iter()
            .map(|c| format!("[\"{}\"]", FakeHw::bdf(*c)))
            .collect();
        format!(
            "\n[models.r]\ntp = 1\nreplicas = [{}]\ncheckpoint = \"{}\"\nworker = [\"{}\"]\ndrain_timeout_secs = 5\n",
            sets.join(", "),
            model.display(),
            tt_serving_tests::bin("tt-worker").display()
        )
    };
    let daemon = Daemon::start(&hw, options(replicas(&[0])));
    let first = daemon.wait_slot_state("r/0", "ready");
    assert!(lock_is_free(&daemon.lock_dir, &FakeHw::bdf(1)));

    daemon.rewrite_config(&hw, &options(replicas(&[0, 1])));
    let (code, plan) = reload(&daemon, &["--dry-run"]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(plan["outcome"], "dry-run");
    let planned = actions(&plan);
    assert_eq!(
        planned,
        vec![
            ("r/0".into(), "keep".into()),
            ("r/1".into(), "start".into())
        ]
    );
    // Nothing was applied.
    assert_eq!(daemon.slot("r/1"), Value::Null);
    let text = output_text(&daemon.ttctl(&["reload", "--dry-run"]));
    assert!(text.contains("dry run: nothing applied"), "{text}");
    assert!(text.contains("start    r/1  added to the config"), "{text}");

    let (code, applied) = reload(&daemon, &[]);
    assert_eq!(code, 0, "{applied}");
    assert_eq!(
        actions(&applied),
        planned,
        "the reload did what the dry run said"
    );
    let added = daemon.wait_slot_state("r/1", "ready");
    assert_eq!(added["cards"][0], FakeHw::bdf(1));
    assert!(!lock_is_free(&daemon.lock_dir, &FakeHw::bdf(1)));
    assert_eq!(pid(&daemon.slot("r/0")), pid(&first), "r/0 untouched");

    // Remove it again: drained, stopped, gone, its card unlocked.
    daemon.rewrite_config(&hw, &options(replicas(&[0])));
    let (code, removed) = reload(&daemon, &[]);
    assert_eq!(code, 0, "{removed}");
    assert_eq!(
        actions(&removed),
        vec![("r/0".into(), "keep".into()), ("r/1".into(), "stop".into())]
    );
    assert!(
        step(&removed, "r/1")["result"]
            .as_str()
            .unwrap_or("")
            .contains("cards released"),
        "{removed}"
    );
    assert_eq!(daemon.slot("r/1"), Value::Null);
    assert!(!alive(pid(&added)), "the removed replica's worker is gone");
    assert!(lock_is_free(&daemon.lock_dir, &FakeHw::bdf(1)));
    assert_eq!(daemon.card(&FakeHw::bdf(1))["state"], "unmanaged");
    assert_eq!(pid(&daemon.slot("r/0")), pid(&first), "r/0 untouched");
    // Status keeps the history.
    let status = daemon.status();
    let history = status["reloads"].as_array().cloned().unwrap_or_default();
    // Two reloads; the two dry runs changed nothing and are not kept.
    assert_eq!(history.len(), 2, "{status}");
    assert!(
        history.iter().all(|r| r["outcome"] != "dry-run"),
        "{status}"
    );
    let text = output_text(&daemon.ttctl(&["status"]));
    assert!(text.contains("by ttctl: applied: 1 keep, 1 stop"), "{text}");
}

#[test]
fn an_invalid_config_is_refused_whole_and_the_old_one_keeps_serving() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let good = model_table("a", 1, &[0], &model, "");
    let daemon = Daemon::start(&hw, options(good.clone()));
    let a = daemon.wait_slot_state("a", "ready");

    let bad = good.replace("tp = 1", "tp = 3") + "\n[models.a.restart]\nno_such_key = 1\n";
    daemon.rewrite_config(&hw, &options(bad));
    let out = daemon.ttctl(&["reload"]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(text.contains("reload refused"), "{text}");
    assert!(text.contains("keeps serving its current config"), "{text}");
    assert!(text.contains("models.a.restart.no_such_key"), "{text}");

    // Still serving, same worker; the refusal shows in the summary and
    // status.
    let address = daemon.inference_address();
    runtime()
        .block_on(generate(&address, "a", "hello", 4))
        .expect("the old config keeps serving");
    assert_eq!(pid(&daemon.slot("a")), pid(&a));
    let summary = daemon.status()["daemon"]["summary"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(summary.contains("last reload refused"), "{summary}");
    let status = output_text(&daemon.ttctl(&["status"]));
    assert!(status.contains("by ttctl: refused"), "{status}");
}

#[test]
fn sighup_reloads_in_turn_and_systemd_sees_reloading_then_ready() {
    let hw = FakeHw::new(3);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let notify_path = dir.path().join("notify.sock");
    let listener = UnixDatagram::bind(&notify_path).unwrap();
    // Drain the socket all the time, as systemd does: the daemon's sends
    // block once the socket's small queue is full.
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    {
        let received = received.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = listener.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                received.lock().unwrap().push(text);
            }
        });
    }
    let messages = || received.lock().unwrap().clone();
    let a = model_table("a", 1, &[0], &model, "");
    let b = model_table("b", 1, &[1], &model, "");
    let c = model_table("c", 1, &[2], &model, "");
    let mut opts = options(a.clone());
    opts.env = vec![("NOTIFY_SOCKET".into(), notify_path.display().to_string())];
    let daemon = Daemon::start(&hw, opts.clone());
    daemon.wait_slot_state("a", "ready");
    wait_until("READY=1 at startup", || {
        messages()
            .iter()
            .any(|m| m.contains("READY=1"))
            .then_some(())
    });
    let before = messages().len();

    // Two SIGHUPs in quick succession, the file changing in between. The
    // second goes once the first was taken (RELOADING=1): the kernel keeps
    // one pending signal of a kind, so two sent before the daemon reads
    // either are rightly one reload.
    opts.extra = a.clone() + &b;
    daemon.rewrite_config(&hw, &opts);
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    wait_until("the first SIGHUP to be taken", || {
        messages()[before..]
            .iter()
            .any(|m| m.contains("RELOADING=1"))
            .then_some(())
    });
    opts.extra = a + &b + &c;
    daemon.rewrite_config(&hw, &opts);
    daemon.signal(nix::sys::signal::Signal::SIGHUP);

    daemon.wait_slot_state("b", "ready");
    daemon.wait_slot_state("c", "ready");
    let reloads = wait_until("both reloads to be recorded", || {
        let history = daemon.status()["reloads"].as_array().cloned()?;
        (history.len() == 2).then_some(history)
    });
    // One after the other, never interleaved.
    assert!(
        reloads[0]["finished_unix_ms"].as_u64() <= reloads[1]["started_unix_ms"].as_u64(),
        "{reloads:?}"
    );
    for r in &reloads {
        assert_eq!(r["trigger"], "SIGHUP");
        assert!(
            r["outcome"] == "applied" || r["outcome"] == "unchanged",
            "{r}"
        );
    }
    assert_eq!(daemon.slot("a")["state"], "ready");

    let messages = wait_until("READY=1 after the reloads", || {
        let all = messages()[before..].to_vec();
        (all.iter().filter(|m| m.contains("READY=1")).count() >= 2).then_some(all)
    });
    let reloading = messages
        .iter()
        .position(|m| m.contains("RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1 in {messages:?}"));
    assert!(
        messages[reloading].contains("MONOTONIC_USEC="),
        "{messages:?}"
    );
    let ready = messages
        .iter()
        .position(|m| m.contains("READY=1"))
        .unwrap_or_else(|| panic!("no READY=1 in {messages:?}"));
    assert!(reloading < ready, "{messages:?}");
}

#[test]
fn a_failing_new_definition_is_reported_failed_or_rolled_back() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let a = model_table("a", 1, &[0], &model, "");
    let b = |extra: &str| {
        model_table(
            "b",
            1,
            &[1],
            &model,
            &format!("{extra}\n[models.b.restart]\nmax_attempts = 1\nbackoff_ms = 50\n"),
        )
    };
    let broken = "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_EXIT_AT_START = \"3\" }";
    let daemon = Daemon::start(&hw, options(a.clone() + &b("")));
    let a_before = daemon.wait_slot_state("a", "ready");
    daemon.wait_slot_state("b", "ready");

    // With rollback_on_failure the old definition comes back.
    daemon.rewrite_config(
        &hw,
        &options(a.clone() + &b(&format!("rollback_on_failure = true\n{broken}"))),
    );
    let (code, report) = reload(&daemon, &[]);
    assert_eq!(code, 1, "the change did not take: {report}");
    let result = step(&report, "b")["result"].as_str().unwrap_or("");
    assert!(result.starts_with("rolled back"), "{result}");
    assert!(result.contains("exit"), "{result}");
    let back = daemon.wait_slot_state("b", "ready");
    assert_eq!(
        back["cache_mode"], "warm",
        "the old definition's cache is reused"
    );
    runtime()
        .block_on(generate(&daemon.inference_address(), "b", "hello", 4))
        .expect("B serves with its old definition");

    // Without it the slot stays Failed with the reason; A never notices.
    daemon.rewrite_config(&hw, &options(a.clone() + &b(broken)));
    let out = daemon.ttctl(&["reload"]);
    assert_eq!(out.status.code(), Some(1), "{}", output_text(&out));
    let text = output_text(&out);
    assert!(text.contains("did not come up"), "{text}");
    // While it waited, the states the slot passed through were lines (the
    // reload answers only once the slot is up or failed; the status stream
    // may merge quick changes, so which ones is not fixed).
    assert!(text.contains("\n  slot b: "), "{text}");
    assert!(!text.contains("slot a:"), "A never moved: {text}");
    let failed = daemon.wait_slot_state("b", "failed");
    assert!(
        failed["reason"].as_str().unwrap_or("").contains("status 3"),
        "{failed}"
    );
    let a_after = daemon.slot("a");
    assert_eq!(pid(&a_after), pid(&a_before));
    assert_eq!(a_after["since_unix_ms"], a_before["since_unix_ms"]);
}

#[test]
fn replicas_of_a_changed_model_restart_one_at_a_time_and_the_model_keeps_answering() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = |greeting: &str| {
        format!(
            "\n[models.r]\ntp = 1\nreplicas = [[\"{}\"], [\"{}\"]]\ncheckpoint = \"{}\"\nworker = [\"{}\"]\ndrain_timeout_secs = 5\nenv = {{ GREETING = \"{greeting}\", TTW_TEST_FAULTS = \"1\", TTW_FAULT_SLOW_LOAD_MS = \"1500\" }}\n",
            FakeHw::bdf(0),
            FakeHw::bdf(1),
            model.display(),
            tt_serving_tests::bin("tt-worker").display()
        )
    };
    let daemon = Daemon::start(&hw, options(config("hello")));
    let before: Vec<u64> = ["r/0", "r/1"]
        .iter()
        .map(|s| pid(&daemon.wait_slot_state(s, "ready")))
        .collect();
    let address = daemon.inference_address();

    daemon.rewrite_config(&hw, &options(config("bonjour")));
    let socket = daemon.socket.clone();
    let reloading = std::thread::spawn(move || {
        std::process::Command::new(tt_serving_tests::bin("ttctl"))
            .arg("--socket")
            .arg(&socket)
            .args(["reload", "--json"])
            .output()
            .expect("run ttctl reload")
    });
    let rt = runtime();
    let mut answered = 0;
    while !reloading.is_finished() {
        // At every moment one replica serves (both read from one snapshot:
        // two status calls could straddle the handover)...
        let snapshot = daemon.status();
        let states: Vec<Value> = snapshot["slots"]
            .as_array()
            .map(|slots| slots.iter().map(|s| s["state"].clone()).collect())
            .unwrap_or_default();
        assert_eq!(states.len(), 2, "{snapshot}");
        assert!(
            states.iter().any(|s| s == "ready"),
            "no replica ready: {states:?}; daemon log:\n{}",
            daemon.log_text()
        );
        // ...so requests keep being answered.
        rt.block_on(generate(&address, "r", "hello", 2))
            .expect("the model answers during the rolling restart");
        answered += 1;
    }
    let out = reloading.join().expect("ttctl thread");
    assert_eq!(out.status.code(), Some(0), "{}", output_text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    assert_eq!(
        actions(&report),
        vec![
            ("r/0".into(), "restart".into()),
            ("r/1".into(), "restart".into())
        ]
    );
    assert!(answered > 0);
    for (slot, old) in ["r/0", "r/1"].iter().zip(before) {
        let now = daemon.wait_slot_state(slot, "ready");
        assert_ne!(pid(&now), old, "{slot} runs the new definition");
        assert_eq!(now["cache_mode"], "warm", "env is not cache-affecting");
    }
}

#[test]
fn a_replica_left_behind_by_a_halted_roll_shows_outdated_and_a_revert_leaves_it_running() {
    let hw = FakeHw::new(2);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = |env: &str| {
        format!(
            "\n[models.r]\ntp = 1\nreplicas = [[\"{}\"], [\"{}\"]]\ncheckpoint = \"{}\"\nworker = [\"{}\"]\ndrain_timeout_secs = 5\nenv = {{ GREETING = \"hello\"{env} }}\n[models.r.restart]\nmax_attempts = 1\nbackoff_ms = 50\n",
            FakeHw::bdf(0),
            FakeHw::bdf(1),
            model.display(),
            tt_serving_tests::bin("tt-worker").display()
        )
    };
    let good = config("");
    let broken = config(", TTW_TEST_FAULTS = \"1\", TTW_FAULT_EXIT_AT_START = \"3\"");
    let daemon = Daemon::start(&hw, options(good.clone()));
    daemon.wait_slot_state("r/0", "ready");
    let kept = pid(&daemon.wait_slot_state("r/1", "ready"));

    // The first replica fails with the new definition: the roll halts and
    // the second keeps serving with the old one.
    daemon.rewrite_config(&hw, &options(broken));
    let (code, report) = reload(&daemon, &[]);
    assert_eq!(code, 1, "{report}");
    let left = step(&report, "r/1")["result"].as_str().unwrap_or("");
    assert!(left.starts_with("not restarted"), "{left}");
    daemon.wait_slot_state("r/0", "failed");
    let behind = daemon.slot("r/1");
    assert_eq!(pid(&behind), kept);
    let keys: Vec<&str> = behind["outdated_keys"]
        .as_array()
        .map(|k| k.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(
        keys,
        vec!["env.TTW_FAULT_EXIT_AT_START", "env.TTW_TEST_FAULTS"],
        "{behind}"
    );
    assert_eq!(daemon.slot("r/0")["outdated_keys"], Value::Array(vec![]));
    let text = output_text(&daemon.ttctl(&["status"]));
    assert!(
        text.contains("outdated: still runs the definition"),
        "{text}"
    );
    runtime()
        .block_on(generate(&daemon.inference_address(), "r", "hello", 2))
        .expect("the replica left behind serves");

    // Reverting the file: the plan compares r/1 by what it runs, so only
    // r/0 restarts and r/1's worker is left alone.
    daemon.rewrite_config(&hw, &options(good));
    let (code, report) = reload(&daemon, &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(
        actions(&report),
        vec![
            ("r/0".into(), "restart".into()),
            ("r/1".into(), "keep".into())
        ]
    );
    assert_eq!(
        step(&report, "r/1")["reason"],
        "already runs this definition"
    );
    daemon.wait_slot_state("r/0", "ready");
    let now = daemon.slot("r/1");
    assert_eq!(pid(&now), kept);
    assert_eq!(now["outdated_keys"], Value::Array(vec![]));
}
