//! Resetting cards with tt-smi and proving they came back.
//!
//! Two facts from the field shape this module. `tt-smi -r` returns before the
//! boards are ready and exits 0 even when the reset failed, so its exit code
//! proves nothing: after every run we wait for the device node and class dir
//! to reappear (matched by BDF, since the index may change), read sysfs
//! again, require the heartbeat to advance, and run the site's probe command
//! if one is configured. And a card that keeps failing must stop being used:
//! after the configured attempts the caller quarantines it.

use super::discovery::HardwareRoot;
use crate::config::ResetConfig;
use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

/// The phase of a reset attempt, as reported to the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `tt-smi -r` is running.
    RunningTtSmi,
    /// Waiting for device node and class dir.
    WaitingForDevice,
    /// Reading sysfs attributes.
    ReadingSysfs,
    /// Checking that the heartbeat advances.
    CheckingHeartbeat,
    /// Running the site probe.
    RunningProbe,
    /// The attempt failed; another follows.
    Retrying,
    /// Proven back.
    Done,
    /// Every attempt failed.
    Failed,
}

/// One progress report.
#[derive(Debug, Clone)]
pub struct ResetEvent {
    /// The phase now.
    pub phase: Phase,
    /// Attempt number, 1-based.
    pub attempt: u32,
    /// Detail for a person.
    pub message: String,
}

/// A reset that was proven.
#[derive(Debug, Clone)]
pub struct ResetOutcome {
    /// Each card's BDF and its index after the reset.
    pub indices: Vec<(String, u32)>,
    /// Attempts used.
    pub attempts: u32,
    /// Output of the last tt-smi run.
    pub tt_smi_output: String,
}

/// A reset whose every attempt failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("reset of {bdfs} failed after {attempts} attempt(s): {reason}")]
pub struct ResetFailure {
    /// The cards, comma-separated.
    pub bdfs: String,
    /// Why the last attempt failed.
    pub reason: String,
    /// Attempts made.
    pub attempts: u32,
    /// Output of the last tt-smi run.
    pub tt_smi_output: String,
}

/// Runs resets with proof. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Resetter {
    hw: HardwareRoot,
    tt_smi: PathBuf,
    cfg: ResetConfig,
}

/// Keep the tail of tool output; status and logs show it.
const OUTPUT_LIMIT: usize = 4000;

const POLL: Duration = Duration::from_millis(50);

/// How often a long wait (tt-smi, the card coming back, the heartbeat, the
/// probe) repeats its phase with the time spent so far. A card that never
/// comes back otherwise leaves `ttctl card reset` silent for the whole
/// `come_back_timeout_secs` (60 s by default), which reads as a hung tool.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// A wait with a time limit that reports how far along it is, at most
/// every [`PROGRESS_EVERY`].
struct Waiting {
    began: Instant,
    limit: Duration,
    next_report: Instant,
}

impl Waiting {
    fn new(limit: Duration) -> Waiting {
        let began = Instant::now();
        Waiting {
            began,
            limit,
            next_report: began + PROGRESS_EVERY,
        }
    }

    fn deadline(&self) -> Instant {
        self.began + self.limit
    }

    /// `12 s of 60` once a report is due, else None.
    fn due(&mut self) -> Option<String> {
        let now = Instant::now();
        if now < self.next_report {
            return None;
        }
        self.next_report = now + PROGRESS_EVERY;
        Some(self.elapsed())
    }

    fn elapsed(&self) -> String {
        format!(
            "{} s of {}",
            self.began.elapsed().as_secs(),
            self.limit.as_secs()
        )
    }

    /// Run `work`, calling `report` with [`Waiting::elapsed`] whenever a
    /// report is due, until it finishes.
    async fn around<T>(
        &mut self,
        work: impl Future<Output = T>,
        mut report: impl FnMut(String),
    ) -> T {
        tokio::pin!(work);
        loop {
            let wait = self.next_report.saturating_duration_since(Instant::now());
            tokio::select! {
                out = &mut work => return out,
                _ = tokio::time::sleep(wait) => {
                    if let Some(elapsed) = self.due() {
                        report(elapsed);
                    }
                }
            }
        }
    }
}

impl Resetter {
    /// A resetter for this hardware root and policy.
    pub fn new(hw: HardwareRoot, tt_smi: PathBuf, cfg: ResetConfig) -> Self {
        Resetter { hw, tt_smi, cfg }
    }

