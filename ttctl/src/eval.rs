//! `ttctl eval`: a served model's accuracy measured through the daemon,
//! exactly as clients get it, with lm-evaluation-harness as the engine of
//! the eval or the built-in exact-match runner, recorded beside `ttctl
//! bench`'s records and judged against a reference (docs/ACCURACY.md).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::{json, Value};
use tt_serving_proto::accuracy::{self, Gate};
use tt_serving_proto::v1::generate_request::Input;
use tt_serving_proto::v1::{GenerateRequest, StatusResponse};

use super::args::{EvalArgs, EvalRunner};
use super::bench::record::{self, Identity, SlotIdentity};
use super::client::Daemon;
use super::outcome::{emit, note, Failure};

/// A task's score.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// The metric's name (`exact_match`, `acc`, ...).
    pub metric: String,
    /// Its value, 0 to 1.
    pub value: f64,
    /// Its standard error.
    pub stderr: f64,
    /// Samples scored.
    pub samples: u64,
    /// Samples that failed (a refused or broken request).
    pub failed: u64,
    /// What ran the eval: `built-in exact match` or `lm-eval <version>`.
    pub runner: String,
}

/// One eval through the daemon: the score, what it ran on, and why it
/// must not be trusted (none: valid).
pub(crate) struct Evaluation {
    /// The score.
    pub score: Score,
    /// The model's slots, cards and cache variants when it started.
    pub identity: Identity,
    /// The banners its workers had printed.
    pub banners: BTreeSet<String>,
    /// A slot restarted or changed, a banner came or went, requests failed.
    pub problems: Vec<String>,
    /// The daemon's status when it ended (its gates).
    pub status_after: StatusResponse,
    /// When it started (Unix ms).
    pub started: u64,
}

impl Evaluation {
    /// The JSON-lines record of `ttctl eval` (kind `eval`).
    pub(crate) fn record(&self, model: &str, task: &str, runner: &EvalRunner) -> Value {
        json!({
            "kind": "eval",
            "id": record::run_id(self.started),
            "unix_ms": self.started,
            "model": model,
            "task": task,
            "runner": self.score.runner,
            "metric": self.score.metric,
            "score": self.score.value,
            "stderr": self.score.stderr,
            "samples": self.score.samples,
            "failed": self.score.failed,
            "limit": runner.limit,
            "valid": self.problems.is_empty(),
            "invalid_reasons": self.problems,
            "banners": self.banners,
            "identity": self.identity,
        })
    }
}

/// Runs `task` against `model`'s Ready slots through the router, with
/// lm-eval or the built-in runner, and checks nothing changed under it.
pub(crate) async fn evaluate(
    daemon: &mut Daemon,
    model: &str,
    task: &str,
    runner: &EvalRunner,
    err: &mut (dyn Write + Send),
) -> Result<Evaluation, Failure> {
    let before = daemon.status().await?;
    let identity = Identity::of(&before, model);
    if identity.slots.is_empty() {
        return Err(Failure::Failed(format!(
            "model {model} has no Ready slot to evaluate (see 'ttctl status')"
        )));
    }
    let started = tt_serving_proto::time::unix_ms(SystemTime::now());
    let score = match &runner.lm_eval {
        Some(program) => harness(program, &before, model, task, runner, err).await?,
        None => built_in(daemon, model, task, runner.limit, err).await?,
    };
    let after = daemon.status().await?;
    let mut problems = changed_slots(&identity.slots, &Identity::of(&after, model).slots);
    let banners = super::bench::banners(&before, model);
    let banners_after = super::bench::banners(&after, model);
    for gained in banners_after.difference(&banners) {
        problems.push(format!("{gained} engaged during the eval"));
    }
    for lost in banners.difference(&banners_after) {
        problems.push(format!("{lost} no longer engaged after the eval"));
    }
    if score.failed > 0 {
        problems.push(format!("{} requests failed", score.failed));
    }
    let identity = match daemon.list_cache().await {
        Ok(cache) => identity.with_variants(&cache),
        Err(_) => identity,
    };
    Ok(Evaluation {
        score,
        identity,
        banners,
        problems,
        status_after: after,
        started,
    })
}

