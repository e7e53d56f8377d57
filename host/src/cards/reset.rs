//! Resetting cards with tt-smi and proving they came back.
//!
//! Three facts shape this module (sources in `docs/HARDWARE.md`).
//!
//! - tt-smi 6.8 widens what it is given: an absent card's PCI address is
//!   dropped, and when no target is left it resets *every card on the host*
//!   (tt-umd `warm_reset.cpp`); an absent `/dev/tenstorrent/N` is skipped,
//!   and a bare integer is a position in PCI order, not a device index. So a
//!   reset names its cards one way only, full lower-case PCI addresses
//!   ([`ResetTargets`]), every one checked present right before the call,
//!   and is not attempted at all when one is missing.
//! - `tt-smi -r` exits 0 when the reset failed (it discards the result and
//!   only logs), and returns before the boards are ready. So its failure
//!   lines fail the attempt, and after every run the card must show itself:
//!   device node and class dir (matched by BDF, since the index may change),
//!   sysfs readable, the PCIe link back at its speed and width, and, where
//!   the driver has them ([`Driver`]), the heartbeat advancing and the
//!   thermal trip count unchanged; then the site's probe command, if any.
//! - A card that keeps failing must stop being used: after the configured
//!   attempts the caller quarantines it.
//! - `tt-smi -r` itself can hang: on a Galaxy it appears stuck (tt-umd issue
//!   2439), a reset hung 15 minutes before it returned non-zero (tt-smi
//!   issue 85), and one left the host unresponsive until a hard reboot
//!   (tt-smi issue 185). So tt-smi runs in its own process group with a
//!   deadline; at the deadline the whole group is killed, the attempt is
//!   not retried (a second call may hang the host for good), and the caller
//!   quarantines the cards as [`FailureKind::Hung`].

use super::discovery::HardwareRoot;
use super::driver::{self, Driver};
use crate::config::ResetConfig;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::process::Command;
use tt_worker_contract::subprocess::{self, Captured, Keep, RunError as SubprocessError};

/// The phase of a reset attempt, as reported to the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `tt-smi -r` is running.
    RunningTtSmi,
    /// Waiting for device node and class dir.
    WaitingForDevice,
    /// Reading sysfs attributes.
    ReadingSysfs,
    /// Checking the PCIe link, the heartbeat and the thermal trip count.
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

/// How a reset that did not prove its cards back ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Every attempt ran and failed: tt-smi's exit code or output, or the
    /// proof.
    Failed,
    /// tt-smi did not return within `tt_smi_timeout_secs`: its process
    /// group was killed and no further attempt was made.
    Hung,
    /// Not tried: an automatic reset of a card whose last reset hung (only
    /// an operator's `ttctl card reset` may try it again).
    Refused,
}

/// A reset whose every attempt failed, or that hung, or that was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.describe())]
pub struct ResetFailure {
    /// The cards, comma-separated.
    pub bdfs: String,
    /// Why the last attempt failed.
    pub reason: String,
    /// Attempts made.
    pub attempts: u32,
    /// Output of the last tt-smi run.
    pub tt_smi_output: String,
    /// How it ended.
    pub kind: FailureKind,
    /// The cards the last attempt's proof found not back; empty when the
    /// failure is not one card's (tt-smi failed or hung, the probe failed):
    /// then every card of the reset is suspect.
    pub not_back: Vec<String>,
}

impl ResetFailure {
    /// Whether `bdf` is one this failure leaves in doubt.
    pub fn blames(&self, bdf: &str) -> bool {
        self.not_back.is_empty() || self.not_back.iter().any(|b| b == bdf)
    }

    fn describe(&self) -> String {
        match self.kind {
            FailureKind::Failed => format!(
                "reset of {} failed after {} attempt(s): {}",
                self.bdfs, self.attempts, self.reason
            ),
            FailureKind::Hung => format!(
                "reset of {} hung at attempt {} and was not retried: {}",
                self.bdfs, self.attempts, self.reason
            ),
            FailureKind::Refused => {
                format!("automatic reset of {} refused: {}", self.bdfs, self.reason)
            }
        }
    }
}

