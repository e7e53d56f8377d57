//! Accuracy through the daemon, as the field gates it: `ttctl eval` with
//! lm-evaluation-harness (PyPI `lm-eval`, scripts/lm-eval.sh) and with the
//! built-in exact-match runner, on SmolLM2 served by tt-worker, on the
//! tasks in tests/data/eval (docs/ACCURACY.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use tt_serving_tests::{bin, model_table, Daemon, DaemonOptions, FakeHw};

fn tasks() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/eval")
}

/// `ttctl eval` against `daemon`, offline (no hub lookups), its record in
/// `out`.
fn eval(daemon: &Daemon, out: &Path, args: &[&str]) -> Output {
    Command::new(bin("ttctl"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["eval", "m", "--out"])
        .arg(out)
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run ttctl eval")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The last record of a records file.
fn last_record(path: &Path) -> serde_json::Value {
    let records = std::fs::read_to_string(path).expect("the records file");
    serde_json::from_str(records.lines().last().expect("a record")).expect("a JSON record")
}

#[test]
fn ttctl_eval_scores_smollm2_with_lm_eval_and_the_built_in_runner_and_gates_it() {
    let Some((lm_eval, tokenizer, model)) = tt_serving_tests::real_lm_eval() else {
        return;
    };
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "[openai]\nlisten = \"127.0.0.1:0\"\n{}{}",
                model_table("m", 1, &[0], &model, "max_in_flight = 8\n"),
                "\n[models.m.accuracy.tt_capitals]\nreference = 0.65\ntolerance = 0.15\n\n\
                 [models.m.accuracy.capitals]\npass_mark = \"40/40\"\n",
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("eval.jsonl");
    let lm_eval = lm_eval.display().to_string();
    let include = tasks().display().to_string();
    let tokenizer = tokenizer.display().to_string();

    // Generate-until with lm-eval: the capitals, through the OpenAI door.
    let harness = eval(
        &daemon,
        &records,
        &[
            "--lm-eval",
            &lm_eval,
            "--include-path",
            &include,
            "--task",
            "tt_capitals",
        ],
    );
    assert!(harness.status.success(), "{}", text(&harness));
    let by_harness = last_record(&records);
    assert_eq!(by_harness["kind"], "eval");
    assert_eq!(by_harness["runner"], "lm-eval 0.4.13", "{by_harness}");
    assert_eq!(by_harness["metric"], "exact_match", "{by_harness}");
    assert_eq!(by_harness["samples"], 40, "{by_harness}");
    assert_eq!(by_harness["valid"], true, "{by_harness}");
    assert_eq!(
        by_harness["identity"]["slots"][0]["slot"], "m",
        "{by_harness}"
    );
    // Judged against the configured gate.
    assert_eq!(by_harness["pass"], true, "{by_harness}");
    assert!(
        String::from_utf8_lossy(&harness.stdout).contains("(models.m.accuracy.tt_capitals)"),
        "{}",
        text(&harness)
    );
    let score = by_harness["score"].as_f64().unwrap();
    // SmolLM2-135M knows some capitals, not all (0.65 when written).
    assert!((0.4..=0.9).contains(&score), "{by_harness}");

    // The built-in runner on the same questions, through the router:
    // the same score and standard error as lm-eval's.
    let questions = tasks().join("capitals.jsonl").display().to_string();
    let built_in = eval(
        &daemon,
        &records,
        &[
            "--task",
            &questions,
            "--reference",
            &format!("{score}"),
            "--tolerance",
            "0.05",
        ],
    );
    assert!(built_in.status.success(), "{}", text(&built_in));
    let by_runner = last_record(&records);
    assert_eq!(by_runner["runner"], "built-in exact match");
    assert_eq!(by_runner["score"], by_harness["score"], "{by_runner}");
    // lm-eval sums the squared deviations sample by sample; the runner
    // uses the closed form for 0/1 scores: equal up to float rounding.
    let (ours, theirs) = (
        by_runner["stderr"].as_f64().unwrap_or(f64::NAN),
        by_harness["stderr"].as_f64().unwrap_or(f64::NAN),
    );
    assert!(
        (ours - theirs).abs() < 1e-12,
        "{ours} vs lm-eval's {theirs}"
    );
    assert_eq!(by_runner["pass"], true, "{by_runner}");
    assert!(
        String::from_utf8_lossy(&built_in.stdout).contains("PASS against reference"),
        "{}",
        text(&built_in)
    );

    // A reference the model does not reach fails, exit 1, naming the score
    // and the gate; so does a pass mark of every question.
    let failing = eval(
        &daemon,
        &records,
        &[
            "--task",
            &questions,
            "--reference",
            "0.95",
            "--tolerance",
            "0.05",
        ],
    );
    assert_eq!(failing.status.code(), Some(1), "{}", text(&failing));
    assert!(
        String::from_utf8_lossy(&failing.stderr)
            .contains("fails reference 0.95 with tolerance 0.05"),
        "{}",
        text(&failing)
    );
    assert_eq!(last_record(&records)["pass"], false);
    // The configured pass mark of every question (the task file's name is
    // the task's), with no gate on the command line.
    let all = eval(&daemon, &records, &["--task", &questions]);
    assert_eq!(all.status.code(), Some(1), "{}", text(&all));
    assert!(
        String::from_utf8_lossy(&all.stderr)
            .contains("the pass mark 40/40 (models.m.accuracy.capitals)"),
        "{}",
        text(&all)
    );

    // Multiple choice by log-likelihood: lm-eval's tokenized, batched
    // echo-with-logprobs requests, scored from the prompt's logprobs.
    let mc = eval(
        &daemon,
        &records,
        &[
            "--lm-eval",
            &lm_eval,
            "--include-path",
            &include,
            "--task",
            "tt_capitals_mc",
            "--tokenizer",
            &tokenizer,
            "--batch-size",
            "8",
        ],
    );
    assert!(mc.status.success(), "{}", text(&mc));
    let by_choice = last_record(&records);
    assert_eq!(by_choice["metric"], "acc", "{by_choice}");
    assert_eq!(by_choice["samples"], 40, "{by_choice}");
    assert!(by_choice["score"].as_f64().unwrap() >= 0.9, "{by_choice}");
}

#[test]
fn bad_eval_arguments_are_named() {
    let hw = FakeHw::new(1);
    let dir = tempfile::tempdir().unwrap();
    let model = tt_serving_tests::tiny_model(dir.path());
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: model_table("m", 1, &[0], &model, ""),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    let records = dir.path().join("eval.jsonl");
    let missing = eval(&daemon, &records, &["--task", "/no/such/task.jsonl"]);
    assert_eq!(missing.status.code(), Some(1), "{}", text(&missing));
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .contains("cannot read the task file /no/such/task.jsonl"),
        "{}",
        text(&missing)
    );
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\": \"x\"}\n").unwrap();
    let no_answer = eval(&daemon, &records, &["--task", bad.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&no_answer.stderr).contains("line 1: no \"answer\""),
        "{}",
        text(&no_answer)
    );
    let mark = eval(&daemon, &records, &["--task", "x", "--pass-mark", "9/5"]);
    assert_eq!(mark.status.code(), Some(2), "{}", text(&mark));
    // lm-eval goes through the OpenAI door, which this daemon does not open.
    let no_door = eval(
        &daemon,
        &records,
        &["--lm-eval", "/bin/false", "--task", "t"],
    );
    assert_eq!(no_door.status.code(), Some(1), "{}", text(&no_door));
    assert!(
        String::from_utf8_lossy(&no_door.stderr).contains("no OpenAI door"),
        "{}",
        text(&no_door)
    );
}