/// `ttctl eval MODEL --task TASK`.
pub(super) async fn run(
    daemon: &mut Daemon,
    args: &EvalArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let (path, default) = record::path(args.out.as_deref()).map_err(Failure::Failed)?;
    let eval = evaluate(daemon, &args.model, &args.task, &args.runner, err).await?;
    let score = &eval.score;
    let verdict = verdict(score, gate(args, &eval.status_after));
    let mut rec = eval.record(&args.model, &args.task, &args.runner);
    if let Some(o) = rec.as_object_mut() {
        o.insert(
            "gate".into(),
            json!(verdict.as_ref().map(|v| v.gate.clone())),
        );
        o.insert("pass".into(), json!(verdict.as_ref().map(|v| v.pass)));
    }
    record::append(&path, std::slice::from_ref(&rec), default).map_err(Failure::Failed)?;
    if args.json {
        emit(out, &format!("{rec}\n"))?;
    } else {
        let mut line = format!(
            "{} {}: {} ({})",
            args.model,
            args.task,
            score.describe(),
            score.runner
        );
        if let Some(v) = &verdict {
            line.push_str(&format!(
                "; {} against {}",
                if v.pass { "PASS" } else { "FAIL" },
                v.gate
            ));
        }
        emit(out, &format!("{line}\n"))?;
    }
    note(err, &format!("record appended to {}\n", path.display()));
    if !eval.problems.is_empty() {
        return Err(Failure::Failed(format!(
            "the run is invalid: {}",
            eval.problems.join("; ")
        )));
    }
    match verdict {
        Some(v) if !v.pass => Err(Failure::Failed(format!(
            "{} {}: {} {:.4} fails {}",
            args.model, args.task, score.metric, score.value, v.gate
        ))),
        _ => Ok(()),
    }
}

impl Score {
    /// `exact_match 0.6500 ± 0.0754 over 40 samples`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} {:.4} ± {:.4} over {} samples",
            self.metric, self.value, self.stderr, self.samples
        )
    }
}

/// The gate and whether the score passed it.
struct Verdict {
    gate: String,
    pass: bool,
}

/// The gate the command line gives, else the model's configured one.
fn gate(args: &EvalArgs, status: &StatusResponse) -> Option<(Gate, String)> {
    if let (Some(reference), Some(tolerance)) = (args.reference, args.tolerance) {
        return Some((
            Gate::Reference {
                reference,
                tolerance,
            },
            String::new(),
        ));
    }
    if let Some((need, of)) = args.pass_mark {
        return Some((Gate::PassMark { need, of }, String::new()));
    }
    configured_gate(status, &args.model, &args.task)
}

/// The model's gate for this task (`[models.X.accuracy.TASK]`, TASK the
/// lm-eval task or the task file's name without `.jsonl`), with where it
/// came from.
pub(crate) fn configured_gate(
    status: &StatusResponse,
    model: &str,
    task: &str,
) -> Option<(Gate, String)> {
    let stem = Path::new(task)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let g = status
        .accuracy
        .iter()
        .find(|g| g.model == model && (g.task == task || g.task == stem))?;
    let source = format!(" (models.{}.accuracy.{})", g.model, g.task);
    if g.pass_of > 0 {
        return Some((
            Gate::PassMark {
                need: g.pass_correct,
                of: g.pass_of,
            },
            source,
        ));
    }
    Some((
        Gate::Reference {
            reference: g.reference?,
            tolerance: g.tolerance,
        },
        source,
    ))
}

fn verdict(score: &Score, gate: Option<(Gate, String)>) -> Option<Verdict> {
    let (gate, source) = gate?;
    let counted = match gate {
        Gate::PassMark { .. } => format!(
            " ({}/{} correct)",
            accuracy::correct_of(score.value, score.samples),
            score.samples
        ),
        Gate::Reference { .. } => String::new(),
    };
    Some(Verdict {
        gate: format!("{}{source}{counted}", gate.describe()),
        pass: gate.passes(score.value, score.samples),
    })
}

