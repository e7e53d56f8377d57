use tt_serving_proto::v1::{FinishReason, GenerationFinal, Timings, Usage};

use super::*;

fn final_chunk(completion_tokens: u32, ttft_us: u64, decode_us: u64) -> GenerationFinal {
    GenerationFinal {
        finish_reason: FinishReason::Length as i32,
        usage: Some(Usage {
            prompt_tokens: 12,
            completion_tokens,
        }),
        timings: Some(Timings {
            queue_us: 250,
            prefill_us: 30_000,
            decode_us,
            time_to_first_token_us: ttft_us,
            cached_prompt_tokens: 0,
        }),
        slot: "qwen/1".into(),
    }
}

#[test]
fn generate_summary_names_reason_tokens_slot_ttft_and_decode_rate() {
    // 64 tokens: the first arrives at the TTFT, the other 63 in 1.5 s.
    assert_eq!(
        generate_summary(&final_chunk(64, 35_240, 1_500_000)),
        "[length] 12 prompt tokens, 64 completion tokens, slot qwen/1, TTFT 35.2 ms, \
         decode 42.0 tok/s"
    );
    assert_eq!(
        generate_summary(&GenerationFinal {
            finish_reason: FinishReason::Stop as i32,
            ..final_chunk(8, 2_345_678, 700_000)
        }),
        "[stop] 12 prompt tokens, 8 completion tokens, slot qwen/1, TTFT 2.35 s, \
         decode 10.0 tok/s"
    );
}

#[test]
fn generate_summary_shows_dashes_for_what_was_not_measured() {
    // One token: nothing was decoded after the first.
    assert_eq!(
        generate_summary(&final_chunk(1, 850, 0)),
        "[length] 12 prompt tokens, 1 completion tokens, slot qwen/1, TTFT 850 us, decode -"
    );
    // A bare final chunk (no usage, timings or slot) still renders.
    assert_eq!(
        generate_summary(&GenerationFinal::default()),
        "[unknown] 0 prompt tokens, 0 completion tokens, slot -, TTFT -, decode -"
    );
    assert_eq!(
        FinishReason::word(FinishReason::Cancelled as i32),
        "cancelled"
    );
    assert_eq!(FinishReason::word(42), "unknown");
}
