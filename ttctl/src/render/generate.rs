//! `ttctl generate`: the summary printed after the text.

use tt_serving_proto::v1::{FinishReason, GenerationFinal};
use tt_serving_proto::Word;

use super::or_dash;

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