/// Why a reset did not happen or did not prove its cards back.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResetError {
    /// A target is not on the host: tt-smi was not called, since it would
    /// have widened the call (see [`ResetTargets`]). The card is not
    /// quarantined: nothing was tried on it.
    #[error("{0}")]
    NotAttempted(#[from] MissingCard),
    /// Every attempt ran and failed.
    #[error(transparent)]
    Failed(#[from] ResetFailure),
}

/// A reset target that is not present, so the reset was not attempted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "card {bdf} is missing ({why}); the reset of {cards} was not attempted, because tt-smi drops an absent card's PCI address and resets every card on the host when none is left. Bring the card back (`lspci -d 1e52:`, `dmesg`), then `ttctl card reset {bdf}`"
)]
pub struct MissingCard {
    /// The card that is not there.
    pub bdf: String,
    /// What is missing of it.
    pub why: String,
    /// Every card of the reset, comma-separated.
    pub cards: String,
}

/// The cards of one tt-smi call, in the one form tt-smi 6.8 cannot widen:
/// full lower-case PCI addresses (tt-umd matches them exactly against
/// sysfs, so `0000:0A:00.0` would match nothing and reset everything),
/// none absent, at least one. The only way to build one is [`Self::check`],
/// so no code path can hand tt-smi an empty or partial list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetTargets(Vec<String>);

impl ResetTargets {
    /// The targets for `bdfs`, each checked present now: a class dir that
    /// resolves to its PCI dir, and its device node. An empty list, a
    /// malformed address or an absent card is refused.
    pub fn check(hw: &HardwareRoot, bdfs: &[String]) -> Result<ResetTargets, MissingCard> {
        let cards = bdfs.join(",");
        let missing = |bdf: &str, why: String| MissingCard {
            bdf: bdf.to_string(),
            why,
            cards: cards.clone(),
        };
        if bdfs.is_empty() {
            // tt-smi -r with no target resets every card on the host.
            return Err(missing(
                "(none)",
                "a reset was asked for with no card, which tt-smi takes as every card".into(),
            ));
        }
        let mut targets: Vec<String> = Vec::with_capacity(bdfs.len());
        for bdf in bdfs {
            if crate::config::parse_bdf(bdf).as_deref() != Some(bdf.as_str()) || bdf.len() != 12 {
                return Err(missing(
                    bdf,
                    "not a full lower-case PCI address such as 0000:01:00.0".into(),
                ));
            }
            match hw.find(bdf) {
                None => {
                    return Err(missing(
                        bdf,
                        format!(
                            "no class dir under {} resolves to it",
                            hw.sys_root.join("class/tenstorrent").display()
                        ),
                    ))
                }
                Some(card) if !card.dev_node => {
                    return Err(missing(
                        bdf,
                        format!("{} does not exist", hw.dev_node(card.index).display()),
                    ))
                }
                Some(_) => {}
            }
            if !targets.contains(bdf) {
                targets.push(bdf.clone());
            }
        }
        Ok(ResetTargets(targets))
    }

    /// The value after `-r`: the addresses, comma-separated.
    pub fn argument(&self) -> String {
        self.0.join(",")
    }

    /// The addresses.
    pub fn bdfs(&self) -> &[String] {
        &self.0
    }

    /// tt-smi's arguments for resetting these cards, and nothing else.
    /// `--no_reinit`: after a reset tt-smi re-discovers *every* card on the
    /// host (tt-smi `reset.py` pci_board_reset), so an unrelated card's
    /// failure there would fail this reset; the daemon's own proof covers
    /// the targets.
    pub fn tt_smi_args(&self) -> [String; 3] {
        ["--no_reinit".into(), "-r".into(), self.argument()]
    }
}

/// Lines tt-smi and tt-umd print when a reset did not go through although
/// tt-smi exits 0 (tt-smi `reset.py` discards the reset's result; tt-umd
/// `warm_reset.cpp` and `pci_device.cpp` only log). Matched case-blind on
/// tt-smi's combined output. `Reset failed.` is also what tt-umd logs when
/// any card on the host did not reappear within 10 s, after which it skips
/// the POST_RESET ioctl of the targets: the attempt failed either way.
const FAILURE_LINES: &[&str] = &[
    "reset failed",
    "reset ioctl to device",
    "config space reset not completed",
    "timeout waiting for device",
    "error when re-initializing",
];