/// `readiness.accuracy`: the configured task runs before the slot is
/// Ready. A worker whose numerics broke (tt-worker's test fault
/// `TTW_FAULT_EARLY_EXIT`, which skips the last quarter of the layers, its
/// banner engaged) is never served, the score and the gate in its reason;
/// the same model without the fault passes and says so.
#[test]
fn a_slot_whose_answers_fail_its_readiness_accuracy_task_is_never_ready() {
    let Some(model) = tt_serving_tests::real_smollm2() else {
        return;
    };
    let capitals = tasks().join("capitals.jsonl");
    let gate = |name: &str| {
        format!(
            "\n[models.{name}.readiness]\naccuracy = \"capitals\"\n\n[models.{name}.accuracy.capitals]\nreference = 0.65\ntolerance = 0.15\nfile = \"{}\"\n",
            capitals.display()
        )
    };
    let hw = FakeHw::new(2);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "{}{}{}{}",
                model_table("good", 1, &[0], &model, ""),
                gate("good"),
                model_table(
                    "broken",
                    1,
                    &[1],
                    &model,
                    "flags = { TTW_FAULT_EARLY_EXIT = \"1\" }\nenv = { TTW_TEST_FAULTS = \"1\" }\n[models.broken.restart]\nmax_attempts = 1\n",
                ),
                gate("broken"),
            ),
            ..Default::default()
        },
    );
    let good = daemon.wait_slot_state("good", "ready");
    let reason = good["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("accuracy check capitals: exact_match 0.")
            && reason.contains(
                "passes reference 0.65 with tolerance 0.15 (models.good.accuracy.capitals)"
            ),
        "{good}"
    );
    let broken = daemon.wait_slot_state("broken", "failed");
    let reason = broken["reason"].as_str().unwrap_or("");
    eprintln!("good: {}\nbroken: {reason}", good["reason"]);
    assert!(
        reason.contains("accuracy check capitals: exact_match")
            && reason.contains(
                "fails reference 0.65 with tolerance 0.15 (models.broken.accuracy.capitals)"
            )
            && reason.contains("never served"),
        "{broken}"
    );
    // The fault really ran (its banner engaged): the check, not the banner
    // rule, is what refused it.
    assert!(
        daemon.log_text().contains("TTW_FAULT_EARLY_EXIT engaged"),
        "the early-exit banner is missing from the daemon's log"
    );
    assert!(!reason.contains("banner check failed"), "{reason}");
}

