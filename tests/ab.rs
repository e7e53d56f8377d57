//! `ttctl ab` against a real daemon with `tt-worker` on a fake card: arms
//! as trial definitions proven by their banners, interleaved, recorded,
//! and the configured definition back after the end, a refused arm,
//! Ctrl-C, a worker crash mid-arm and ttctl's own death.

use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use tt_serving_tests::{
    bin, model_table, output_text, tiny_model, wait_until, Daemon, DaemonOptions, FakeHw,
};

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect()
}

fn daemon(hw: &FakeHw, dir: &Path) -> Daemon {
    daemon_with(hw, dir, "")
}

fn daemon_with(hw: &FakeHw, dir: &Path, extra: &str) -> Daemon {
    let model = tiny_model(dir);
    let d = Daemon::start(
        hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, extra),
            ..Default::default()
        },
    );
    d.wait_slot_state("m", "ready");
    d
}

/// Waits for the trial's one record in the audit trail (written when the
/// configured definition is back, client or no client) and returns it.
fn trial_record(d: &Daemon) -> Value {
    wait_until("the trial's audit record", || {
        let out = d.ttctl(&["audit", "--json"]);
        let records: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let trials: Vec<Value> = records
            .into_iter()
            .filter(|r| r["operation"] == "ttctl ab")
            .collect();
        assert!(trials.len() <= 1, "{trials:#?}");
        trials.into_iter().next()
    })
}

/// The slot as status shows it.
fn slot(d: &Daemon) -> Value {
    d.slot("m")
}

/// Waits until the slot runs the configured definition again: Ready, no
/// trial, no flags (the test config sets none).
fn assert_restored(d: &Daemon) {
    wait_until(
        "the configured definition back (Ready, no trial, no flags)",
        || {
            let s = slot(d);
            (s["state"] == "ready"
                && s["trial"] == ""
                && s["flags"].as_object().is_some_and(|f| f.is_empty()))
            .then_some(())
        },
    );
}

/// `ttctl ab` of `m` at batch 1 with prompts of `prompt` tokens.
fn ab(d: &Daemon, out: &Path, prompt: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(bin("ttctl"));
    c.arg("--socket")
        .arg(&d.socket)
        .args([
            "ab",
            "m",
            "--batch",
            "1",
            "--prompt-tokens",
            prompt,
            "--warmup",
            "0",
        ])
        .args(["--out", out.to_str().unwrap()])
        .args(extra)
        .stdin(Stdio::null());
    c
}