/// tt-smi's line for a reset of every card (`Resetting all PCI devices:`),
/// and tt-umd's when its target list came out empty (`No PCI devices
/// found.`, after which it resets every card): never expected from a call
/// that named its cards, so seen, it fails the attempt loudly.
const EVERY_CARD_LINES: &[&str] = &["resetting all pci devices", "no pci devices found"];

/// The first line of tt-smi's output that says the reset failed or went
/// wider than its targets, if any.
pub fn failure_line(output: &str) -> Option<String> {
    output
        .lines()
        .map(strip_ansi)
        .find(|line| {
            let lower = line.to_ascii_lowercase();
            let failed = FAILURE_LINES.iter().any(|p| lower.contains(p))
                && (!lower.contains("reset ioctl to device") || lower.contains("failed"));
            failed || EVERY_CARD_LINES.iter().any(|p| lower.contains(p))
        })
        .map(|line| line.trim().to_string())
}

/// `line` without terminal colour codes (tt-smi colours its messages).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Why one attempt failed.
enum AttemptError {
    /// A target is gone: stop, do not retry.
    Missing(MissingCard),
    /// tt-smi did not return and was killed: stop, do not retry.
    Hung(String),
    /// Failed; another attempt may follow. `not_back`: the cards whose
    /// proof failed (empty: not one card's failure).
    Failed {
        reason: String,
        not_back: Vec<String>,
    },
}

impl From<String> for AttemptError {
    fn from(reason: String) -> AttemptError {
        AttemptError::Failed {
            reason,
            not_back: Vec::new(),
        }
    }
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
    /// the cards' locks. A card that is not present stops the reset before
    /// tt-smi runs ([`ResetError::NotAttempted`]).
    pub async fn reset_and_prove(
        &self,
        bdfs: &[String],
        on_event: &mut (dyn FnMut(ResetEvent) + Send),
    ) -> Result<ResetOutcome, ResetError> {
        let attempts = self.cfg.attempts.max(1);
        let mut last_output = String::new();
        let mut reason = String::new();
        let mut not_back = Vec::new();
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
                Err(AttemptError::Missing(missing)) => {
                    on_event(ResetEvent {
                        phase: Phase::Failed,
                        attempt,
                        message: missing.to_string(),
                    });
                    return Err(ResetError::NotAttempted(missing));
                }
                Err(AttemptError::Hung(why)) => {
                    on_event(ResetEvent {
                        phase: Phase::Failed,
                        attempt,
                        message: why.clone(),
                    });
                    return Err(ResetError::Failed(ResetFailure {
                        bdfs: bdfs.join(","),
                        reason: why,
                        attempts: attempt,
                        tt_smi_output: last_output,
                        kind: FailureKind::Hung,
                        not_back: Vec::new(),
                    }));
                }
                Err(AttemptError::Failed {
                    reason: why,
                    not_back: cards,
                }) => (reason, not_back) = (why, cards),
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
        Err(ResetError::Failed(ResetFailure {
            bdfs: bdfs.join(","),
            reason,
            attempts,
            tt_smi_output: last_output,
            kind: FailureKind::Failed,
            not_back,
        }))
    }