/// `ttctl ab --eval`: every arm answers the same task in the same run, on
/// its trial definition. The arm with tt-worker's early-exit fault (the
/// last quarter of the layers skipped, its banner engaged) answers worse
/// and is refused for accuracy whatever its speed; an arm identical to the
/// base keeps its answers token for token; greedy agreement shows where
/// the broken arm parts from the base.
#[test]
fn ab_eval_refuses_an_arm_that_answers_worse_and_agreement_shows_where_it_parts() {
    let Some(model) = tt_serving_tests::real_smollm2() else {
        return;
    };
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "{}\n[models.m.accuracy.capitals]\nreference = 0.65\ntolerance = 0.15\n",
                model_table("m", 1, &[0], &model, "env = { TTW_TEST_FAULTS = \"1\" }\n"),
            ),
            ..Default::default()
        },
    );
    daemon.wait_slot_state("m", "ready");
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("ab.jsonl");
    let capitals = tasks().join("capitals.jsonl");
    let run = Command::new(bin("ttctl"))
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["ab", "m", "--arm", "base:", "--arm", "again:"])
        .args(["--arm", "fast:TTW_FAULT_EARLY_EXIT=1", "--eval"])
        .arg(&capitals)
        .args([
            "--batch",
            "1",
            "--prompt-tokens",
            "64",
            "--output-tokens",
            "64",
        ])
        .args(["--repeats", "2", "--warmup", "1", "--out"])
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .expect("run ttctl ab");
    let said = text(&run);
    eprintln!("{said}");
    assert_eq!(run.status.code(), Some(1), "{said}");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("arm fast refused for accuracy: exact_match"),
        "{said}"
    );
    assert!(!said.contains("arm again refused"), "{said}");
    assert!(
        said.contains("tolerance 0.150 (models.m.accuracy.capitals)"),
        "{said}"
    );

    let records: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .expect("records")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect();
    let eval_of = |arm: &str| {
        records
            .iter()
            .find(|r| r["kind"] == "ab_eval" && r["arm"] == arm)
            .unwrap_or_else(|| panic!("an ab_eval record of arm {arm}"))
    };
    for arm in ["base", "again", "fast"] {
        let r = eval_of(arm);
        assert_eq!(r["valid"], true, "{r}");
        assert_eq!(r["samples"], 40, "{r}");
    }
    // The fault ran in its arm only, proved by its banner.
    let banners = |arm: &str| eval_of(arm)["banners"].to_string();
    assert!(
        banners("fast").contains("TTW_FAULT_EARLY_EXIT"),
        "{}",
        banners("fast")
    );
    assert!(!banners("base").contains("TTW_FAULT_EARLY_EXIT"));
    let score = |arm: &str| eval_of(arm)["score"].as_f64().expect("a score");
    assert!(score("base") >= 0.5, "base scored {}", score("base"));
    assert_eq!(score("again"), score("base"), "the same definition twice");
    assert!(
        score("fast") < score("base") - 0.15,
        "fast scored {}",
        score("fast")
    );

    let summary = |arm: &str| {
        records
            .iter()
            .find(|r| r["kind"] == "ab_summary" && r["cand"]["arm"] == arm)
            .unwrap_or_else(|| panic!("a summary of arm {arm}"))
    };
    let (again, fast) = (summary("again"), summary("fast"));
    assert_eq!(fast["accuracy"]["refused"], true, "{fast}");
    assert_eq!(again["accuracy"]["refused"], false, "{again}");
    // Both speeds measured side by side in the same run.
    assert!(
        fast["figures"]["aggregate_tok_s"]["ratio"]
            .as_f64()
            .is_some(),
        "{fast}"
    );
    // Greedy agreement: the same definition agrees token for token with
    // equal logprobs; the early exit parts from the base.
    let g = &again["agreement"];
    assert_eq!(g["identical_share"], 1.0, "{g}");
    assert_eq!(g["prompts_diverged"], 0, "{g}");
    assert_eq!(g["logprobs"], true, "{g}");
    assert_eq!(g["mean_abs_logprob_diff"], 0.0, "{g}");
    let g = &fast["agreement"];
    assert!(g["identical_share"].as_f64().unwrap_or(1.0) < 0.5, "{g}");
    assert!(g["prompts_diverged"].as_u64().unwrap_or(0) >= 6, "{g}");
}

