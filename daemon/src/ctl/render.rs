//! Turning the daemon's answers into what the operator reads: aligned
//! tables, one-line summaries, or JSON for scripts.
//!
//! Everything here is a pure function of its inputs (the current time is a
//! parameter), so the output is pinned by unit tests without a daemon.
//!
//! The JSON is the protocol messages themselves (`json.rs` says why and
//! where it deliberately differs); enum values are the words the tables
//! print ([`Word`]).

mod json;
mod reload;
mod top;

pub(super) use json::json_text;
pub use json::{cache_json, CacheJson};
pub use reload::{last_reload_line, reload_failed_slots, reload_report_text};

pub use top::top_frame;

use tt_serving_proto::v1::{
    CacheVariant, Card, CardState, DaemonInfo, FinishReason, GenerationFinal, ListCacheResponse,
    LogLine, RemoveCacheResponse, ResetPhase, ResetProgress, Slot, SlotState, StatusResponse,
};
use tt_serving_proto::Word;

/// What a reset phase is doing, for progress lines without a message.
fn reset_phase_words(phase: i32) -> &'static str {
    match ResetPhase::try_from(phase) {
        Ok(ResetPhase::RunningTtSmi) => "running tt-smi -r",
        Ok(ResetPhase::WaitingForDevice) => "waiting for the device to reappear",
        Ok(ResetPhase::ReadingSysfs) => "reading sysfs",
        Ok(ResetPhase::CheckingHeartbeat) => "checking the heartbeat advances",
        Ok(ResetPhase::RunningProbe) => "running the site probe",
        Ok(ResetPhase::Retrying) => "attempt failed, retrying",
        Ok(ResetPhase::Done) => "card is back",
        Ok(ResetPhase::Failed) => "reset failed",
        Ok(ResetPhase::Unspecified) | Err(_) => "working",
    }
}

/// One line for one `ResetProgress` message:
/// `[0000:01:00.0] attempt 1: running tt-smi -r ...`.
pub fn reset_progress_line(progress: &ResetProgress) -> String {
    let what = if progress.message.is_empty() {
        reset_phase_words(progress.phase).to_string()
    } else {
        one_line(&progress.message)
    };
    if progress.attempt == 0 {
        format!("[{}] {what}", progress.bdf)
    } else {
        format!("[{}] attempt {}: {what}", progress.bdf, progress.attempt)
    }
}

