//! `ttctl bench`: a served model measured through the daemon's router, as
//! the field measures (docs/BENCHMARKING.md): rungs of batch size and
//! prompt length, calibrated prompts, warm-up rounds, a steady-state decode
//! window, and a JSON-lines record per rung naming everything that
//! produced its figures.

pub mod ab;
pub mod agreement;
pub mod cite;
pub mod record;
pub mod stats;
pub mod workload;

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Instant, SystemTime};

use serde_json::{json, Value};
use tokio::task::JoinSet;
use tt_serving_proto::v1::generate_request::Input;
use tt_serving_proto::v1::generate_response::Chunk;
use tt_serving_proto::v1::GenerateRequest;

use super::args::{BenchArgs, WorkloadArgs};
use super::client::Daemon;
use super::outcome::{emit, note, Failure};
use record::Identity;
use stats::{RoundFigures, StreamSample};
use workload::Calibration;

/// One rung of the ladder.
#[derive(Debug, Clone, Copy)]
pub struct Rung {
    /// Concurrent requests.
    pub batch: u32,
    /// Prompt length wanted, tokens.
    pub prompt_tokens: u32,
    /// Tokens generated per request.
    pub output_tokens: u32,
}

/// The workload settings that apply to every rung.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Rungs, in order.
    pub rungs: Vec<Rung>,
    /// Counted rounds.
    pub repeats: u32,
    /// Uncounted rounds first.
    pub warmup: u32,
    /// Tokens left out of the steady window.
    pub steady_skip: u32,
}

impl Workload {
    /// The rungs and rounds `args` ask for.
    pub fn from_args(args: &WorkloadArgs) -> Workload {
        let mut rungs = Vec::new();
        for &batch in &args.batch {
            for &prompt_tokens in &args.prompt_tokens {
                rungs.push(Rung {
                    batch,
                    prompt_tokens,
                    output_tokens: args.output_tokens,
                });
            }
        }
        Workload {
            rungs,
            repeats: args.repeats,
            warmup: args.warmup,
            steady_skip: args.steady_skip,
        }
    }
}