/// What changed in the model's slots while the eval ran.
fn changed_slots(before: &[SlotIdentity], after: &[SlotIdentity]) -> Vec<String> {
    let mut problems = Vec::new();
    for b in before {
        match after.iter().find(|a| a.slot == b.slot) {
            None => problems.push(format!("slot {} is no longer Ready", b.slot)),
            Some(a) if a.worker_pid != b.worker_pid || a.starts != b.starts => {
                problems.push(format!("slot {} restarted", b.slot))
            }
            Some(a) if a.flags != b.flags || a.engine != b.engine => {
                problems.push(format!("slot {} changed its engine or flags", b.slot))
            }
            Some(_) => {}
        }
    }
    problems
}

/// The built-in exact-match runner: each question greedily through the
/// router, one after another.
async fn built_in(
    daemon: &mut Daemon,
    model: &str,
    task: &str,
    limit: Option<u32>,
    err: &mut (dyn Write + Send),
) -> Result<Score, Failure> {
    let mut questions = accuracy::read_task(Path::new(task)).map_err(Failure::Failed)?;
    if let Some(limit) = limit {
        questions.truncate(limit as usize);
    }
    let (mut right, mut failed) = (0u64, 0u64);
    for (i, q) in questions.iter().enumerate() {
        let request = GenerateRequest {
            model: model.to_string(),
            input: Some(Input::Prompt(q.prompt.clone())),
            max_tokens: q.max_tokens(),
            stop: q.stop(),
            ..Default::default()
        };
        match answer(daemon, request).await {
            Ok(text) if q.is_answered_by(&text) => right += 1,
            Ok(_) => {}
            Err(why) => {
                failed += 1;
                note(err, &format!("question {}: {why}\n", i + 1));
            }
        }
    }
    let n = questions.len() as u64;
    Ok(Score {
        metric: "exact_match".into(),
        value: right as f64 / n as f64,
        stderr: accuracy::binary_stderr(right, n),
        samples: n,
        failed,
        runner: "built-in exact match".into(),
    })
}

/// One greedy answer's text.
async fn answer(daemon: &mut Daemon, request: GenerateRequest) -> Result<String, String> {
    super::bench::agreement::answer(daemon, request)
        .await
        .map(|a| a.text)
}

/// lm-evaluation-harness against the daemon's OpenAI door.
async fn harness(
    program: &Path,
    status: &StatusResponse,
    model: &str,
    task: &str,
    args: &EvalRunner,
    err: &mut (dyn Write + Send),
) -> Result<Score, Failure> {
    let door = status
        .daemon
        .as_ref()
        .map(|d| d.openai_address.clone())
        .unwrap_or_default();
    if door.is_empty() {
        return Err(Failure::Failed(
            "the daemon has no OpenAI door, which lm-eval's local-completions model talks to; set [openai] listen in its config".into(),
        ));
    }
    let output = tempfile::tempdir().map_err(|e| {
        Failure::Failed(format!(
            "cannot make a directory for lm-eval's results: {e}"
        ))
    })?;
    let mut model_args = format!(
        "base_url=http://{door}/v1/completions,model={model},num_concurrent=1,max_retries=1"
    );
    match &args.tokenizer {
        Some(t) => model_args.push_str(&format!(
            ",tokenizer_backend=huggingface,tokenizer={t},tokenized_requests=True"
        )),
        None => model_args.push_str(",tokenizer_backend=None,tokenized_requests=False"),
    }
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(["--model", "local-completions", "--model_args", &model_args])
        .args(["--tasks", task])
        .args(["--batch_size", &args.batch_size.to_string()])
        .args(["--seed", "1234"])
        .arg("--output_path")
        .arg(output.path());
    if let Some(limit) = args.limit {
        cmd.args(["--limit", &limit.to_string()]);
    }
    if let Some(dir) = &args.include_path {
        let dir = std::fs::canonicalize(dir).map_err(|e| {
            Failure::Failed(format!(
                "--include-path {}: {e}; give the directory of the task YAML files",
                dir.display()
            ))
        })?;
        // Task files name their data relative to themselves.
        cmd.arg("--include_path").arg(&dir).current_dir(&dir);
    }
    // lm-eval's own report goes to stderr with its progress: stdout is
    // ttctl's summary (or record).
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Failure::Failed(format!("cannot pass stderr to lm-eval: {e}")))?;
    cmd.stdout(std::process::Stdio::from(stderr))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    note(
        err,
        &format!(
            "running {} on task {task} against http://{door} (model {model})\n",
            program.display(),
        ),
    );
    let exit = cmd.status().await.map_err(|e| {
        Failure::Failed(format!(
            "cannot run {}: {e} (give --lm-eval the lm_eval program of a venv with lm-eval; scripts/lm-eval.sh makes one and prints it)",
            program.display()
        ))
    })?;
    if !exit.success() {
        return Err(Failure::Failed(format!(
            "{} {} (its output is above)",
            program.display(),
            match exit.code() {
                Some(c) => format!("exited with status {c}"),
                None => "was killed by a signal".into(),
            }
        )));
    }
    let results = find_results(output.path()).ok_or_else(|| {
        Failure::Failed(format!(
            "lm-eval left no results_*.json under {}",
            output.path().display()
        ))
    })?;
    let text = std::fs::read_to_string(&results)
        .map_err(|e| Failure::Failed(format!("cannot read {}: {e}", results.display())))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::Failed(format!("{} is not JSON: {e}", results.display())))?;
    score_of(&value, task, args.metric.as_deref()).map_err(Failure::Failed)
}

