//! `finish_reason`: OpenAI's word for why a choice ended, and the
//! protocol's `FinishReason`, both ways in one place.

use tt_serving_proto::v1 as pb;

/// OpenAI's word for the protocol's reason, as the door writes it.
pub fn name(reason: i32) -> &'static str {
    match pb::FinishReason::try_from(reason) {
        Ok(pb::FinishReason::Length) => "length",
        Ok(pb::FinishReason::ToolCalls) => "tool_calls",
        // A cancelled request has no client left to read this.
        _ => "stop",
    }
}

/// An engine's `finish_reason` in the protocol's words. vLLM says `abort`
/// for a request it aborted, and both engines `tool_calls` for a turn
/// ended by calling tools; anything else that ended the text (a content
/// filter) ended it like a stop.
pub fn read(name: &str) -> pb::FinishReason {
    match name {
        "length" => pb::FinishReason::Length,
        "abort" | "cancelled" => pb::FinishReason::Cancelled,
        "tool_calls" => pb::FinishReason::ToolCalls,
        _ => pb::FinishReason::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_words_the_door_writes_read_back_as_their_reasons() {
        for reason in [
            pb::FinishReason::Stop,
            pb::FinishReason::Length,
            pb::FinishReason::ToolCalls,
        ] {
            assert_eq!(read(name(reason as i32)), reason);
        }
        // Nobody reads a cancelled answer: the door says stop.
        assert_eq!(name(pb::FinishReason::Cancelled as i32), "stop");
        assert_eq!(read("abort"), pb::FinishReason::Cancelled);
        assert_eq!(read("content_filter"), pb::FinishReason::Stop);
    }
}