    /// Reset these cards in one tt-smi call (a TP=2 slot's cards together)
    /// and prove each came back, retrying with backoff. The caller must hold
    /// the cards' locks.
    pub async fn reset_and_prove(
        &self,
        bdfs: &[String],
        on_event: &mut (dyn FnMut(ResetEvent) + Send),
    ) -> Result<ResetOutcome, ResetFailure> {
        let attempts = self.cfg.attempts.max(1);
        let mut last_output = String::new();
        let mut reason = String::new();
        for attempt in 1..=attempts {
            match self
                .attempt(bdfs, attempt, on_event, &mut last_output)
                .await
            {
                Ok(indices) => {
                    let listed: Vec<String> = indices
                        .iter()
                        .map(|(bdf, i)| format!("{bdf} is /dev/tenstorrent/{i}"))
                        .collect();
                    on_event(ResetEvent {
                        phase: Phase::Done,
                        attempt,
                        message: format!("proven back: {}", listed.join(", ")),
                    });
                    return Ok(ResetOutcome {
                        indices,
                        attempts: attempt,
                        tt_smi_output: last_output,
                    });
                }
                Err(why) => reason = why,
            }
            if attempt < attempts {
                let backoff = Duration::from_millis(
                    self.cfg
                        .backoff_ms
                        .saturating_mul(1 << (attempt - 1).min(16)),
                );
                on_event(ResetEvent {
                    phase: Phase::Retrying,
                    attempt,
                    message: format!("{reason}; retrying in {} ms", backoff.as_millis()),
                });
                tokio::time::sleep(backoff).await;
            }
        }
        on_event(ResetEvent {
            phase: Phase::Failed,
            attempt: attempts,
            message: reason.clone(),
        });
        Err(ResetFailure {
            bdfs: bdfs.join(","),
            reason,
            attempts,
            tt_smi_output: last_output,
        })
    }

    async fn attempt(
        &self,
        bdfs: &[String],
        attempt: u32,
        on_event: &mut (dyn FnMut(ResetEvent) + Send),
        last_output: &mut String,
    ) -> Result<Vec<(String, u32)>, String> {
        let mut event = |phase, message: String| {
            on_event(ResetEvent {
                phase,
                attempt,
                message,
            })
        };
        // tt-smi knows cards by their /dev path; a card whose node is gone
        // can still be named by BDF. The same names tell the operator which
        // node is awaited while the card is away.
        let names: Vec<String> = bdfs
            .iter()
            .map(|bdf| match self.hw.index_of(bdf) {
                Some(i) => format!("/dev/tenstorrent/{i}"),
                None => bdf.clone(),
            })
            .collect();
        let targets = names.join(",");
        event(
            Phase::RunningTtSmi,
            format!("running {} -r {targets}", self.tt_smi.display()),
        );
        let mut smi = Waiting::new(Duration::from_secs(self.cfg.tt_smi_timeout_secs));
        let (code, output) = smi
            .around(self.run_tt_smi(&targets), |elapsed| {
                event(
                    Phase::RunningTtSmi,
                    format!("tt-smi -r {targets} still running ({elapsed})"),
                )
            })
            .await?;
        *last_output = output.clone();
        if code != Some(0) {
            return Err(format!(
                "tt-smi -r {targets} exited with {}: {}",
                code.map_or("a signal".to_string(), |c| c.to_string()),
                last_line(&output)
            ));
        }

        // tt-smi's exit code proves nothing; the card must show itself.
        event(
            Phase::WaitingForDevice,
            format!(
                "tt-smi exited 0; waiting up to {} s for the device node and sysfs (tt-smi's exit code is not proof)",
                self.cfg.come_back_timeout_secs
            ),
        );
        // One limit covers coming back and the heartbeat, as configured.
        let mut come_back = Waiting::new(Duration::from_secs(self.cfg.come_back_timeout_secs));
        let mut indices = Vec::new();
        for (bdf, name) in bdfs.iter().zip(&names) {
            let index = self
                .wait_for_device(bdf, name, &mut come_back, &mut event)
                .await?;
            indices.push((bdf.clone(), index));
        }
        event(Phase::ReadingSysfs, "sysfs attributes read again".into());
        event(
            Phase::CheckingHeartbeat,
            format!(
                "checking that the heartbeat advances over {} ms",
                self.cfg.heartbeat_interval_ms
            ),
        );
        for bdf in bdfs {
            self.wait_for_heartbeat(bdf, &mut come_back, &mut event)
                .await?;
        }
        if !self.cfg.probe_command.is_empty() {
            let probe = self.cfg.probe_command.join(" ");
            event(Phase::RunningProbe, format!("running probe {probe}"));
            let mut running = Waiting::new(Duration::from_secs(self.cfg.probe_timeout_secs));
            running
                .around(self.run_probe(bdfs), |elapsed| {
                    event(
                        Phase::RunningProbe,
                        format!("probe {probe} still running ({elapsed})"),
                    )
                })
                .await?;
        }
        Ok(indices)
    }

