//! `ttctl top`'s frame: one row per slot with rates computed from two
//! status snapshots.

use tt_serving_proto::v1::{Slot, SlotState, StatusResponse};
use tt_serving_proto::Word;

use super::{bytes_words, duration_words, percent_words, Table};

/// A frame of `ttctl top` from the current snapshot and, when there is one,
/// the previous snapshot and the seconds between the two.
pub fn top_frame(
    now: &StatusResponse,
    before: Option<(&StatusResponse, f64)>,
    now_unix_ms: u64,
) -> String {
    let mut out = String::new();
    if let Some(d) = &now.daemon {
        let up = now_unix_ms.saturating_sub(d.started_unix_ms);
        out.push_str(&format!(
            "tt-servingd {} (pid {}, up {}): {}\n\n",
            d.version,
            d.pid,
            duration_words(up),
            d.summary
        ));
    }
    let mut table = Table::new(&[
        "SLOT",
        "STATE",
        "IN-FLIGHT",
        "QUEUE",
        "TOK/S",
        "REQ/S",
        "TTFT p50",
        "ITL p50",
        "HIT",
        "KV",
        "TOKENS",
        "RSS",
    ]);
    let mut total_rate = 0.0;
    let mut any_rate = false;
    for slot in &now.slots {
        let previous = before.and_then(|(snapshot, secs)| {
            snapshot
                .slots
                .iter()
                .find(|s| s.name == slot.name)
                .map(|s| (s, secs))
        });
        let rate = |now: u64, then: u64, secs: f64| {
            // A slot replaced by a reload starts its counters again.
            (now >= then && secs > 0.0).then(|| (now - then) as f64 / secs)
        };
        let tokens =
            previous.and_then(|(p, secs)| rate(slot.generated_tokens, p.generated_tokens, secs));
        let requests =
            previous.and_then(|(p, secs)| rate(slot.requests_served, p.requests_served, secs));
        if let Some(t) = tokens {
            total_rate += t;
            any_rate = true;
        }
        let queue = now
            .queues
            .iter()
            .find(|q| q.model == slot.model)
            .map_or("-".to_string(), |q| {
                format!("{}/{}", q.waiting, q.max_queue)
            });
        table.row(vec![
            slot.name.clone(),
            SlotState::word(slot.state),
            slot.requests_in_flight.to_string(),
            queue,
            tokens.map_or("-".to_string(), |t| format!("{t:.1}")),
            requests.map_or("-".to_string(), |r| format!("{r:.2}")),
            millis(slot.ttft_p50_ms),
            millis(slot.itl_p50_ms),
            hit_rate(slot, previous.map(|(p, _)| p)),
            kv_usage(slot),
            slot.generated_tokens.to_string(),
            bytes_words(slot.worker_rss_bytes),
        ]);
    }
    if now.slots.is_empty() {
        out.push_str("no slots configured\n");
    } else {
        out.push_str(&table.render());
    }
    if any_rate {
        out.push_str(&format!("\ntotal: {total_rate:.1} tokens/s\n"));
    }
    out
}

/// The share of prompt tokens the engine's prefix cache supplied: over the
/// requests finished between the two frames when there were any, else over
/// every request the slot finished, else `-`.
fn hit_rate(slot: &Slot, before: Option<&Slot>) -> String {
    if let Some(before) = before {
        // A slot replaced by a reload starts its counters again.
        let grew = slot.prompt_tokens > before.prompt_tokens
            && slot.cached_prompt_tokens >= before.cached_prompt_tokens;
        if grew {
            return percent_words(
                slot.cached_prompt_tokens - before.cached_prompt_tokens,
                slot.prompt_tokens - before.prompt_tokens,
            );
        }
    }
    percent_words(slot.cached_prompt_tokens, slot.prompt_tokens)
}

/// The share of the engine's KV blocks held by running sequences (what
/// `tt_serving_kv_cache_usage_perc` exports; the blocks kept only for the
/// prefix cache are given up whenever a sequence needs them, so they do not
/// count), `-` when the engine does not say.
fn kv_usage(slot: &Slot) -> String {
    slot.kv.as_ref().map_or("-".to_string(), |kv| {
        percent_words(u64::from(kv.blocks_in_use), u64::from(kv.blocks_total))
    })
}

fn millis(ms: f64) -> String {
    if ms <= 0.0 {
        "-".to_string()
    } else if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}