use std::os::fd::AsFd;

/// The newest `results_*.json` under `dir`.
fn find_results(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                todo.push(path);
            } else if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("results") && n.ends_with(".json"))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found.pop()
}

/// The task's score from lm-eval's results file: `results.TASK` holds
/// `METRIC,FILTER` and `METRIC_stderr,FILTER` numbers, `n-samples.TASK`
/// the samples, `config.model_args`/`lm_eval_version` the run.
pub fn score_of(results: &Value, task: &str, metric: Option<&str>) -> Result<Score, String> {
    let scores = results["results"][task].as_object().ok_or_else(|| {
        let known: Vec<&String> = results["results"]
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        format!("lm-eval's results have no task {task} (they have {known:?})")
    })?;
    let numbers: BTreeMap<&str, f64> = scores
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.as_f64()?)))
        .collect();
    let key = match metric {
        Some(m) => numbers
            .keys()
            .find(|k| k.split(',').next() == Some(m))
            .copied()
            .ok_or_else(|| {
                format!(
                    "task {task} has no metric {m} (it has {:?})",
                    numbers.keys().collect::<Vec<_>>()
                )
            })?,
        None => numbers
            .keys()
            .find(|k| !k.contains("_stderr"))
            .copied()
            .ok_or_else(|| format!("task {task} has no score in lm-eval's results"))?,
    };
    let (name, filter) = key.split_once(',').unwrap_or((key, "none"));
    let stderr = numbers
        .get(format!("{name}_stderr,{filter}").as_str())
        .copied()
        .unwrap_or(0.0);
    let samples = results["n-samples"][task]["effective"]
        .as_u64()
        .unwrap_or(0);
    let version = results["lm_eval_version"].as_str().unwrap_or("?");
    Ok(Score {
        metric: name.to_string(),
        value: numbers[key],
        stderr,
        samples,
        failed: 0,
        runner: format!("lm-eval {version}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lm_evals_results_give_the_first_metric_or_the_one_asked() {
        let results = json!({
            "results": {"tt_facts_mc": {
                "alias": "tt_facts_mc",
                "acc,none": 0.75, "acc_stderr,none": 0.1,
                "acc_norm,none": 0.8, "acc_norm_stderr,none": 0.09,
            }},
            "n-samples": {"tt_facts_mc": {"original": 20, "effective": 20}},
            "lm_eval_version": "0.4.13",
        });
        let s = score_of(&results, "tt_facts_mc", None).unwrap();
        assert_eq!(
            (s.metric.as_str(), s.value, s.stderr, s.samples),
            ("acc", 0.75, 0.1, 20)
        );
        assert_eq!(s.runner, "lm-eval 0.4.13");
        let norm = score_of(&results, "tt_facts_mc", Some("acc_norm")).unwrap();
        assert_eq!((norm.value, norm.stderr), (0.8, 0.09));
        let e = score_of(&results, "tt_facts_mc", Some("f1")).unwrap_err();
        assert!(e.contains("no metric f1"), "{e}");
        let e = score_of(&results, "gsm8k", None).unwrap_err();
        assert!(e.contains("no task gsm8k"), "{e}");
    }
}