    async fn run_tt_smi(&self, targets: &str) -> Result<(Option<i32>, String), String> {
        let mut cmd = Command::new(&self.tt_smi);
        cmd.arg("-r").arg(targets);
        run_with_deadline(cmd, Duration::from_secs(self.cfg.tt_smi_timeout_secs))
            .await
            .map_err(|e| format!("tt-smi ({}): {e}", self.tt_smi.display()))
    }

    /// Wait until `bdf` (known before the reset as `name`) has a class dir,
    /// a device node and readable sysfs again, reporting what is still
    /// missing every few seconds.
    async fn wait_for_device(
        &self,
        bdf: &str,
        name: &str,
        waiting: &mut Waiting,
        event: &mut impl FnMut(Phase, String),
    ) -> Result<u32, String> {
        let mut last = "no class dir resolves to it".to_string();
        loop {
            if let Some(card) = self.hw.find(bdf) {
                if !card.dev_node {
                    last = format!(
                        "class dir is back as index {} but the device node is missing",
                        card.index
                    );
                } else {
                    match self.hw.read_attributes(card.index) {
                        Ok(_) => return Ok(card.index),
                        Err(e) => last = format!("sysfs unreadable: {e}"),
                    }
                }
            }
            if Instant::now() >= waiting.deadline() {
                return Err(format!(
                    "card {bdf} did not come back within {}s after tt-smi exited 0 ({last}); tt-smi's exit code is not proof: check `dmesg` and the tt-smi output",
                    self.cfg.come_back_timeout_secs
                ));
            }
            if let Some(elapsed) = waiting.due() {
                let who = if name == bdf {
                    format!("card {bdf}")
                } else {
                    format!("{name} ({bdf})")
                };
                event(
                    Phase::WaitingForDevice,
                    format!("waiting for {who} to come back ({elapsed}): {last}"),
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_for_heartbeat(
        &self,
        bdf: &str,
        waiting: &mut Waiting,
        event: &mut impl FnMut(Phase, String),
    ) -> Result<(), String> {
        let interval = Duration::from_millis(self.cfg.heartbeat_interval_ms);
        let read = || {
            self.hw
                .index_of(bdf)
                .and_then(|i| self.hw.read_attributes(i).ok())
                .map(|(_, _, hb)| hb)
        };
        let mut first = read();
        loop {
            tokio::time::sleep(interval).await;
            let now = read();
            if let (Some(a), Some(b)) = (first, now) {
                if b > a {
                    return Ok(());
                }
            }
            if Instant::now() >= waiting.deadline() {
                return Err(match (first, now) {
                    (Some(a), Some(_)) => format!(
                        "card {bdf} is back but its heartbeat did not advance (stuck at {a} for {} ms): the firmware is not running; reset again or power-cycle the host",
                        self.cfg.heartbeat_interval_ms
                    ),
                    _ => format!("card {bdf}: heartbeat unreadable after the reset"),
                });
            }
            if let Some(elapsed) = waiting.due() {
                let seen = match now {
                    Some(hb) => format!("stuck at {hb}"),
                    None => "unreadable".to_string(),
                };
                event(
                    Phase::CheckingHeartbeat,
                    format!(
                        "waiting for the heartbeat of card {bdf} to advance ({elapsed}): {seen}"
                    ),
                );
            }
            first = now;
        }
    }

    async fn run_probe(&self, bdfs: &[String]) -> Result<(), String> {
        let (program, args) = self
            .cfg
            .probe_command
            .split_first()
            .ok_or_else(|| "empty probe command".to_string())?;
        let mut cmd = Command::new(program);
        cmd.args(args).env("TT_VISIBLE_DEVICES", bdfs.join(","));
        let (code, output) =
            run_with_deadline(cmd, Duration::from_secs(self.cfg.probe_timeout_secs))
                .await
                .map_err(|e| format!("probe {program}: {e}"))?;
        match code {
            Some(0) => Ok(()),
            other => Err(format!(
                "probe {program} exited with {}: {}",
                other.map_or("a signal".to_string(), |c| c.to_string()),
                last_line(&output)
            )),
        }
    }
}

/// Run a command, collecting stdout and stderr, killing it at the deadline.
async fn run_with_deadline(
    mut cmd: Command,
    deadline: Duration,
) -> Result<(Option<i32>, String), String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start it: {e}; check the path in the config"))?;
    match tokio::time::timeout(deadline, child.wait_with_output()).await {
        Err(_) => Err(format!(
            "still running after {}s; killed it",
            deadline.as_secs()
        )),
        Ok(Err(e)) => Err(format!("waiting for it failed: {e}")),
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            Ok((out.status.code(), tail(&text, OUTPUT_LIMIT)))
        }
    }
}

fn tail(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

fn last_line(output: &str) -> String {
    output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no output)")
        .trim()
        .to_string()
}