    async fn attempt(
        &self,
        bdfs: &[String],
        attempt: u32,
        on_event: &mut (dyn FnMut(ResetEvent) + Send),
        last_output: &mut String,
    ) -> Result<Vec<(String, u32)>, AttemptError> {
        let mut event = |phase, message: String| {
            on_event(ResetEvent {
                phase,
                attempt,
                message,
            })
        };
        // Presence is checked right before the call, every attempt: a card
        // that left since the last one must not turn this call into a reset
        // of the whole host.
        let targets = ResetTargets::check(&self.hw, bdfs).map_err(AttemptError::Missing)?;
        let driver = driver::driver_for_proof(&self.hw);
        // What the proof compares against afterwards.
        let before: Vec<Baseline> = bdfs
            .iter()
            .map(|bdf| Baseline::read(&self.hw, &driver, bdf))
            .collect();
        // The node each card had, to tell the operator what is awaited.
        let names: Vec<String> = bdfs
            .iter()
            .map(|bdf| match self.hw.index_of(bdf) {
                Some(i) => format!("/dev/tenstorrent/{i}"),
                None => bdf.clone(),
            })
            .collect();
        let command = format!(
            "{} {}",
            self.tt_smi.display(),
            targets.tt_smi_args().join(" ")
        );
        event(Phase::RunningTtSmi, format!("running {command}"));
        let mut smi = Waiting::new(Duration::from_secs(self.cfg.tt_smi_timeout_secs));
        let run = smi
            .around(self.run_tt_smi(&targets), |elapsed| {
                event(
                    Phase::RunningTtSmi,
                    format!("{command} still running ({elapsed})"),
                )
            })
            .await;
        let (code, output) = match run {
            Ok(done) => done,
            Err(RunError::Failed(e)) => {
                return Err(format!("tt-smi ({}): {e}", self.tt_smi.display()).into())
            }
            Err(RunError::TimedOut { output, left, .. }) => {
                *last_output = output;
                return Err(AttemptError::Hung(hung_reason(
                    self.cfg.tt_smi_timeout_secs,
                    &targets,
                    left.as_deref(),
                )));
            }
        };
        *last_output = output.clone();
        if code != Some(0) {
            return Err(format!(
                "tt-smi -r {} exited with {}: {}",
                targets.argument(),
                code.map_or("a signal".to_string(), |c| c.to_string()),
                last_line(&output)
            )
            .into());
        }
        if let Some(line) = failure_line(&output) {
            return Err(format!(
                "tt-smi -r {} exited 0 but printed {line:?}: the reset did not go through",
                targets.argument()
            )
            .into());
        }

        // tt-smi's exit code proves nothing; the card must show itself.
        event(
            Phase::WaitingForDevice,
            format!(
                "tt-smi exited 0; waiting up to {} s for the device node and sysfs (tt-smi's exit code is not proof)",
                self.cfg.come_back_timeout_secs
            ),
        );
        // One limit covers coming back and the checks after it, as configured.
        // Every card is proven, also after one fails, so that a failure
        // names the cards not back and only those.
        let mut come_back = Waiting::new(Duration::from_secs(self.cfg.come_back_timeout_secs));
        let mut indices = Vec::new();
        let mut not_back: Vec<(String, String)> = Vec::new();
        for (bdf, name) in bdfs.iter().zip(&names) {
            match self
                .wait_for_device(bdf, name, &mut come_back, &mut event)
                .await
            {
                Ok(index) => indices.push((bdf.clone(), index)),
                Err(why) => not_back.push((bdf.clone(), why)),
            }
        }
        event(Phase::ReadingSysfs, "sysfs attributes read again".into());
        event(
            Phase::CheckingHeartbeat,
            format!("checking {}", driver.proofs()),
        );
        for (bdf, baseline) in bdfs.iter().zip(&before) {
            if not_back.iter().any(|(b, _)| b == bdf) {
                continue;
            }
            let proof = async {
                self.wait_for_link(bdf, baseline, &mut come_back, &mut event)
                    .await?;
                if driver.has_heartbeat() {
                    self.wait_for_heartbeat(bdf, &mut come_back, &mut event)
                        .await?;
                }
                check_therm_trips(&self.hw, bdf, baseline)
            };
            if let Err(why) = proof.await {
                not_back.push((bdf.clone(), why));
            }
        }
        if !not_back.is_empty() {
            return Err(AttemptError::Failed {
                reason: not_back
                    .iter()
                    .map(|(_, why)| why.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
                not_back: not_back.into_iter().map(|(bdf, _)| bdf).collect(),
            });
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

    async fn run_tt_smi(&self, targets: &ResetTargets) -> Result<(Option<i32>, String), RunError> {
        let mut cmd = Command::new(&self.tt_smi);
        cmd.args(targets.tt_smi_args());
        run_with_deadline(cmd, Duration::from_secs(self.cfg.tt_smi_timeout_secs)).await
    }

    /// Wait until the card's PCIe link is up at the speed and width it
    /// should have: its maximum (`max_link_*`), or, when it already ran
    /// below that before the reset (a slot that caps it), no less than it
    /// ran then. A link that comes back narrower or slower is a card that
    /// came back wrong.
    async fn wait_for_link(
        &self,
        bdf: &str,
        baseline: &Baseline,
        waiting: &mut Waiting,
        event: &mut impl FnMut(Phase, String),
    ) -> Result<(), String> {
        loop {
            let Some(now) = Link::read(&self.hw, bdf) else {
                // No link attributes (not a PCIe function, or a sysfs
                // without them): nothing to prove with.
                return Ok(());
            };
            let want = baseline.expected_link(&now);
            if now.satisfies(&want) {
                return Ok(());
            }
            if Instant::now() >= waiting.deadline() {
                return Err(format!(
                    "card {bdf} came back with its PCIe link at {}, below {} (downtrained): reseat the card or check its slot and riser, then reset it again",
                    now.describe(),
                    want.describe()
                ));
            }
            if let Some(elapsed) = waiting.due() {
                event(
                    Phase::CheckingHeartbeat,
                    format!(
                        "waiting for the PCIe link of card {bdf} to reach {} ({elapsed}): {}",
                        want.describe(),
                        now.describe()
                    ),
                );
            }
            tokio::time::sleep(POLL).await;
        }
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
                .and_then(|i| self.hw.read_counter(i, "tt_heartbeat"))
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
        cmd.args(args)
            .env(tt_worker_contract::names::VISIBLE_DEVICES, bdfs.join(","));
        let (code, output) =
            run_with_deadline(cmd, Duration::from_secs(self.cfg.probe_timeout_secs))
                .await
                .map_err(|e| format!("probe {program}: {}", e.describe()))?;
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

/// What a card showed before its reset, to judge what it shows after.
#[derive(Debug, Clone, Default)]
struct Baseline {
    /// Its PCIe link, when the attributes exist and the link was up.
    link: Option<Link>,
    /// `tt_therm_trip_count`, where the driver has it and it was readable.
    therm_trips: Option<u64>,
}

impl Baseline {
    fn read(hw: &HardwareRoot, driver: &Driver, bdf: &str) -> Baseline {
        let therm_trips = if driver.has_therm_trip_count() {
            hw.index_of(bdf)
                .and_then(|i| hw.read_counter(i, "tt_therm_trip_count"))
        } else {
            None
        };
        Baseline {
            link: Link::read(hw, bdf).filter(|l| l.is_up()),
            therm_trips,
        }
    }

    /// The link a card must have after the reset: its maximum, unless it
    /// already ran below that before (a Gen4 slot caps a Gen5 card), then
    /// what it had.
    fn expected_link(&self, now: &Link) -> LinkState {
        match &self.link {
            Some(before) if !before.current.at_least(&before.max) => before.current.clone(),
            _ => now.max.clone(),
        }
    }
}

/// A PCIe link's speed and width, as sysfs prints them.
#[derive(Debug, Clone, PartialEq)]
struct LinkState {
    /// GT/s; None for `Unknown` (the link is down, or reads as all ones).
    speed: Option<f64>,
    /// Lanes; None when unreadable.
    width: Option<u32>,
}

impl LinkState {
    fn at_least(&self, want: &LinkState) -> bool {
        match (self.speed, self.width, want.speed, want.width) {
            (Some(s), Some(w), Some(ws), Some(ww)) => s + 1e-9 >= ws && w >= ww,
            _ => false,
        }
    }

    fn describe(&self) -> String {
        let speed = self
            .speed
            .map_or("unknown speed".to_string(), |s| format!("{s:.1} GT/s"));
        let width = self
            .width
            .map_or("unknown width".to_string(), |w| format!("x{w}"));
        format!("{speed} {width}")
    }
}

/// The link attributes of a PCI function (Linux `drivers/pci/pci-sysfs.c`:
/// `current_link_speed` like `32.0 GT/s PCIe` or `Unknown`,
/// `current_link_width` a lane count; `max_link_*` the same for what the
/// device supports).
#[derive(Debug, Clone, PartialEq)]
struct Link {
    current: LinkState,
    max: LinkState,
}

impl Link {
    /// None when the PCI dir has no link attributes.
    fn read(hw: &HardwareRoot, bdf: &str) -> Option<Link> {
        let dir = hw.sys_root.join("bus/pci/devices").join(bdf);
        let text = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let speed = |t: Option<String>| {
            t.and_then(|t| {
                t.split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<f64>().ok())
            })
        };
        let width = |t: Option<String>| t.and_then(|t| t.trim().parse::<u32>().ok());
        let current_speed = text("current_link_speed")?;
        Some(Link {
            current: LinkState {
                speed: speed(Some(current_speed)),
                width: width(text("current_link_width")),
            },
            max: LinkState {
                speed: speed(text("max_link_speed")),
                width: width(text("max_link_width")),
            },
        })
    }

    /// Up, and no wider than the device can be (a link in reset reads as
    /// all ones: `Unknown`, 63 lanes).
    fn is_up(&self) -> bool {
        self.current.speed.is_some()
            && match (self.current.width, self.max.width) {
                (Some(w), Some(max)) => w > 0 && w <= max,
                (Some(w), None) => w > 0,
                _ => false,
            }
    }

    fn satisfies(&self, want: &LinkState) -> bool {
        self.is_up() && self.current.at_least(want)
    }

    fn describe(&self) -> String {
        self.current.describe()
    }
}

/// A thermal trip during the reset: the card came back wrong.
fn check_therm_trips(hw: &HardwareRoot, bdf: &str, before: &Baseline) -> Result<(), String> {
    let Some(then) = before.therm_trips else {
        return Ok(());
    };
    let now = hw
        .index_of(bdf)
        .and_then(|i| hw.read_counter(i, "tt_therm_trip_count"));
    match now {
        Some(now) if now > then => Err(format!(
            "card {bdf} tripped its thermal limit during the reset (tt_therm_trip_count {then} -> {now}): check its cooling and airflow before using it"
        )),
        _ => Ok(()),
    }
}

/// Why a command run with a deadline gave no exit status.
#[derive(Debug)]
enum RunError {
    /// It could not be started, or waiting for it failed.
    Failed(String),
    /// Still running at the deadline: its whole process group was killed.
    TimedOut {
        /// The deadline.
        after: Duration,
        /// The tail of what it printed before.
        output: String,
        /// What of its process group outlived SIGKILL, if anything.
        left: Option<String>,
    },
}

impl RunError {
    fn describe(&self) -> String {
        match self {
            RunError::Failed(e) => e.clone(),
            RunError::TimedOut { after, left, .. } => {
                let mut text = format!(
                    "still running after {}s; killed it with its process group",
                    after.as_secs()
                );
                if let Some(left) = left {
                    text.push_str("; ");
                    text.push_str(left);
                }
                text
            }
        }
    }
}

/// The attempt's reason when tt-smi did not return by its deadline.
fn hung_reason(secs: u64, targets: &ResetTargets, left: Option<&str>) -> String {
    let mut reason = format!(
        "reset did not return within {secs}s; the host may need a reboot (tt-smi issues 85, 185). tt-smi -r {} was killed with its process group",
        targets.argument()
    );
    if let Some(left) = left {
        reason.push_str(", but ");
        reason.push_str(left);
    }
    reason
}

/// Run a command in its own process group, collecting the tail of stdout
/// and stderr; at the deadline the whole group is killed (what tt-smi
/// started with it), so nothing of a hung command stays behind
/// (tt-worker-contract's one runner, [`subprocess::run`]).
async fn run_with_deadline(
    cmd: Command,
    deadline: Duration,
) -> Result<(Option<i32>, String), RunError> {
    let text = |out: &Captured, err: &Captured| {
        tail(&without_escapes(&(out.text() + &err.text())), OUTPUT_LIMIT)
    };
    match subprocess::run(cmd, deadline, Keep::Last(OUTPUT_LIMIT)).await {
        Ok(done) => Ok((done.status.code(), text(&done.stdout, &done.stderr))),
        Err(SubprocessError::TimedOut {
            after,
            stdout,
            stderr,
            left,
        }) => Err(RunError::TimedOut {
            after,
            output: text(&stdout, &stderr),
            left,
        }),
        Err(e @ SubprocessError::Spawn(_)) => Err(RunError::Failed(format!(
            "{e}; check the path in the config"
        ))),
        Err(e) => Err(RunError::Failed(e.to_string())),
    }
}

/// A tool's output without terminal escape sequences: tt-smi colours its
/// lines even when its output is not a terminal (docs/HARDWARE.md), and
/// the raw codes would land in card reasons, logs and `ttctl status`.
/// Removes CSI sequences (`ESC [` ... final byte `@`..`~`), character set
/// designations (`ESC ( B`) and any other `ESC` with the byte after it.
fn without_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next_if_eq(&'[').is_some() {
            // Parameters and intermediates, then one final byte.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else if matches!(chars.next(), Some('(' | ')' | '*' | '+')) {
            // A character set designation (`ESC ( B`): one byte more.
            chars.next();
        }
    }
    out
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

#[cfg(test)]
mod tests {

    #[test]
    fn tool_output_is_quoted_without_its_colour_codes() {
        assert_eq!(
            without_escapes("\u{1b}[31mError:\u{1b}[0m card 1 \u{1b}[1;33mbusy\u{1b}[m\u{1b}(B"),
            "Error: card 1 busy"
        );
        assert_eq!(without_escapes("plain ✓"), "plain ✓");
        assert_eq!(without_escapes("cut \u{1b}["), "cut ");
    }

    use super::*;

    /// A hardware root with cards at these (index, BDF), node present or not.
    fn root(cards: &[(u32, &str, bool)]) -> (tempfile::TempDir, HardwareRoot) {
        let dir = tempfile::tempdir().unwrap();
        let hw = HardwareRoot {
            dev_root: dir.path().join("dev"),
            sys_root: dir.path().join("sys"),
            proc_root: dir.path().join("proc"),
        };
        std::fs::create_dir_all(hw.dev_root.join("tenstorrent")).unwrap();
        std::fs::create_dir_all(hw.sys_root.join("class/tenstorrent")).unwrap();
        for (index, bdf, node) in cards {
            let pci = hw.sys_root.join("devices").join(bdf);
            let class = pci.join(format!("tenstorrent/tenstorrent!{index}"));
            std::fs::create_dir_all(&class).unwrap();
            std::os::unix::fs::symlink("../..", class.join("device")).unwrap();
            std::os::unix::fs::symlink(
                &class,
                hw.sys_root
                    .join(format!("class/tenstorrent/tenstorrent!{index}")),
            )
            .unwrap();
            if *node {
                std::fs::write(hw.dev_node(*index), "").unwrap();
            }
        }
        (dir, hw)
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn targets_are_present_full_lower_case_addresses_or_nothing() {
        let (_d, hw) = root(&[
            (0, "0000:01:00.0", true),
            (1, "0000:02:00.0", true),
            (2, "0000:03:00.0", false),
        ]);
        let ok = ResetTargets::check(&hw, &s(&["0000:02:00.0", "0000:01:00.0"])).unwrap();
        assert_eq!(ok.argument(), "0000:02:00.0,0000:01:00.0");

        // An absent card: refused, naming it, so tt-smi never sees a list
        // it would widen to every card.
        let gone = ResetTargets::check(&hw, &s(&["0000:01:00.0", "0000:09:00.0"])).unwrap_err();
        assert_eq!(gone.bdf, "0000:09:00.0");
        assert!(gone.to_string().contains("not attempted"), "{gone}");
        // A class dir without its node is not present either.
        let no_node = ResetTargets::check(&hw, &s(&["0000:03:00.0"])).unwrap_err();
        assert!(no_node.why.contains("tenstorrent/2"), "{no_node}");
        // Nothing, short or upper-case forms: refused.
        assert!(ResetTargets::check(&hw, &[]).is_err());
        assert!(ResetTargets::check(&hw, &s(&["01:00.0"])).is_err());
        assert!(ResetTargets::check(&hw, &s(&["0000:0A:00.0"])).is_err());
        assert!(ResetTargets::check(&hw, &s(&["/dev/tenstorrent/0"])).is_err());
    }

    #[test]
    fn failure_lines_fail_an_attempt_that_exited_0() {
        assert_eq!(
            failure_line(
                "Resetting PCI BDFs: ['0000:01:00.0']\n\u{1b}[91m Reset failed. \u{1b}[0m\n"
            ),
            Some("Reset failed.".to_string())
        );
        assert!(failure_line(
            "2026-12-01 | ERROR | UMD | Sending reset ioctl to device 1 failed: Input/output error"
        )
        .is_some());
        assert!(failure_line("Resetting all PCI devices: [0, 1, 2]").is_some());
        assert_eq!(
            failure_line(
                "Resetting PCI BDFs: ['0000:01:00.0']\n Re-initializing boards after reset.... \n"
            ),
            None
        );
    }

    #[test]
    fn links_are_read_as_linux_prints_them() {
        let up = Link {
            current: LinkState {
                speed: Some(32.0),
                width: Some(16),
            },
            max: LinkState {
                speed: Some(32.0),
                width: Some(16),
            },
        };
        assert!(up.is_up() && up.satisfies(&up.max));
        let in_reset = Link {
            current: LinkState {
                speed: None,
                width: Some(63),
            },
            ..up.clone()
        };
        assert!(!in_reset.is_up());
        let downtrained = Link {
            current: LinkState {
                speed: Some(8.0),
                width: Some(4),
            },
            ..up.clone()
        };
        assert!(!downtrained.satisfies(&up.max));
        // A card that ran below its maximum before the reset (a Gen4 slot)
        // must come back no worse than it was, not at its maximum.
        let gen4 = Link {
            current: LinkState {
                speed: Some(16.0),
                width: Some(16),
            },
            ..up.clone()
        };
        let baseline = Baseline {
            link: Some(gen4.clone()),
            therm_trips: None,
        };
        assert_eq!(baseline.expected_link(&gen4), gen4.current);
        assert!(gen4.satisfies(&baseline.expected_link(&gen4)));
        assert!(!downtrained.satisfies(&baseline.expected_link(&downtrained)));
    }
    /// Whether `pid` runs (a zombie has ended: only its parent's reaping is
    /// left, and an orphan's parent here may be an init that never reaps).
    fn running(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
                Some(!matches!(state, 'Z' | 'X'))
            })
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn a_command_past_its_deadline_dies_with_everything_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().join("pids");
        // Deaf to SIGTERM, as a process stuck in an ioctl is, with a child
        // that inherits that: only SIGKILL to the whole group ends both.
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(format!(
            "trap '' TERM INT HUP; sleep 600 & echo $! > {p}; echo $$ >> {p}; echo Resetting; wait",
            p = pids.display()
        ));
        let began = Instant::now();
        let err = run_with_deadline(cmd, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(began.elapsed() < Duration::from_secs(1) + subprocess::KILL_GRACE);
        let RunError::TimedOut { output, left, .. } = &err else {
            panic!("{err:?}");
        };
        assert!(output.contains("Resetting"), "{output:?}");
        assert_eq!(left, &None, "{err:?}");
        assert!(err.describe().contains("killed it with its process group"));
        let text = std::fs::read_to_string(&pids).unwrap();
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        assert_eq!(pids.len(), 2, "{text}");
        for pid in pids {
            assert!(!running(pid), "pid {pid} outlived the deadline");
        }
    }

    #[tokio::test]
    async fn a_command_that_ends_in_time_gives_its_code_and_output() {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg("echo out; echo err >&2; exit 3");
        let (code, output) = run_with_deadline(cmd, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(code, Some(3));
        assert_eq!(output, "out\nerr\n");
    }

    #[test]
    fn a_hung_reset_says_the_host_may_need_a_reboot() {
        let (_d, hw) = root(&[(0, "0000:01:00.0", true)]);
        let targets = ResetTargets::check(&hw, &s(&["0000:01:00.0"])).unwrap();
        let reason = hung_reason(120, &targets, None);
        assert!(
            reason.starts_with("reset did not return within 120s; the host may need a reboot (tt-smi issues 85, 185)"),
            "{reason}"
        );
        assert!(
            reason.contains("tt-smi -r 0000:01:00.0 was killed"),
            "{reason}"
        );
        let stuck = hung_reason(
            120,
            &targets,
            Some("its process group 7 still has processes"),
        );
        assert!(
            stuck.ends_with(", but its process group 7 still has processes"),
            "{stuck}"
        );
        let failure = ResetFailure {
            bdfs: "0000:01:00.0".into(),
            reason,
            attempts: 1,
            tt_smi_output: String::new(),
            kind: FailureKind::Hung,
            not_back: Vec::new(),
        };
        assert!(
            failure.to_string().starts_with(
                "reset of 0000:01:00.0 hung at attempt 1 and was not retried: reset did not return"
            ),
            "{failure}"
        );
    }
}
