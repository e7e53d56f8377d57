//! The identity step: before a start, the worker's command runs once with
//! `TT_WORKER_IDENTIFY=1` (tt-worker-contract `identify`) and answers which
//! engine it would run (its build; the engine Python's vLLM, plugin, ttnn
//! and tt-umd versions). The answer is part of the cache variant's key: a
//! tt-metal upgrade that changes the serialisation or a kernel's expected
//! layout must never load the old files warm (nothing in ttnn's own cache
//! paths names the version: docs/HARDWARE.md).
//!
//! The step runs as the worker would (the slot's containment, swept after)
//! but with none of the contract's variables: no socket, no cards, no cache
//! directory. A worker that does not know the step (a custom program)
//! fails its usage check or gives no line; the key then holds the worker
//! program's file identity alone, as before the step existed, and the
//! slot's log says so.

use super::logs::{LogRing, Stream};
use super::{Worker, WorkerSpec};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tt_worker_contract::{identify, names};

/// How long the step may take: a Python engine's interpreter lists its
/// packages in about a second; the worker gives it 60 s itself.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// What the step found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The worker's answer.
    Answered(BTreeMap<String, String>),
    /// No answer, and why.
    Unanswered(String),
}

/// Run the identity step of `command` with the model's own environment
/// (`env`: its env table and flags, which can change what the engine
/// imports).
pub async fn probe(slot: &str, command: &[String], env: &BTreeMap<String, String>) -> Identity {
    let mut env = env.clone();
    for reserved in names::RESERVED {
        env.remove(*reserved);
    }
    env.insert(names::IDENTIFY.into(), "1".into());
    let spec = WorkerSpec {
        slot: slot.to_string(),
        command: command.to_vec(),
        env,
        // Never bound: the step has no socket in its environment.
        socket: PathBuf::new(),
        memory_max: None,
        // It starts no cluster: nothing is left in shared memory.
        leftovers: None,
    };
    let logs = Arc::new(LogRing::new(256));
    let mut worker = match Worker::spawn(&spec, logs.clone()) {
        Ok(w) => w,
        Err(e) => return Identity::Unanswered(e.to_string()),
    };
    let exit = match tokio::time::timeout(TIMEOUT, worker.wait()).await {
        Ok(exit) => exit,
        Err(_) => {
            worker.terminate(Duration::from_secs(5)).await;
            return Identity::Unanswered(format!(
                "the worker gave no identity within {}s",
                TIMEOUT.as_secs()
            ));
        }
    };
    let lines = logs.tail(256);
    let answer = lines
        .iter()
        .filter(|l| l.stream == Stream::Stdout)
        .find_map(|l| identify::parse(&l.text));
    match answer {
        Some(identity) if exit.cause == super::ExitCause::Code(0) => Identity::Answered(identity),
        _ => Identity::Unanswered(format!(
            "the worker {} without an identity line; last output: {}",
            exit.cause.describe(),
            lines.last().map(|l| l.text.as_str()).unwrap_or("(none)")
        )),
    }
}
