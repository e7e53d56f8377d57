//! `ttctl ab`: arms that differ only by flags, on the same cards,
//! interleaved, each proving by its banners what engaged, every figure
//! recorded with its arm, and the configured definition put back however
//! the run ends.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::time::SystemTime;

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tt_serving_proto::v1::trial_event::Kind;
use tt_serving_proto::v1::{trial_request, TrialArm, TrialDone, TrialEvent, TrialRequest};

use super::super::args::{AbArgs, Arm};
use super::super::client::{Answers, Daemon};
use super::super::eval;
use super::super::outcome::{emit, note, Failure};
use super::agreement::{self, Answer};
use super::{measure_rung, record, records_path, Calibrations, Workload};
use tt_serving_proto::accuracy::Gate;
use tt_worker_contract::banner::is_truthy;

/// How a run ended before its summary.
enum Stop {
    /// Interrupted (Ctrl-C).
    Interrupted,
    /// Something failed; the message says what.
    Failed(String),
}

/// What each arm answered in the first round, beside its speed: its
/// greedy answers to the fixed prompts, and its eval record (`--eval`).
#[derive(Default)]
struct ArmChecks {
    answers: BTreeMap<String, Vec<Answer>>,
    evals: BTreeMap<String, Value>,
}

/// How far below the base arm's score another arm's may fall, and where
/// that came from; None: two standard errors of the difference.
type Tolerance = Option<(f64, String)>;

/// The trial stream: arms go out, events come back.
struct Trial {
    requests: mpsc::Sender<TrialRequest>,
    events: Answers<TrialEvent>,
}

impl Trial {
    /// Sends `arm` and waits for it to be Ready (or not).
    async fn bring_up(
        &mut self,
        model: &str,
        arm: &Arm,
        purpose: &str,
        err: &mut (dyn Write + Send),
    ) -> Result<TrialEvent, Stop> {
        let request = TrialRequest {
            step: Some(trial_request::Step::Arm(TrialArm {
                model: model.to_string(),
                name: arm.name.clone(),
                flags: arm.flags.clone().into_iter().collect(),
                purpose: purpose.to_string(),
            })),
        };
        if self.requests.send(request).await.is_err() {
            return Err(Stop::Failed("tt-servingd ended the trial".into()));
        }
        loop {
            match self.events.next().await {
                Ok(Some(ev)) if ev.kind == Kind::ArmReady as i32 => return Ok(ev),
                Ok(Some(ev)) if ev.kind == Kind::ArmFailed as i32 => {
                    return Err(Stop::Failed(ev.message))
                }
                Ok(Some(ev)) => note(err, &format!("{}\n", ev.message)),
                Ok(None) => return Err(Stop::Failed("tt-servingd ended the trial".into())),
                Err(f) => return Err(Stop::Failed(f.message().to_string())),
            }
        }
    }

    /// Says done and waits for the configured definition to be back.
    async fn restore(mut self) -> Result<String, Failure> {
        let done = TrialRequest {
            step: Some(trial_request::Step::Done(TrialDone {})),
        };
        let _ = self.requests.send(done).await;
        loop {
            match self.events.next().await? {
                Some(ev) if ev.kind == Kind::Restored as i32 => {
                    return if ev.ok {
                        Ok(ev.message)
                    } else {
                        Err(Failure::Failed(ev.message))
                    };
                }
                Some(_) => {}
                None => {
                    return Err(Failure::Failed(
                        "tt-servingd ended the trial without saying the configured definition is back; check 'ttctl status'".into(),
                    ))
                }
            }
        }
    }
}

/// The flags an arm runs with: the configured ones, then the arm's.
fn effective(configured: &BTreeMap<String, String>, arm: &Arm) -> BTreeMap<String, String> {
    let mut flags = configured.clone();
    for (k, v) in &arm.flags {
        if v.is_empty() {
            flags.remove(k);
        } else {
            flags.insert(k.clone(), v.clone());
        }
    }
    flags
}