#[test]
fn arms_alternate_prove_their_flags_and_the_definition_comes_back() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = daemon(&hw, dir.path());
    let config_before = std::fs::read_to_string(&d.config).unwrap();
    let out = dir.path().join("ab.jsonl");
    // 120 tokens: the tiny vocabulary splits the clock-picked nonce words
    // into a few tokens more or less, which at 40 left a round 3 of 40
    // tokens short and invalid (more than 5% off).
    let run = ab(
        &d,
        &out,
        "120",
        &[
            "--arm",
            "base:",
            "--arm",
            "f16:TTW_KV_F16=1",
            "--output-tokens",
            "16",
            "--repeats",
            "2",
        ],
    )
    .output()
    .unwrap();
    let text = output_text(&run);
    assert!(run.status.success(), "{text}");
    assert!(
        text.contains("f16 vs base at B=1 prompt=120 (2 rounds)"),
        "{text}"
    );
    assert!(text.contains("ratio"), "{text}");

    let recs = records(&out);
    let arms: Vec<Value> = recs.iter().filter(|r| r["kind"] == "ab").cloned().collect();
    // Interleaved: base f16 base f16, in order.
    let order: Vec<(String, u64, u64)> = arms
        .iter()
        .map(|r| {
            (
                r["arm"].as_str().unwrap().to_string(),
                r["round"].as_u64().unwrap(),
                r["order"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        order,
        vec![
            ("base".into(), 0, 0),
            ("f16".into(), 0, 1),
            ("base".into(), 1, 2),
            ("f16".into(), 1, 3)
        ]
    );
    for r in &arms {
        assert_eq!(r["valid"], true, "{r}");
        let banners: Vec<&str> = r["banners"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let slot_flags = &r["identity"]["slots"][0]["flags"];
        if r["arm"] == "f16" {
            assert!(banners.contains(&"TTW_KV_F16"), "{r}");
            assert_eq!(slot_flags["TTW_KV_F16"], "1");
        } else {
            assert!(!banners.contains(&"TTW_KV_F16"), "{r}");
            assert!(slot_flags.get("TTW_KV_F16").is_none(), "{r}");
        }
    }
    // Every arm switch restarted the worker.
    let pids: Vec<u64> = arms
        .iter()
        .map(|r| r["identity"]["slots"][0]["worker_pid"].as_u64().unwrap())
        .collect();
    assert!(pids.windows(2).all(|w| w[0] != w[1]), "{pids:?}");
    let summary = recs
        .iter()
        .find(|r| r["kind"] == "ab_summary")
        .expect("a summary record");
    assert_eq!(summary["records"].as_array().unwrap().len(), 4);
    assert!(
        summary["figures"]["aggregate_tok_s"]["ratio"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // Greedy agreement on the fixed prompts: 8 prompts of 32 tokens,
    // compared token by token with the chosen tokens' logprobs. The tiny
    // model's f16 KV cache moves its logprobs a little (they are returned
    // and measured); whether a token flips is the model's business.
    let g = &summary["agreement"];
    assert_eq!(g["prompts"], 8, "{g}");
    assert_eq!(g["unit"], "tokens", "{g}");
    let share = g["identical_share"].as_f64().expect("a share");
    assert!((0.0..=1.0).contains(&share), "{g}");
    assert_eq!(
        g["first_divergence"].as_array().map(Vec::len),
        Some(8),
        "{g}"
    );
    assert!(g["mean_abs_logprob_diff"].as_f64().is_some(), "{g}");
    assert!(text.contains("greedy agreement"), "{text}");
    // No --eval: no accuracy verdict.
    assert!(summary["accuracy"].is_null(), "{summary}");
    eprintln!("{text}");

    assert_restored(&d);
    assert_eq!(
        std::fs::read_to_string(&d.config).unwrap(),
        config_before,
        "a trial is never written to the config"
    );
    // The trials show in the reload history, named.
    let status = d.status();
    let triggers: Vec<&str> = status["reloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["trigger"].as_str())
        .collect();
    assert!(triggers.contains(&"ttctl ab: arm f16"), "{triggers:?}");
    assert!(triggers.contains(&"ttctl ab: trial over"), "{triggers:?}");
}

#[test]
fn an_arm_whose_flag_does_not_engage_is_refused_and_the_definition_comes_back() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = daemon(&hw, dir.path());
    let out = dir.path().join("ab.jsonl");
    // tt-worker has no TTW_NOT_A_FEATURE: nothing prints its banner.
    let run = ab(
        &d,
        &out,
        "40",
        &[
            "--arm",
            "base:",
            "--arm",
            "bogus:TTW_NOT_A_FEATURE=1",
            "--output-tokens",
            "8",
            "--repeats",
            "1",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(run.status.code(), Some(1), "{}", output_text(&run));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("TTW_NOT_A_FEATURE"), "{stderr}");
    assert!(stderr.contains("bogus"), "{stderr}");
    assert_restored(&d);
    // The baseline's record exists; no record of the refused arm.
    let recs = records(&out);
    assert!(recs.iter().all(|r| r["arm"] != "bogus"), "{recs:?}");
    // One audit record for the whole trial: the definition came back.
    let audit = trial_record(&d);
    assert_eq!(audit["outcome"], "ok", "{audit}");
    assert_eq!(audit["uid"], 0, "{audit}");
    assert_eq!(audit["args"]["model"], "m", "{audit}");
}

/// Starts a long `ttctl ab` and waits until its candidate arm is up.
fn start_long_ab(d: &Daemon, out: &Path) -> Child {
    let child = ab(
        d,
        out,
        "40",
        &[
            "--arm",
            "base:",
            "--arm",
            "f16:TTW_KV_F16=1",
            "--output-tokens",
            "200",
            "--repeats",
            "50",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_until("the f16 arm up", || {
        let s = slot(d);
        (s["trial"].as_str().is_some_and(|t| t.contains("arm f16")) && s["state"] == "ready")
            .then_some(())
    });
    child
}

#[test]
fn ctrl_c_restores_the_configured_definition() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = daemon(&hw, dir.path());
    let out = dir.path().join("ab.jsonl");
    let mut child = start_long_ab(&d, &out);
    assert!(slot(&d)["trial"].as_str().unwrap().contains("TTW_KV_F16=1"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let st = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(st.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(
        stderr.contains("back on its configured definition"),
        "{stderr}"
    );
    // Restored before ttctl exited, not eventually.
    let s = slot(&d);
    assert_eq!(s["trial"], "", "{s}");
    assert!(s["flags"].as_object().unwrap().is_empty(), "{s}");
    assert_restored(&d);
}

#[test]
fn a_worker_crash_mid_arm_ends_the_run_and_restores() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    // Every prefill step takes 1.5 s, so the arm is still measuring when
    // its worker is killed.
    let d = daemon_with(
        &hw,
        dir.path(),
        "env = { TTW_TEST_FAULTS = \"1\", TTW_FAULT_PREFILL_STALL_MS = \"1500\" }\n",
    );
    let out = dir.path().join("ab.jsonl");
    let mut child = start_long_ab(&d, &out);
    let pid = slot(&d)["worker_pid"].as_i64().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("the f16 arm's worker is running");
    let st = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(st.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("arm f16 lost its worker mid-run"),
        "{stderr}"
    );
    assert_restored(&d);
    // The record of the arm that lost its worker is there, invalid.
    let recs = records(&out);
    let last = recs
        .iter()
        .rev()
        .find(|r| r["kind"] == "ab")
        .expect("records");
    assert_eq!(last["arm"], "f16", "{last}");
    assert_eq!(last["valid"], false, "{last}");
    let reasons = last["invalid_reasons"].to_string();
    assert!(
        reasons.contains("left Ready") || reasons.contains("restarted"),
        "{last}"
    );
}

#[test]
fn the_daemon_restores_when_ttctl_dies() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let d = daemon(&hw, dir.path());
    let out = dir.path().join("ab.jsonl");
    let mut child = start_long_ab(&d, &out);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_restored(&d);
    // The trial's record waits for the restore, not for the client.
    let audit = trial_record(&d);
    assert_eq!(audit["outcome"], "ok", "{audit}");
}
