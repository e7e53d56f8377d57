//! Phase 4c of a start, `readiness.accuracy`: the configured task's
//! questions, greedily through the new worker before anyone is routed to
//! it, judged by the task's gate (`[models.X.accuracy.TASK]`) with the same
//! rule `ttctl eval` uses. A slot whose numerics broke (a flag, a kernel, a
//! cache trick) fails its start with the score in the reason and is never
//! served.

use std::time::Instant;

use tonic::transport::Channel;
use tt_serving_proto::accuracy::{self, Gate, Question};
use tt_serving_proto::v1 as pb;
use tt_serving_proto::v1::engine_client::EngineClient;

use crate::config::ModelConfig;

/// What a check found.
pub(super) struct Checked {
    /// The score in words, for the slot's reason and the log.
    pub(super) summary: String,
    /// Whether it passed the gate.
    pub(super) pass: bool,
}

/// The `readiness.accuracy` task, read before the worker starts: a file
/// that cannot be read fails the start before the cards are touched.
pub(super) struct Task {
    /// Its name under `[models.X.accuracy]`.
    pub(super) name: String,
    /// Its questions.
    pub(super) questions: Vec<Question>,
    /// Its gate.
    pub(super) gate: Gate,
}

/// Reads the task `readiness.accuracy` names, if the model sets one
/// (validation guarantees its gate and file exist): read at every start,
/// like the env file, so an edited task reaches the next worker.
pub(super) fn configured(m: &ModelConfig, model: &str) -> Result<Option<Task>, String> {
    let Some(name) = m.readiness.accuracy.as_deref() else {
        return Ok(None);
    };
    let Some((file, gate)) = m
        .accuracy
        .get(name)
        .and_then(|g| Some((g.file.as_deref()?, g.rule()?)))
    else {
        return Ok(None);
    };
    let questions = accuracy::read_task(file)
        .map_err(|e| format!("models.{model}.accuracy.{name}.file (readiness.accuracy): {e}"))?;
    Ok(Some(Task {
        name: name.to_string(),
        questions,
        gate,
    }))
}

/// Runs the task against `engine` until `deadline`; an error is a request
/// that failed, not a low score.
pub(super) async fn check(
    engine: &mut EngineClient<Channel>,
    model: &str,
    task: &Task,
    progress: &(dyn Fn(usize, usize) + Sync),
    deadline: Instant,
) -> Result<Checked, String> {
    let (questions, gate) = (&task.questions, task.gate);
    let n = questions.len();
    let mut right = 0u64;
    for (i, q) in questions.iter().enumerate() {
        progress(i, n);
        let request = pb::EngineGenerateRequest {
            request: Some(pb::GenerateRequest {
                input: Some(pb::generate_request::Input::Prompt(q.prompt.clone())),
                max_tokens: q.max_tokens(),
                stop: q.stop(),
                ..Default::default()
            }),
            request_id: format!("readiness-accuracy-{}", i + 1),
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let (text, _) = tokio::time::timeout(remaining, super::generate::complete(engine, request))
            .await
            .map_err(|_| {
                format!(
                    "did not finish within readiness.deadline_secs ({} of {n} questions asked)",
                    i + 1
                )
            })?
            .map_err(|e| format!("question {} failed: {e}", i + 1))?;
        if q.is_answered_by(&text) {
            right += 1;
        }
    }
    let score = right as f64 / n as f64;
    let pass = gate.passes(score, n as u64);
    Ok(Checked {
        summary: format!(
            "accuracy check {}: exact_match {score:.3} ({right}/{n}) {} {} (models.{model}.accuracy.{})",
            task.name,
            if pass { "passes" } else { "fails" },
            gate.describe(),
            task.name
        ),
        pass,
    })
}