/// The whole status as text: a header line, the cards table and the slots
/// table. `now_unix_ms` is the local clock, for "3m12s ago".
pub fn status_table(status: &StatusResponse, now_unix_ms: u64) -> String {
    let mut out = String::new();
    out.push_str(&header_line(status.daemon.as_ref(), now_unix_ms));
    out.push_str("\n\n");
    out.push_str(&cards_table(&status.cards));
    out.push('\n');
    out.push_str(&slots_table(&status.slots, &status.cards, now_unix_ms));
    if let Some(line) = last_reload_line(&status.reloads, now_unix_ms) {
        out.push('\n');
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `tt-servingd 0.1.0 (pid 812, driver 2.0.0, inference on [::]:50051, up
/// 3h12m): 1/1 slots ready`.
fn header_line(daemon: Option<&DaemonInfo>, now_unix_ms: u64) -> String {
    let Some(d) = daemon else {
        return "tt-servingd (the daemon sent no information about itself)".to_string();
    };
    let mut facts = vec![format!("pid {}", d.pid)];
    if d.driver_version.is_empty() {
        facts.push("driver not loaded".to_string());
    } else {
        facts.push(format!("driver {}", d.driver_version));
    }
    if !d.inference_address.is_empty() {
        facts.push(format!("inference on {}", d.inference_address));
    }
    if !d.metrics_address.is_empty() {
        facts.push(format!("metrics on {}", d.metrics_address));
    }
    if d.started_unix_ms != 0 {
        let up = now_unix_ms.saturating_sub(d.started_unix_ms);
        facts.push(format!("up {}", duration_words(up)));
    }
    let mut line = format!("tt-servingd {} ({})", or_dash(&d.version), facts.join(", "));
    if !d.summary.is_empty() {
        line.push_str(": ");
        line.push_str(&one_line(&d.summary));
    }
    line
}

fn cards_table(cards: &[Card]) -> String {
    if cards.is_empty() {
        return "no cards found\n".to_string();
    }
    let mut table = Table::new(&[
        "IDX",
        "BDF",
        "TYPE",
        "TEMP (°C)",
        "POWER (W)",
        "HEARTBEAT",
        "LOCK",
        "SLOT",
        "STATE",
    ]);
    for card in cards {
        let telemetry = card.telemetry.unwrap_or_default();
        table.row(vec![
            card.index.map_or("-".to_string(), |i| i.to_string()),
            card.bdf.clone(),
            or_dash(&card.card_type).to_string(),
            telemetry
                .temperature_c
                .map_or("-".to_string(), |t| format!("{t:.1}")),
            telemetry
                .power_w
                .map_or("-".to_string(), |p| format!("{p:.1}")),
            heartbeat_word(card).to_string(),
            lock_words(card),
            or_dash(&card.slot).to_string(),
            CardState::word(card.state),
        ]);
        if !card.state_reason.is_empty() {
            table.note(format!("reason: {}", one_line(&card.state_reason)));
        }
        for process in &card.processes {
            let command = if process.command.is_empty() {
                String::new()
            } else {
                format!(" ({})", one_line(&process.command))
            };
            table.note(format!("pid {}{command} has the device open", process.pid));
        }
    }
    table.render()
}

/// `ok` when the heartbeat advanced at the last check, `stalled` when it did
/// not, `—` when it could not be read (no device node, mid-reset, missing).
fn heartbeat_word(card: &Card) -> &'static str {
    let unreadable = card.index.is_none()
        || matches!(
            CardState::try_from(card.state),
            Ok(CardState::Missing | CardState::Resetting)
        )
        || (card.heartbeat == 0 && !card.heartbeat_ok);
    if unreadable {
        "—"
    } else if card.heartbeat_ok {
        "ok"
    } else {
        "stalled"
    }
}

/// `pid 812 daemon`, `pid 4242 bench-sweep`, `pid 4242`, or `-` when free.
fn lock_words(card: &Card) -> String {
    let Some(holder) = &card.lock_holder else {
        return "-".to_string();
    };
    let pid = if holder.pid == 0 {
        "pid ?".to_string()
    } else {
        format!("pid {}", holder.pid)
    };
    if holder.is_daemon {
        return format!("{pid} daemon");
    }
    let mut words = pid;
    if !holder.user.is_empty() {
        words.push_str(&format!(" {}", one_line(&holder.user)));
    }
    if !holder.purpose.is_empty() {
        words.push_str(&format!(" {}", one_line(&holder.purpose)));
    } else if !holder.command.is_empty() {
        words.push_str(&format!(" {}", one_line(&holder.command)));
    }
    words
}

fn slots_table(slots: &[Slot], cards: &[Card], now_unix_ms: u64) -> String {
    if slots.is_empty() {
        return "no slots configured\n".to_string();
    }
    let mut table = Table::new(&[
        "NAME",
        "MODEL",
        "CARDS",
        "STATE",
        "SINCE",
        "CACHE",
        "ATTEMPT",
        "PID",
        "RSS",
        "INFLIGHT",
        "LAST ERROR",
    ]);
    for slot in slots {
        table.row(vec![
            slot.name.clone(),
            slot.model.clone(),
            slot_cards(slot, cards),
            SlotState::word(slot.state),
            if slot.since_unix_ms == 0 {
                "-".to_string()
            } else {
                format!(
                    "{} ago",
                    duration_words(now_unix_ms.saturating_sub(slot.since_unix_ms))
                )
            },
            or_dash(&slot.cache_mode).to_string(),
            slot.attempt.to_string(),
            if slot.worker_pid == 0 {
                "-".to_string()
            } else {
                slot.worker_pid.to_string()
            },
            bytes_words(slot.worker_rss_bytes),
            slot.requests_in_flight.to_string(),
            or_dash(&one_line(&slot.last_error)).to_string(),
        ]);
        let troubled = matches!(
            SlotState::try_from(slot.state),
            Ok(SlotState::Failed | SlotState::Quarantined)
        );
        if troubled && !slot.reason.is_empty() {
            let mut note = format!("reason: {}", one_line(&slot.reason));
            if slot.retry_at_unix_ms != 0 {
                let wait = slot.retry_at_unix_ms.saturating_sub(now_unix_ms);
                note.push_str(&format!(" (retry in {})", duration_words(wait)));
            }
            table.note(note);
        }
        if !slot.outdated_keys.is_empty() {
            table.note(format!(
                "outdated: still runs the definition from before a reload whose rolling restart halted (differs in {}); fix the cause and reload again",
                slot.outdated_keys.join(", ")
            ));
        }
    }
    table.render()
}

/// A slot's cards by current index (`0,1`), which is what operators type;
/// the BDF stands in for a card without an index.
fn slot_cards(slot: &Slot, cards: &[Card]) -> String {
    if slot.cards.is_empty() {
        return "-".to_string();
    }
    slot.cards
        .iter()
        .map(|bdf| {
            cards
                .iter()
                .find(|c| &c.bdf == bdf)
                .and_then(|c| c.index)
                .map_or_else(|| bdf.clone(), |i| i.to_string())
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `42s`, `3m12s`, `2h03m`, `4d07h`.
fn duration_words(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// `-`, `812 MiB`, `10.3 GiB`.
fn bytes_words(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    match bytes {
        0 => "-".to_string(),
        b if b < MIB => format!("{} KiB", b.div_ceil(1024)),
        b if b < GIB => format!("{} MiB", b / MIB),
        b => format!("{:.1} GiB", b as f64 / GIB as f64),
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// Daemon-supplied text (errors, tt-smi output) may span lines; a table row
/// must not, or the columns fall apart.
fn one_line(s: &str) -> String {
    s.split(|c: char| c.is_control())
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Left-aligned columns two spaces apart, with free-text notes (reasons,
/// processes) indented under the row they explain.
struct Table {
    headers: Vec<String>,
    lines: Vec<Line>,
}

enum Line {
    Row(Vec<String>),
    Note(String),
}

impl Table {
    fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            lines: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.lines.push(Line::Row(cells));
    }

    fn note(&mut self, text: String) {
        self.lines.push(Line::Note(text));
    }

    fn render(&self) -> String {
        // Widths in chars, not bytes: headers hold `°` and cells `—`.
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for line in &self.lines {
            if let Line::Row(cells) = line {
                for (w, cell) in widths.iter_mut().zip(cells) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let mut out = String::new();
        push_cells(&mut out, &self.headers, &widths);
        for line in &self.lines {
            match line {
                Line::Row(cells) => push_cells(&mut out, cells, &widths),
                Line::Note(text) => {
                    out.push_str("    ");
                    out.push_str(text);
                    out.push('\n');
                }
            }
        }
        out
    }
}

fn push_cells(out: &mut String, cells: &[String], widths: &[usize]) {
    let start = out.len();
    for (cell, w) in cells.iter().zip(widths) {
        out.push_str(cell);
        let pad = w.saturating_sub(cell.chars().count()) + 2;
        out.extend(std::iter::repeat_n(' ', pad));
    }
    // The last column is not padded.
    let kept = out[start..].trim_end().len();
    out.truncate(start + kept);
    out.push('\n');
}

/// `ttctl generate`'s summary, from the final chunk:
/// `[stop] 12 prompt tokens, 8 completion tokens, slot qwen, TTFT 35.2 ms,
/// decode 41.3 tok/s`.
///
/// The decode rate counts the tokens after the first (the first one's time
/// is the TTFT); it is `-` when there is nothing to divide (fewer than two
/// tokens, or no decode time reported).
pub fn generate_summary(done: &GenerationFinal) -> String {
    let usage = done.usage.unwrap_or_default();
    let timings = done.timings.unwrap_or_default();
    let ttft = if timings.time_to_first_token_us == 0 {
        "-".to_string()
    } else {
        micros_words(timings.time_to_first_token_us)
    };
    let decoded = usage.completion_tokens.saturating_sub(1);
    let decode = if decoded == 0 || timings.decode_us == 0 {
        "-".to_string()
    } else {
        format!(
            "{:.1} tok/s",
            f64::from(decoded) * 1e6 / timings.decode_us as f64
        )
    };
    format!(
        "[{}] {} prompt tokens, {} completion tokens, slot {}, TTFT {ttft}, decode {decode}",
        FinishReason::word(done.finish_reason),
        usage.prompt_tokens,
        usage.completion_tokens,
        or_dash(&done.slot),
    )
}

/// `850 us`, `35.2 ms`, `1.52 s`.
fn micros_words(us: u64) -> String {
    match us {
        0..1_000 => format!("{us} us"),
        1_000..1_000_000 => format!("{:.1} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

/// One line of `ttctl logs`. The worker's own output (stdout and stderr)
/// is printed as it is, so the log reads and greps like the worker's
/// terminal; anything else the daemon sends (its notes, such as skipped
/// lines) is tagged with its source in brackets so it cannot be mistaken
/// for the worker's words.
pub fn log_line(line: &LogLine) -> String {
    match line.stream.as_str() {
        "stdout" | "stderr" | "" => line.text.clone(),
        tag => format!("[{tag}] {}", line.text),
    }
}

/// How `ttctl slot restart` goes on after the daemon queued the restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartFollow {
    /// It follows the slot until the restart is done or failed.
    Following,
    /// `--no-wait`: it returns at once.
    NoWait,
    /// The daemon is older than `Slot.starts`, so the restarted worker
    /// cannot be told from the old one: it returns at once.
    Unable,
}

/// The first line of `ttctl slot restart`, from the slot as the request
/// found it: `restart of slot qwen requested (it was ready, worker pid
/// 4242); ...` and what happens next. It never claims a state the restart
/// has not reached yet.
pub fn slot_restart_requested_line(before: &Slot, follow: RestartFollow) -> String {
    let was = SlotState::word(before.state);
    let found = if before.worker_pid == 0 {
        format!("it was {was}")
    } else {
        format!("it was {was}, worker pid {}", before.worker_pid)
    };
    let next = match follow {
        RestartFollow::Following => {
            "following it until a new worker is ready (Ctrl-C stops following, not the restart)"
        }
        RestartFollow::NoWait => {
            "it restarts in the background: follow it with `ttctl status --watch`"
        }
        RestartFollow::Unable => {
            "this tt-servingd does not report restarts: follow it with `ttctl status --watch`"
        }
    };
    format!(
        "restart of slot {} requested ({found}); {next}",
        before.name
    )
}

/// Where a restart stands: the slot now against the slot its request found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartStep {
    /// Still as the request found it (the supervisor has not acted yet, or
    /// the old worker finished its start): nothing to print.
    Unchanged,
    /// On its way: a line to print.
    Progress(String),
    /// A new worker is ready: the last line.
    Done(String),
    /// It failed, or cannot go on: the error (exit 1).
    Failed(String),
}

/// Compare the slot now with the slot the restart request found. The
/// start counter tells the restarted worker from the old one, so snapshots
/// that WatchStatus merged (a quick restart can skip states) still read
/// right.
pub fn restart_step(before: &Slot, now: &Slot) -> RestartStep {
    let new_start = now.starts != before.starts;
    let moved = new_start || now.state != before.state || now.since_unix_ms != before.since_unix_ms;
    let reason = one_line(&now.reason);
    let name = &now.name;
    match SlotState::try_from(now.state) {
        _ if !moved => RestartStep::Unchanged,
        Ok(SlotState::Ready) if new_start => RestartStep::Done(format!(
            "slot {name} is ready again with a new worker (pid {}): {reason}",
            now.worker_pid
        )),
        // The start the request found reached Ready; the restart follows.
        Ok(SlotState::Ready) => RestartStep::Unchanged,
        Ok(SlotState::Failed) => RestartStep::Failed(format!(
            "restart of slot {name} failed: {reason} (`ttctl logs {name}` shows the worker's output)"
        )),
        Ok(SlotState::Quarantined) => {
            RestartStep::Failed(format!("slot {name} cannot restart: it is quarantined: {reason}"))
        }
        Ok(SlotState::Stopped) => RestartStep::Failed(format!(
            "slot {name} stopped instead of restarting: {reason}"
        )),
        _ if reason.is_empty() => {
            RestartStep::Progress(format!("slot {name}: {}", SlotState::word(now.state)))
        }
        _ => RestartStep::Progress(format!(
            "slot {name}: {}: {reason}",
            SlotState::word(now.state)
        )),
    }
}

/// `ttctl cache ls`: one row per variant (MODEL, VARIANT, STATE, SIZE,
/// FILES, USED BY), with the reason under incomplete ones.
pub fn cache_table(cache: &ListCacheResponse) -> String {
    if cache.variants.is_empty() {
        return format!("no cache variants in {}\n", or_dash(&cache.cache_dir));
    }
    let mut table = Table::new(&["MODEL", "VARIANT", "STATE", "SIZE", "FILES", "USED BY"]);
    for variant in &cache.variants {
        table.row(vec![
            variant.model.clone(),
            variant.key.clone(),
            or_dash(&variant.state).to_string(),
            bytes_words(variant.bytes),
            files_words(variant),
            used_by_words(variant),
        ]);
        if variant.state == "incomplete" {
            table.note(format!("reason: {}", or_dash(&one_line(&variant.reason))));
        }
    }
    table.render()
}

/// The marker's file count, known only for a warm variant.
fn files_words(variant: &CacheVariant) -> String {
    if variant.files == 0 && variant.state != "warm" {
        "-".to_string()
    } else {
        variant.files.to_string()
    }
}

fn used_by_words(variant: &CacheVariant) -> String {
    if variant.used_by.is_empty() {
        "-".to_string()
    } else {
        variant.used_by.join(",")
    }
}

/// What `ttctl cache verify MODEL` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheVerdict {
    /// The model's variants, as a table for stdout; empty when it has none.
    pub listing: String,
    /// `Ok`: the line saying the next start is warm (stdout, exit 0).
    /// `Err`: why it will be cold, or that no configured model has that
    /// name (the failure message, exit 1).
    pub outcome: Result<String, String>,
}

/// Judge whether `model`'s next start will be warm: the variant its slots'
/// current config selects (the one with `used_by` set) must be on disk and
/// warm. A variant no slot uses is left over from an older config (or
/// worker) and does not count. A name the config does not have is an
/// error naming the models it has, not a promise of a cold start.
pub fn cache_verdict(model: &str, cache: &ListCacheResponse) -> CacheVerdict {
    let variants: Vec<&CacheVariant> = cache.variants.iter().filter(|v| v.model == model).collect();
    let configured = cache.models.iter().any(|m| m == model);
    if !configured && variants.is_empty() {
        return CacheVerdict {
            listing: String::new(),
            outcome: Err(format!(
                "unknown model `{model}`; the config names {}",
                if cache.models.is_empty() {
                    "no models".to_string()
                } else {
                    format!("these models: {}", cache.models.join(", "))
                }
            )),
        };
    }
    if variants.is_empty() {
        return CacheVerdict {
            listing: String::new(),
            outcome: Err(format!(
                "no cache for {model} yet: the next start builds it cold"
            )),
        };
    }
    let mut table = Table::new(&["VARIANT", "STATE", "SIZE", "FILES", "USED BY"]);
    for v in &variants {
        table.row(vec![
            v.key.clone(),
            or_dash(&v.state).to_string(),
            bytes_words(v.bytes),
            files_words(v),
            if v.used_by.is_empty() {
                "- (not selected by the current config)".to_string()
            } else {
                v.used_by.join(",")
            },
        ]);
        if v.state == "incomplete" {
            table.note(format!("reason: {}", or_dash(&one_line(&v.reason))));
        }
    }
    let used: Vec<&&CacheVariant> = variants.iter().filter(|v| !v.used_by.is_empty()).collect();
    let outcome = if !configured {
        Err(format!(
            "{model} is not a model of the config in force, which names {}; its {} cache \
             variant(s) on disk are left from an earlier config: `ttctl cache rm VARIANT` \
             removes one",
            if cache.models.is_empty() {
                "no models".to_string()
            } else {
                cache.models.join(", ")
            },
            variants.len()
        ))
    } else if used.is_empty() {
        Err(format!(
            "{model}: none of its {} cache variant(s) on disk is the one its current config \
             selects (no slot uses them): a cold build will happen at the next start",
            variants.len()
        ))
    } else if let Some(bad) = used.iter().find(|v| v.state != "warm") {
        let slots = bad.used_by.join(", ");
        Err(match bad.state.as_str() {
            "cold" => format!(
                "{model}: variant {} (used by {slots}) is cold, its build never completed: \
                 a cold build will happen at the next start",
                bad.key
            ),
            "incomplete" => format!(
                "{model}: variant {} (used by {slots}) is incomplete: {}; \
                 a cold build will happen at the next start",
                bad.key,
                or_dash(&one_line(&bad.reason))
            ),
            other => format!(
                "{model}: variant {} (used by {slots}) is {}, not warm: \
                 a cold build will happen at the next start",
                bad.key,
                if other.is_empty() {
                    "in an unknown state"
                } else {
                    other
                }
            ),
        })
    } else {
        let keys: Vec<&str> = used.iter().map(|v| v.key.as_str()).collect();
        let slots: Vec<&str> = used
            .iter()
            .flat_map(|v| v.used_by.iter().map(String::as_str))
            .collect();
        Ok(format!(
            "{model}: variant {} is warm: the next start of {} is warm",
            keys.join(", "),
            slots.join(", ")
        ))
    };
    CacheVerdict {
        listing: table.render(),
        outcome,
    }
}

/// What `ttctl cache rm` prints: `removed /var/cache/tt-serving/qwen/3f2a...:
/// freed 10.5 GiB (11274289152 bytes)`.
pub fn cache_removed_line(removed: &RemoveCacheResponse) -> String {
    let freed = if removed.bytes == 0 {
        "0 bytes".to_string()
    } else {
        format!("{} ({} bytes)", bytes_words(removed.bytes), removed.bytes)
    };
    format!("removed {}: freed {freed}", removed.path)
}

#[cfg(test)]
mod tests;
