//! `ttctl status`: a header line, the containment line, the cards table
//! and the slots table (the JSON is the status message itself, see
//! `json.rs`).

use tt_serving_proto::v1::{Card, CardState, DaemonInfo, Slot, SlotState, StatusResponse};
use tt_serving_proto::Word;

use super::{
    bytes_words, duration_words, last_reload_line, one_line, or_dash, percent_words, Table,
};

/// The whole status as text: a header line, how slots are contained, the
/// cards table and the slots table. `now_unix_ms` is the local clock, for
/// "3m12s ago".
pub fn status_table(status: &StatusResponse, now_unix_ms: u64) -> String {
    let mut out = String::new();
    out.push_str(&header_line(status.daemon.as_ref(), now_unix_ms));
    if let Some(d) = status.daemon.as_ref().filter(|d| !d.containment.is_empty()) {
        out.push_str(&format!(
            "\nslots contained by: {}",
            one_line(&d.containment)
        ));
    }
    if let Some(d) = status
        .daemon
        .as_ref()
        .filter(|d| d.hardware.starts_with("simulated"))
    {
        out.push_str(&format!("\nhardware: {}", one_line(&d.hardware)));
    }
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
    if !d.openai_address.is_empty() {
        facts.push(format!("OpenAI HTTP on {}", d.openai_address));
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
            card_state_words(card),
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
            if process.holds_chip {
                table.note(format!(
                    "pid {}{command} holds the chip (its tt-umd CHIP_IN_USE lock names it): a second user",
                    process.pid
                ));
            } else {
                table.note(format!(
                    "pid {}{command} has the device open (watching: it does not block the slot)",
                    process.pid
                ));
            }
        }
    }
    table.render()
}

/// What a quarantined card's reason begins with when a tt-smi reset of it
/// did not return (the daemon's `cards::RESET_HUNG_PREFIX`, spelled here
/// too: ttctl does not link the daemon).
const RESET_HUNG_PREFIX: &str = "reset hung: ";

/// The card's state word; `quarantined (reset hung)` for a card whose
/// reset hung: no automatic reset touches it again and the host may need a
/// reboot, so it must not read like a card that only failed its proof.
pub(crate) fn card_state_words(card: &Card) -> String {
    let word = CardState::word(card.state);
    let hung = CardState::try_from(card.state) == Ok(CardState::Quarantined)
        && card.state_reason.starts_with(RESET_HUNG_PREFIX);
    if hung {
        format!("{word} (reset hung)")
    } else {
        word
    }
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
        "PEAK",
        "INFLIGHT",
        "HIT",
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
            bytes_words(slot.worker_memory_peak_bytes),
            slot.requests_in_flight.to_string(),
            // The prefix-cache hit rate over every request the slot
            // finished (`ttctl top` shows it between frames).
            percent_words(slot.cached_prompt_tokens, slot.prompt_tokens),
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
        if !slot.memory_growth.is_empty() {
            table.note(format!("memory: {}", one_line(&slot.memory_growth)));
        }
        if !slot.trial.is_empty() {
            table.note(format!(
                "trial: {}; the configured definition comes back when the trial ends",
                one_line(&slot.trial)
            ));
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