/// `ttctl bench MODEL`.
pub(super) async fn run(
    daemon: &mut Daemon,
    args: &BenchArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<(), Failure> {
    let model = args.model.clone().unwrap_or_default();
    let args = &args.workload;
    let (path, default) = records_path(args)?;
    let workload = Workload::from_args(args);
    let started = tt_serving_proto::time::unix_ms(SystemTime::now());
    let run_id = record::run_id(started);
    let mut calibrations = Calibrations::default();
    // Request numbers pick the prompts' nonces; starting from the run's
    // clock keeps two runs from sending the same prompts.
    let mut next_request = (started / 1000) as u32 & 0x7fff;
    if !args.json {
        emit(out, &format!("{}\n", table_header()))?;
    }
    for rung in &workload.rungs {
        let measured = measure_rung(
            daemon,
            &model,
            rung,
            &workload,
            &mut calibrations,
            &mut next_request,
            err,
        )
        .await?;
        let mut rec = measured.record(&run_id, &model, rung, &workload);
        if let Some(o) = rec.as_object_mut() {
            o.insert("kind".into(), json!("bench"));
        }
        record::append(&path, std::slice::from_ref(&rec), default).map_err(Failure::Failed)?;
        if args.json {
            emit(out, &format!("{rec}\n"))?;
        } else {
            emit(out, &format!("{}\n", table_row(&rec)))?;
        }
    }
    note(
        err,
        &format!("records appended to {} (run {run_id})\n", path.display()),
    );
    Ok(())
}

/// Where records go, and whether that is the default path (whose
/// directory may be created).
fn records_path(args: &WorkloadArgs) -> Result<(std::path::PathBuf, bool), Failure> {
    record::path(args.out.as_deref()).map_err(Failure::Failed)
}

/// Prompt lengths already calibrated in this run.
#[derive(Default)]
pub struct Calibrations(Vec<Calibration>);

impl Calibrations {
    async fn get(
        &mut self,
        daemon: &mut Daemon,
        model: &str,
        target: u32,
    ) -> Result<Calibration, Failure> {
        if let Some(c) = self.0.iter().find(|c| c.target == target) {
            return Ok(c.clone());
        }
        let c = workload::calibrate(target, |prompt| {
            let mut d = daemon.clone();
            let model = model.to_string();
            async move {
                let s = one_stream(&mut d, request(&model, prompt, 1), Instant::now()).await;
                match s.error {
                    Some(e) => Err(Failure::Failed(format!(
                        "calibrating a {target}-token prompt: {e}"
                    ))),
                    None => Ok(s.prompt_tokens),
                }
            }
        })
        .await?;
        self.0.push(c.clone());
        Ok(c)
    }
}

/// What one rung measured, and whether it can be trusted.
pub struct RungResult {
    /// The prompt calibration.
    pub calibration: Calibration,
    /// Each counted round.
    pub rounds: Vec<RoundFigures>,
    /// Prompt tokens the server counted, lowest and highest.
    pub prompt_tokens_seen: (u32, u32),
    /// Prompt tokens its prefix cache supplied, all counted requests.
    pub cached_prompt_tokens: u64,
    /// The model's slots before the rung.
    pub identity: Identity,
    /// Banners in the workers' output (`<FLAG> engaged`) before the rung.
    pub banners: BTreeSet<String>,
    /// Why the record must not be trusted (empty: valid).
    pub invalid: Vec<String>,
    /// Errors of failed requests (first few).
    pub errors: Vec<String>,
}

fn request(model: &str, prompt: String, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        model: model.to_string(),
        input: Some(Input::Prompt(prompt)),
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

/// Sends one request and times its tokens against `origin`.
async fn one_stream(daemon: &mut Daemon, req: GenerateRequest, origin: Instant) -> StreamSample {
    let mut s = StreamSample {
        sent: origin.elapsed().as_secs_f64(),
        ..Default::default()
    };
    let mut stream = match daemon.generate(req).await {
        Ok(stream) => stream,
        Err(e) => {
            s.error = Some(e.message().to_string());
            s.done = origin.elapsed().as_secs_f64();
            return s;
        }
    };
    loop {
        match stream.next().await {
            Ok(Some(r)) => match r.chunk {
                Some(Chunk::Delta(d)) => {
                    let at = origin.elapsed().as_secs_f64();
                    // Engines that send no ids: a chunk of text is a token.
                    let n = if d.token_ids.is_empty() {
                        usize::from(!d.text.is_empty())
                    } else {
                        d.token_ids.len()
                    };
                    s.tokens.extend(std::iter::repeat_n(at, n));
                }
                Some(Chunk::Final(f)) => {
                    s.done = origin.elapsed().as_secs_f64();
                    s.prompt_tokens = f.usage.map_or(0, |u| u.prompt_tokens);
                    s.cached_prompt_tokens = f.timings.map_or(0, |t| t.cached_prompt_tokens);
                    if f.finish_reason == tt_serving_proto::v1::FinishReason::Cancelled as i32 {
                        s.error = Some(format!("cancelled by slot {}", f.slot));
                    }
                    return s;
                }
                Some(Chunk::PromptLogprobs(_)) | None => {}
            },
            Ok(None) => {
                s.error = Some("the stream ended without its final chunk".into());
                break;
            }
            Err(e) => {
                s.error = Some(e.message().to_string());
                break;
            }
        }
    }
    s.done = origin.elapsed().as_secs_f64();
    s
}

/// The banners the model's Ready slots' current workers printed.
pub(crate) fn banners(
    status: &tt_serving_proto::v1::StatusResponse,
    model: &str,
) -> BTreeSet<String> {
    status
        .slots
        .iter()
        .filter(|s| s.model == model && s.state == tt_serving_proto::v1::SlotState::Ready as i32)
        .flat_map(|s| s.banners_engaged.iter().cloned())
        .collect()
}

/// Runs one rung: calibration, warm-up, counted rounds, and the checks
/// that decide whether its record is valid.
pub async fn measure_rung(
    daemon: &mut Daemon,
    model: &str,
    rung: &Rung,
    workload: &Workload,
    calibrations: &mut Calibrations,
    next_request: &mut u32,
    err: &mut (dyn Write + Send),
) -> Result<RungResult, Failure> {
    let before = daemon.status().await?;
    let identity = Identity::of(&before, model);
    if identity.slots.is_empty() {
        return Err(Failure::Failed(format!(
            "model {model} has no Ready slot to measure (see 'ttctl status')"
        )));
    }
    let identity = identity.with_variants(&daemon.list_cache().await?);
    let banners_before = banners(&before, model);
    let calibration = calibrations.get(daemon, model, rung.prompt_tokens).await?;
    let mut rounds = Vec::new();
    let mut seen = (u32::MAX, 0);
    let mut cached = 0u64;
    let mut errors = Vec::new();
    let total = workload.warmup + workload.repeats;
    for round in 0..total {
        let counted = round >= workload.warmup;
        let origin = Instant::now();
        let mut tasks = JoinSet::new();
        for _ in 0..rung.batch {
            let mut d = daemon.clone();
            let prompt = workload::prompt(*next_request, calibration.words);
            *next_request = next_request.wrapping_add(1) & 0x7fff;
            let req = request(model, prompt, rung.output_tokens);
            tasks.spawn(async move { one_stream(&mut d, req, origin).await });
        }
        let mut streams = Vec::new();
        while let Some(s) = tasks.join_next().await {
            streams.push(s.map_err(|e| Failure::Failed(format!("a request task failed: {e}")))?);
        }
        let figures = stats::round(&streams, workload.steady_skip as usize);
        note(
            err,
            &format!(
                "b={} p={}: {} {}/{}: {} tokens in {:.2} s{}\n",
                rung.batch,
                rung.prompt_tokens,
                if counted { "round" } else { "warm-up" },
                if counted {
                    round - workload.warmup + 1
                } else {
                    round + 1
                },
                if counted {
                    workload.repeats
                } else {
                    workload.warmup
                },
                figures.tokens,
                figures.makespan_s,
                if figures.errors > 0 {
                    format!(", {} failed", figures.errors)
                } else {
                    String::new()
                }
            ),
        );
        if counted {
            for s in &streams {
                if s.error.is_none() {
                    seen = (seen.0.min(s.prompt_tokens), seen.1.max(s.prompt_tokens));
                    cached += u64::from(s.cached_prompt_tokens);
                }
                if let Some(e) = &s.error {
                    if errors.len() < 5 {
                        errors.push(e.clone());
                    }
                }
            }
            rounds.push(figures);
        }
    }
    if seen.0 == u32::MAX {
        seen = (0, 0);
    }
    let mut after = daemon.status().await?;
    if !errors.is_empty() {
        // A request failed: if its worker died, the daemon may not have
        // seen the exit yet. Give it a moment, so the record says so.
        for _ in 0..30 {
            let moved = Identity::of(&after, model).slots != identity.slots;
            if moved {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            after = daemon.status().await?;
        }
    }
    let identity_after = Identity::of(&after, model);
    let banners_after = banners(&after, model);
    let mut invalid = Vec::new();
    for s in &identity.slots {
        match identity_after.slots.iter().find(|a| a.slot == s.slot) {
            Some(a) if a.starts == s.starts && a.worker_pid == s.worker_pid => {}
            Some(a) => invalid.push(format!(
                "slot {} restarted during the run (worker {} -> {})",
                s.slot, s.worker_pid, a.worker_pid
            )),
            None => invalid.push(format!("slot {} left Ready during the run", s.slot)),
        }
    }
    for gained in banners_after.difference(&banners_before) {
        invalid.push(format!("{gained} engaged during the run"));
    }
    for lost in banners_before.difference(&banners_after) {
        invalid.push(format!("{lost} no longer engaged after the run"));
    }
    let tolerance = workload::TOLERANCE * f64::from(rung.prompt_tokens);
    let off = |n: u32| (f64::from(n) - f64::from(rung.prompt_tokens)).abs() > tolerance;
    if !calibration.within_tolerance || (seen.1 > 0 && (off(seen.0) || off(seen.1))) {
        invalid.push(format!(
            "prompts of {}..{} tokens where {} were wanted (more than {:.0}% off)",
            seen.0,
            seen.1,
            rung.prompt_tokens,
            workload::TOLERANCE * 100.0
        ));
    }
    if rounds.iter().any(|r| r.errors > 0) {
        invalid.push("some requests failed".into());
    }
    Ok(RungResult {
        calibration,
        rounds,
        prompt_tokens_seen: seen,
        cached_prompt_tokens: cached,
        identity,
        banners: banners_before,
        invalid,
        errors,
    })
}

/// Median, lowest, highest and every value of per-round figures.
fn spread(values: &[f64]) -> Value {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return Value::Null;
    }
    let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
    let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    json!({"median": round3(stats::quantile(&finite, 0.5)), "min": round3(min), "max": round3(max),
           "rounds": finite.iter().map(|v| round3(*v)).collect::<Vec<_>>()})
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn pcts(values: &[f64]) -> Value {
    let p = stats::percentiles(values);
    if p.p50.is_nan() {
        return Value::Null;
    }
    json!({"p50": round3(p.p50), "p99": round3(p.p99)})
}

impl RungResult {
    /// The record: identity, workload, figures and validity.
    pub fn record(&self, run_id: &str, model: &str, rung: &Rung, workload: &Workload) -> Value {
        let ttft: Vec<f64> = self.rounds.iter().flat_map(|r| r.ttft_ms.clone()).collect();
        let itl: Vec<f64> = self.rounds.iter().flat_map(|r| r.itl_ms.clone()).collect();
        let per_user: Vec<f64> = self
            .rounds
            .iter()
            .map(|r| r.decode_tok_s_per_user.unwrap_or(f64::NAN))
            .collect();
        let aggregate: Vec<f64> = self.rounds.iter().map(|r| r.aggregate_tok_s).collect();
        let makespan: Vec<f64> = self.rounds.iter().map(|r| r.makespan_s).collect();
        let mut invalid = self.invalid.clone();
        if per_user.iter().all(|v| v.is_nan()) {
            invalid.push(format!(
                "no steady-state window: a stream ended before all had {} tokens (raise --output-tokens)",
                workload.steady_skip
            ));
        }
        json!({
            "id": format!("{run_id}-b{}-p{}", rung.batch, rung.prompt_tokens),
            "run": run_id,
            "model": model,
            "unix_ms": tt_serving_proto::time::unix_ms(SystemTime::now()),
            "workload": {"batch": rung.batch, "prompt_tokens": rung.prompt_tokens,
                         "output_tokens": rung.output_tokens, "ignore_eos": true,
                         "repeats": workload.repeats, "warmup": workload.warmup,
                         "steady_skip": workload.steady_skip},
            "calibration": self.calibration,
            "prompt_tokens_seen": [self.prompt_tokens_seen.0, self.prompt_tokens_seen.1],
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "ttft_ms": pcts(&ttft),
            "itl_ms": pcts(&itl),
            "decode_tok_s_per_user": spread(&per_user),
            "aggregate_tok_s": spread(&aggregate),
            "makespan_s": spread(&makespan),
            "errors": self.rounds.iter().map(|r| r.errors).sum::<usize>(),
            "error_samples": self.errors,
            "banners": self.banners,
            "identity": self.identity,
            "valid": invalid.is_empty(),
            "invalid_reasons": invalid,
        })
    }
}

fn table_header() -> String {
    format!(
        "{:<28} {:>5} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>6}  {}",
        "RECORD",
        "BATCH",
        "PROMPT",
        "TTFT p50",
        "TTFT p99",
        "TOK/S/USR",
        "TOK/S",
        "ITL p50",
        "ITL p99",
        "ERRORS",
        "VALID"
    )
}

/// One line of the table for a record.
pub fn table_row(rec: &Value) -> String {
    let num = |path: &str| -> String {
        rec.pointer(path)
            .and_then(Value::as_f64)
            .map_or("-".into(), |v| format!("{v:.1}"))
    };
    format!(
        "{:<28} {:>5} {:>7} {:>8}ms {:>8}ms {:>10} {:>10} {:>7}ms {:>7}ms {:>6}  {}",
        rec["id"].as_str().unwrap_or(""),
        rec["workload"]["batch"],
        rec["workload"]["prompt_tokens"],
        num("/ttft_ms/p50"),
        num("/ttft_ms/p99"),
        num("/decode_tok_s_per_user/median"),
        num("/aggregate_tok_s/median"),
        num("/itl_ms/p50"),
        num("/itl_ms/p99"),
        rec["errors"],
        if rec["valid"].as_bool().unwrap_or(false) {
            "yes".to_string()
        } else {
            format!(
                "NO: {}",
                rec["invalid_reasons"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("; "))
                    .unwrap_or_default()
            )
        }
    )
}