/// Why an arm's record must not be trusted, from what its slots showed:
/// a truthy arm flag without its banner, a falsy one with it, or slots not
/// running the arm's flags.
fn arm_problems(rec: &Value, arm: &Arm, expected: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let banners: Vec<&str> = rec["banners"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (flag, value) in &arm.flags {
        let shown = banners.contains(&flag.as_str());
        if is_truthy(value) && !shown {
            problems.push(format!(
                "arm {}: {flag}={value} but no `{flag} engaged` in the workers' output",
                arm.name
            ));
        }
        if !is_truthy(value) && shown {
            problems.push(format!(
                "arm {}: {flag}={value:?} yet `{flag} engaged` was printed",
                arm.name
            ));
        }
    }
    for slot in rec["identity"]["slots"].as_array().into_iter().flatten() {
        let running: BTreeMap<String, String> = slot["flags"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        if &running != expected {
            problems.push(format!(
                "slot {} ran flags {running:?}, not arm {}'s {expected:?} (a reload during the trial?)",
                slot["slot"].as_str().unwrap_or("?"),
                arm.name
            ));
        }
    }
    problems
}

/// `ttctl ab MODEL --arm ... --arm ...`.
pub(crate) async fn run(
    daemon: &mut Daemon,
    args: &AbArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
    ctrl_c: impl Future<Output = std::io::Result<()>>,
) -> Result<(), Failure> {
    if args.arms.len() < 2 {
        return Err(Failure::Failed(
            "give at least two arms (--arm base: --arm cand:FLAG=1)".into(),
        ));
    }
    let mut names: Vec<&str> = args.arms.iter().map(|a| a.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    if names.len() != args.arms.len() {
        return Err(Failure::Failed("arm names must differ".into()));
    }
    let status = daemon.status().await?;
    let configured: BTreeMap<String, String> = status
        .slots
        .iter()
        .find(|s| s.model == args.model)
        .map(|s| s.flags.clone().into_iter().collect())
        .ok_or_else(|| {
            Failure::Failed(format!(
                "no slot of model {} (see 'ttctl status')",
                args.model
            ))
        })?;
    let (path, default) = records_path(&args.workload)?;
    let workload = Workload::from_args(&args.workload);
    let started = tt_serving_proto::time::unix_ms(SystemTime::now());
    let run_id = record::run_id(started);
    let purpose = format!("ttctl ab (pid {}, run {run_id})", std::process::id());

    let (requests, rx) = mpsc::channel(4);
    let events = daemon.trial(rx).await?;
    let mut trial = Trial { requests, events };
    let tolerance: Tolerance = match (&args.eval, args.eval_tolerance) {
        (Some(_), Some(t)) => Some((t, "--eval-tolerance".into())),
        (Some(task), None) => match eval::configured_gate(&status, &args.model, task) {
            Some((Gate::Reference { tolerance, .. }, source)) => {
                let source = source.trim().trim_start_matches('(').trim_end_matches(')');
                Some((tolerance, source.to_string()))
            }
            _ => None,
        },
        (None, _) => None,
    };
    let mut records: Vec<Value> = Vec::new();
    let mut checks = ArmChecks::default();
    let measured = {
        let work = measure_arms(
            daemon,
            args,
            &workload,
            &configured,
            &run_id,
            &purpose,
            &mut trial,
            &mut records,
            &mut checks,
            &path,
            default,
            out,
            err,
        );
        tokio::pin!(ctrl_c);
        tokio::select! {
            r = work => r,
            _ = &mut ctrl_c => Err(Stop::Interrupted),
        }
    };
    // However it went, the configured definition comes back first.
    note(err, "restoring the configured definition...\n");
    let restored = trial.restore().await;
    match &restored {
        Ok(message) => note(err, &format!("{message}\n")),
        Err(f) => note(err, &format!("{}\n", f.message())),
    }
    match measured {
        Err(Stop::Interrupted) => {
            note(
                err,
                &format!(
                    "interrupted; {} record(s) appended to {}\n",
                    records.len(),
                    path.display()
                ),
            );
            restored?;
            return Err(Failure::JobExit(130));
        }
        Err(Stop::Failed(why)) => {
            restored?;
            return Err(Failure::Failed(why));
        }
        Ok(()) => restored.map(|_| ())?,
    }
    let summaries = summarize(
        &run_id,
        &args.model,
        &args.arms,
        &workload,
        &records,
        &checks,
        &tolerance,
    );
    record::append(&path, &summaries, default).map_err(Failure::Failed)?;
    for s in &summaries {
        if args.workload.json {
            emit(out, &format!("{s}\n"))?;
        } else {
            emit(out, &summary_lines(s))?;
        }
    }
    note(
        err,
        &format!("records appended to {} (run {run_id})\n", path.display()),
    );
    let mut refused: Vec<String> = Vec::new();
    for s in summaries
        .iter()
        .filter(|s| s["accuracy"]["refused"] == true)
    {
        let why = format!(
            "arm {} {}",
            s["cand"]["arm"].as_str().unwrap_or("?"),
            s["accuracy"]["verdict"]
                .as_str()
                .unwrap_or("refused for accuracy")
        );
        if !refused.contains(&why) {
            refused.push(why);
        }
    }
    if records.iter().any(|r| r["valid"] == false) {
        refused.push("some records are invalid (see their invalid_reasons); the comparison is not to be trusted".into());
    }
    if !refused.is_empty() {
        return Err(Failure::Failed(refused.join("; ")));
    }
    Ok(())
}

/// The rounds: every arm in turn, every rung once per arm and round.
#[allow(clippy::too_many_arguments)]
async fn measure_arms(
    daemon: &mut Daemon,
    args: &AbArgs,
    workload: &Workload,
    configured: &BTreeMap<String, String>,
    run_id: &str,
    purpose: &str,
    trial: &mut Trial,
    records: &mut Vec<Value>,
    checks: &mut ArmChecks,
    path: &std::path::Path,
    default: bool,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<(), Stop> {
    let per_arm = Workload {
        repeats: 1,
        ..workload.clone()
    };
    let mut calibrations = Calibrations::default();
    let mut next_request =
        (tt_serving_proto::time::unix_ms(SystemTime::now()) / 1000) as u32 & 0x7fff;
    let mut order = 0u32;
    let width = args
        .arms
        .iter()
        .map(|a| a.name.len())
        .max()
        .unwrap_or(0)
        .max(6);
    if !args.workload.json {
        let _ = emit(
            out,
            &format!(
                "{:<6} {:<width$} {}\n",
                "ROUND",
                "ARM",
                super::table_header()
            ),
        );
    }
    for round in 0..workload.repeats {
        for arm in &args.arms {
            note(
                err,
                &format!(
                    "round {}/{}: bringing up arm {}\n",
                    round + 1,
                    workload.repeats,
                    arm.name
                ),
            );
            trial.bring_up(&args.model, arm, purpose, err).await?;
            let expected = effective(configured, arm);
            for rung in &workload.rungs {
                let result = measure_rung(
                    daemon,
                    &args.model,
                    rung,
                    &per_arm,
                    &mut calibrations,
                    &mut next_request,
                    err,
                )
                .await
                .map_err(|f| Stop::Failed(f.message().to_string()))?;
                let mut rec = result.record(
                    &format!("{run_id}-{}-r{round}", arm.name),
                    &args.model,
                    rung,
                    &per_arm,
                );
                let mut invalid: Vec<String> = rec["invalid_reasons"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                invalid.extend(arm_problems(&rec, arm, &expected));
                if let Some(o) = rec.as_object_mut() {
                    o.insert("kind".into(), json!("ab"));
                    o.insert("run".into(), json!(run_id));
                    o.insert("arm".into(), json!(arm.name));
                    o.insert("arm_flags".into(), json!(arm.flags));
                    o.insert("flags".into(), json!(expected));
                    o.insert("round".into(), json!(round));
                    o.insert("order".into(), json!(order));
                    o.insert("valid".into(), json!(invalid.is_empty()));
                    o.insert("invalid_reasons".into(), json!(invalid));
                }
                order += 1;
                record::append(path, std::slice::from_ref(&rec), default).map_err(Stop::Failed)?;
                if args.workload.json {
                    let _ = emit(out, &format!("{rec}\n"));
                } else {
                    let _ = emit(
                        out,
                        &format!(
                            "{:<6} {:<width$} {}\n",
                            round + 1,
                            arm.name,
                            super::table_row(&rec)
                        ),
                    );
                }
                let restarted = result
                    .invalid
                    .iter()
                    .find(|r| r.contains("restarted") || r.contains("left Ready"));
                records.push(rec);
                if let Some(why) = restarted {
                    return Err(Stop::Failed(format!(
                        "arm {} lost its worker mid-run: {why}",
                        arm.name
                    )));
                }
            }
            // After the speed rounds, so that what they measure is the
            // arm as it came up.
            if round == 0 {
                first_round_checks(daemon, args, arm, &expected, run_id, checks, err).await?;
                if let Some(rec) = checks.evals.get(&arm.name) {
                    record::append(path, std::slice::from_ref(rec), default)
                        .map_err(Stop::Failed)?;
                    if args.workload.json {
                        let _ = emit(out, &format!("{rec}\n"));
                    }
                    records.push(rec.clone());
                }
            }
        }
    }
    Ok(())
}

/// The first round's answers of one arm: greedy answers to the fixed
/// prompts, and the eval when asked (its record, with the arm's banners
/// checked like a speed record's).
async fn first_round_checks(
    daemon: &mut Daemon,
    args: &AbArgs,
    arm: &Arm,
    expected: &BTreeMap<String, String>,
    run_id: &str,
    checks: &mut ArmChecks,
    err: &mut (dyn Write + Send),
) -> Result<(), Stop> {
    note(
        err,
        &format!(
            "arm {}: greedy answers to {} fixed prompts\n",
            arm.name,
            agreement::PROMPTS.len()
        ),
    );
    let answers = agreement::answers(daemon, &args.model)
        .await
        .map_err(|why| Stop::Failed(format!("arm {}: {why}", arm.name)))?;
    checks.answers.insert(arm.name.clone(), answers);
    let Some(task) = &args.eval else {
        return Ok(());
    };
    note(err, &format!("arm {}: evaluating {task}\n", arm.name));
    let evaluation = eval::evaluate(daemon, &args.model, task, &args.runner, err)
        .await
        .map_err(|f| Stop::Failed(format!("arm {}: eval {task}: {}", arm.name, f.message())))?;
    let mut rec = evaluation.record(&args.model, task, &args.runner);
    let mut invalid = evaluation.problems.clone();
    invalid.extend(arm_problems(&rec, arm, expected));
    note(
        err,
        &format!(
            "arm {}: {task}: {}{}\n",
            arm.name,
            evaluation.score.describe(),
            if invalid.is_empty() { "" } else { " (INVALID)" }
        ),
    );
    if let Some(o) = rec.as_object_mut() {
        o.insert("kind".into(), json!("ab_eval"));
        o.insert("id".into(), json!(format!("{run_id}-{}-eval", arm.name)));
        o.insert("run".into(), json!(run_id));
        o.insert("arm".into(), json!(arm.name));
        o.insert("arm_flags".into(), json!(arm.flags));
        o.insert("flags".into(), json!(expected));
        o.insert("valid".into(), json!(invalid.is_empty()));
        o.insert("invalid_reasons".into(), json!(invalid));
    }
    checks.evals.insert(arm.name.clone(), rec);
    Ok(())
}

/// The accuracy comparison of two arms' eval records: each score with its
/// error, the difference, the tolerance and the verdict. An arm is
/// refused when its score falls below the base arm's by more than the
/// tolerance; a better score is never refused.
fn compare_accuracy(
    base_name: &str,
    cand_name: &str,
    base: &Value,
    cand: &Value,
    tolerance: &Tolerance,
) -> Value {
    let num = |r: &Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    let (b, bse, c, cse) = (
        num(base, "score"),
        num(base, "stderr"),
        num(cand, "score"),
        num(cand, "stderr"),
    );
    let (tol, source) = match tolerance {
        Some((t, source)) => (*t, source.clone()),
        None => (
            2.0 * (bse * bse + cse * cse).sqrt(),
            "two standard errors of the difference".to_string(),
        ),
    };
    let difference = c - b;
    let refused = difference.is_nan() || difference < -tol;
    let metric = base["metric"].as_str().unwrap_or("score");
    let verdict = if refused {
        format!(
            "refused for accuracy: {metric} {c:.3} ± {cse:.3} against {base_name}'s {b:.3} ± {bse:.3}, {:.3} below, outside the tolerance {tol:.3} ({source})",
            -difference
        )
    } else {
        format!(
            "keeps its answers: {metric} {c:.3} ± {cse:.3} against {base_name}'s {b:.3} ± {bse:.3}, within the tolerance {tol:.3} ({source})"
        )
    };
    json!({
        "task": base["task"],
        "metric": metric,
        base_name: {"score": b, "stderr": bse, "samples": base["samples"], "record": base["id"]},
        cand_name: {"score": c, "stderr": cse, "samples": cand["samples"], "record": cand["id"]},
        "difference": r3(difference),
        "tolerance": r3(tol),
        "tolerance_source": source,
        "refused": refused,
        "verdict": verdict,
    })
}

/// Median, lowest and highest of the finite values.
fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let v: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((super::stats::quantile(&v, 0.5), min, max))
}

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The figures compared: where in a record, and whether higher is better.
const FIGURES: [(&str, &str, bool); 3] = [
    (
        "decode_tok_s_per_user",
        "/decode_tok_s_per_user/median",
        true,
    ),
    ("aggregate_tok_s", "/aggregate_tok_s/median", true),
    ("ttft_p50_ms", "/ttft_ms/p50", false),
];

/// One summary record per rung and non-baseline arm: each arm's median and
/// spread over rounds, the ratio to the baseline with its spread, and a
/// verdict only when the spreads do not overlap.
fn summarize(
    run_id: &str,
    model: &str,
    arms: &[Arm],
    workload: &Workload,
    records: &[Value],
    checks: &ArmChecks,
    tolerance: &Tolerance,
) -> Vec<Value> {
    let mut out = Vec::new();
    let Some(base) = arms.first() else { return out };
    for rung in &workload.rungs {
        let of = |arm: &str| -> Vec<&Value> {
            records
                .iter()
                .filter(|r| {
                    r["arm"] == arm
                        && r["workload"]["batch"] == rung.batch
                        && r["workload"]["prompt_tokens"] == rung.prompt_tokens
                })
                .collect()
        };
        let base_recs = of(&base.name);
        for cand in &arms[1..] {
            let cand_recs = of(&cand.name);
            let mut figures = serde_json::Map::new();
            for (name, pointer, higher_better) in FIGURES {
                let values = |recs: &[&Value]| -> Vec<f64> {
                    recs.iter()
                        .filter_map(|r| r.pointer(pointer).and_then(Value::as_f64))
                        .collect()
                };
                let (Some(b), Some(c)) = (spread(&values(&base_recs)), spread(&values(&cand_recs)))
                else {
                    continue;
                };
                let overlap = c.1 <= b.2 && b.1 <= c.2;
                let verdict = if overlap {
                    "no verdict: the spreads overlap".to_string()
                } else if (c.0 > b.0) == higher_better {
                    format!("{} better", cand.name)
                } else {
                    format!("{} worse", cand.name)
                };
                figures.insert(
                    name.into(),
                    json!({
                        base.name.clone(): {"median": r3(b.0), "min": r3(b.1), "max": r3(b.2)},
                        cand.name.clone(): {"median": r3(c.0), "min": r3(c.1), "max": r3(c.2)},
                        "ratio": r3(c.0 / b.0),
                        "ratio_min": r3(c.1 / b.2),
                        "ratio_max": r3(c.2 / b.1),
                        "verdict": verdict,
                    }),
                );
            }
            let evals: Vec<&Value> = [&base.name, &cand.name]
                .iter()
                .filter_map(|a| checks.evals.get(*a))
                .collect();
            let accuracy = match (checks.evals.get(&base.name), checks.evals.get(&cand.name)) {
                (Some(b), Some(c)) => compare_accuracy(&base.name, &cand.name, b, c, tolerance),
                _ => Value::Null,
            };
            let agreement = match (
                checks.answers.get(&base.name),
                checks.answers.get(&cand.name),
            ) {
                (Some(b), Some(c)) => agreement::compare(b, c),
                _ => Value::Null,
            };
            let all: Vec<&Value> = base_recs
                .iter()
                .chain(cand_recs.iter())
                .copied()
                .chain(evals)
                .collect();
            let invalid: Vec<String> = all
                .iter()
                .filter(|r| r["valid"] == false)
                .map(|r| format!("{} is invalid", r["id"].as_str().unwrap_or("?")))
                .collect();
            out.push(json!({
                "id": format!("{run_id}-ab-{}-b{}-p{}", cand.name, rung.batch, rung.prompt_tokens),
                "kind": "ab_summary",
                "run": run_id,
                "model": model,
                "unix_ms": tt_serving_proto::time::unix_ms(SystemTime::now()),
                "base": {"arm": base.name, "flags": base.flags},
                "cand": {"arm": cand.name, "flags": cand.flags},
                "workload": {"batch": rung.batch, "prompt_tokens": rung.prompt_tokens,
                             "output_tokens": rung.output_tokens, "rounds": workload.repeats},
                "records": all.iter().map(|r| r["id"].clone()).collect::<Vec<_>>(),
                "figures": figures,
                "accuracy": accuracy,
                "agreement": agreement,
                "valid": invalid.is_empty() && !all.is_empty(),
                "invalid_reasons": invalid,
            }));
        }
    }
    out
}

fn summary_lines(s: &Value) -> String {
    let base = s["base"]["arm"].as_str().unwrap_or("base");
    let cand = s["cand"]["arm"].as_str().unwrap_or("cand");
    let mut text = format!(
        "\n{} vs {} at B={} prompt={} ({} rounds){}\n",
        cand,
        base,
        s["workload"]["batch"],
        s["workload"]["prompt_tokens"],
        s["workload"]["rounds"],
        if s["valid"] == true { "" } else { " INVALID" }
    );
    for (name, _, _) in FIGURES {
        let f = &s["figures"][name];
        if f.is_null() {
            continue;
        }
        let arm = |a: &str| {
            format!(
                "{:.1} ({:.1}-{:.1})",
                f[a]["median"].as_f64().unwrap_or(f64::NAN),
                f[a]["min"].as_f64().unwrap_or(f64::NAN),
                f[a]["max"].as_f64().unwrap_or(f64::NAN)
            )
        };
        text.push_str(&format!(
            "  {:<22} {base} {:<22} {cand} {:<22} ratio {:.3} ({:.3}-{:.3})  {}\n",
            name,
            arm(base),
            arm(cand),
            f["ratio"].as_f64().unwrap_or(f64::NAN),
            f["ratio_min"].as_f64().unwrap_or(f64::NAN),
            f["ratio_max"].as_f64().unwrap_or(f64::NAN),
            f["verdict"].as_str().unwrap_or("")
        ));
    }
    let g = &s["agreement"];
    if !g.is_null() {
        let divergence: Vec<String> = g["first_divergence"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| d.as_u64().map_or("-".into(), |d| d.to_string()))
            .collect();
        text.push_str(&format!(
            "  greedy agreement       {:.1}% identical {} over {} prompts, first divergence [{}], mean |Δ logprob| before it {}\n",
            g["identical_share"].as_f64().unwrap_or(f64::NAN) * 100.0,
            g["unit"].as_str().unwrap_or("tokens"),
            g["prompts"],
            divergence.join(" "),
            match (g["logprobs"] == true, g["mean_abs_logprob_diff"].as_f64()) {
                (false, _) => "not returned by the engine".to_string(),
                (true, None) => "none (every prompt parted at its first token)".to_string(),
                (true, Some(d)) => format!("{d:.4}"),
            }
        ));
    }
    let a = &s["accuracy"];
    if !a.is_null() {
        let faster = s["figures"]["aggregate_tok_s"]["ratio"]
            .as_f64()
            .filter(|r| *r > 1.0 && a["refused"] == true)
            .map(|r| format!(" (refused although {r:.3}x as fast)"))
            .unwrap_or_default();
        let task = a["task"].as_str().unwrap_or("");
        let task = std::path::Path::new(task)
            .file_stem()
            .and_then(|t| t.to_str())
            .unwrap_or(task);
        text.push_str(&format!(
            "  accuracy {:<13} {}{faster}\n",
            task,
            a["verdict"].as_str().unwrap_or("")
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(arm: &str, tok_s: f64) -> Value {
        json!({"id": format!("x-{arm}-{tok_s}"), "arm": arm, "valid": true,
               "workload": {"batch": 1, "prompt_tokens": 128},
               "aggregate_tok_s": {"median": tok_s}})
    }

    fn arms() -> Vec<Arm> {
        vec![
            Arm {
                name: "base".into(),
                flags: BTreeMap::new(),
            },
            Arm {
                name: "cand".into(),
                flags: [("F".to_string(), "1".to_string())].into(),
            },
        ]
    }

    fn workload() -> Workload {
        Workload {
            rungs: vec![super::super::Rung {
                batch: 1,
                prompt_tokens: 128,
                output_tokens: 8,
            }],
            repeats: 3,
            warmup: 0,
            steady_skip: 1,
        }
    }

    #[test]
    fn a_verdict_only_when_the_spreads_do_not_overlap() {
        let apart = [
            rec("base", 100.0),
            rec("cand", 120.0),
            rec("base", 102.0),
            rec("cand", 121.0),
            rec("base", 101.0),
            rec("cand", 119.0),
        ];
        let none = ArmChecks::default();
        let s = &summarize("r", "m", &arms(), &workload(), &apart, &none, &None)[0];
        let f = &s["figures"]["aggregate_tok_s"];
        assert_eq!(f["verdict"], "cand better");
        assert_eq!(f["ratio"], r3(120.0 / 101.0));
        assert_eq!(f["ratio_min"], r3(119.0 / 102.0));
        assert_eq!(s["valid"], true);
        assert_eq!(s["id"], "r-ab-cand-b1-p128");
        let overlapping = [
            rec("base", 100.0),
            rec("cand", 101.0),
            rec("base", 110.0),
            rec("cand", 105.0),
        ];
        let s = &summarize("r", "m", &arms(), &workload(), &overlapping, &none, &None)[0];
        assert_eq!(
            s["figures"]["aggregate_tok_s"]["verdict"],
            "no verdict: the spreads overlap"
        );
    }

    #[test]
    fn bad_arms_are_usage_errors_naming_the_problem() {
        use clap::Parser;
        let parse = |arm: &str| {
            crate::Cli::try_parse_from(["ttctl", "ab", "m", "--arm", "base:", "--arm", arm])
                .map(|_| ())
                .map_err(|e| (e.exit_code(), e.to_string()))
        };
        assert!(parse("cand:TTW_KV_F16=1,OTHER=").is_ok());
        for (arm, says) in [
            ("cand", "an arm is NAME: or NAME:FLAG=VALUE"),
            ("c d:X=1", "arm name"),
            ("cand:TTW_KV_F16", "a flag is FLAG=VALUE"),
            ("cand:BAD-NAME=1", "not a flag name"),
            ("cand:A=1,A=2", "given twice"),
        ] {
            let (code, text) = parse(arm).unwrap_err();
            assert_eq!(code, 2, "{arm}: {text}");
            assert!(text.contains(says), "{arm}: {text}");
        }
    }

    #[test]
    fn banners_must_follow_the_arm_flags() {
        let arm = Arm {
            name: "cand".into(),
            flags: [
                ("F".to_string(), "1".to_string()),
                ("G".to_string(), "0".to_string()),
            ]
            .into(),
        };
        let expected: BTreeMap<String, String> = arm.flags.clone();
        let good = json!({"banners": ["F"], "identity": {"slots": [{"slot": "m", "flags": {"F": "1", "G": "0"}}]}});
        assert!(arm_problems(&good, &arm, &expected).is_empty());
        let bad =
            json!({"banners": ["G"], "identity": {"slots": [{"slot": "m", "flags": {"F": "1"}}]}});
        let p = arm_problems(&bad, &arm, &expected);
        assert_eq!(p.len(), 3, "{p:?}");
    }

    fn eval_rec(score: f64, stderr: f64) -> Value {
        json!({"id": format!("e-{score}"), "task": "/t/capitals.jsonl", "metric": "exact_match",
               "score": score, "stderr": stderr, "samples": 40})
    }

    #[test]
    fn an_arm_below_the_base_by_more_than_the_tolerance_is_refused_a_better_one_never() {
        let base = eval_rec(0.65, 0.075);
        let gate: Tolerance = Some((0.15, "models.m.accuracy.capitals".into()));
        let broken = compare_accuracy("base", "fast", &base, &eval_rec(0.0, 0.0), &gate);
        assert_eq!(broken["refused"], true);
        assert_eq!(broken["difference"], -0.65);
        let v = broken["verdict"].as_str().unwrap();
        assert!(
            v.starts_with("refused for accuracy: exact_match 0.000"),
            "{v}"
        );
        assert!(
            v.contains("tolerance 0.150 (models.m.accuracy.capitals)"),
            "{v}"
        );
        let close = compare_accuracy("base", "f16", &base, &eval_rec(0.55, 0.08), &gate);
        assert_eq!(close["refused"], false, "{close}");
        let better = compare_accuracy("base", "f16", &base, &eval_rec(0.95, 0.03), &gate);
        assert_eq!(better["refused"], false, "{better}");
        // No gate: two standard errors of the difference, said so.
        let statistical = compare_accuracy("base", "f16", &base, &eval_rec(0.40, 0.077), &None);
        assert_eq!(
            statistical["tolerance"],
            r3(2.0 * (0.075f64.powi(2) + 0.077f64.powi(2)).sqrt())
        );
        assert_eq!(statistical["refused"], true, "{statistical}");
        assert_eq!(
            statistical["tolerance_source"],
            "two standard errors of the difference"
        );
    }

    #[test]
    fn eval_options_without_eval_are_usage_errors() {
        use clap::Parser;
        let check = |extra: &[&str]| {
            let mut argv = vec!["ttctl", "ab", "m", "--arm", "base:", "--arm", "c:"];
            argv.extend_from_slice(extra);
            crate::Cli::try_parse_from(argv)
                .and_then(|cli| cli.check())
                .map_err(|e| (e.exit_code(), e.to_string()))
        };
        assert!(check(&["--eval", "t.jsonl", "--limit", "5"]).is_ok());
        let (code, text) = check(&["--limit", "5"]).unwrap_err();
        assert_eq!(code, 2);
        assert!(text.contains("--eval TASK"), "{text}");
        let (code, text) = check(&["--eval-tolerance", "0.1"]).unwrap_err();
        assert_eq!(code, 2, "{text}");
        let (code, text) = check(&["--eval", "t", "--eval-tolerance", "3"]).unwrap_err();
        assert_eq!(code, 2);
        assert!(text.contains("from 0 to 1"), "{text}");
    }
}