/// A `readiness.accuracy` task file that cannot be read fails the start
/// before a worker runs (no worker, no reset owed: the card stays Ready),
/// naming the key and the file; `check-config` says the same first.
#[test]
fn an_unreadable_readiness_task_fails_the_start_before_the_worker() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = tt_serving_tests::tiny_model(dir.path());
    let missing = dir.path().join("missing.jsonl");
    let hw = FakeHw::new(1);
    let daemon = Daemon::start(
        &hw,
        DaemonOptions {
            extra: format!(
                "{}\n[models.m.readiness]\naccuracy = \"facts\"\n\n[models.m.accuracy.facts]\npass_mark = \"1/1\"\nfile = \"{}\"\n",
                model_table("m", 1, &[0], &model, "[models.m.restart]\nmax_attempts = 1\n"),
                missing.display()
            ),
            ..Default::default()
        },
    );
    let slot = daemon.wait_slot_state("m", "failed");
    let reason = slot["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains(
            "models.m.accuracy.facts.file (readiness.accuracy): cannot read the task file"
        ) && reason.contains("missing.jsonl"),
        "{slot}"
    );
    assert_eq!(slot["worker_pid"], 0, "no worker ran: {slot}");
    assert_eq!(daemon.card(&FakeHw::bdf(0))["state"], "ready");
    let check = Command::new(bin("tt-servingd"))
        .arg("check-config")
        .arg(&daemon.config)
        .output()
        .expect("run check-config");
    let said = text(&check);
    assert_ne!(check.status.code(), Some(0), "{said}");
    assert!(said.contains("models.m.accuracy.facts.file"), "{said}");
}
