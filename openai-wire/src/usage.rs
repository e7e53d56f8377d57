//! `usage`: the token counts of an answer. The door writes it from a final
//! chunk; the worker reads it from its engine's last chunk (`stream_options.
//! include_usage`), by the general path (a JSON tree, [`Usage::read`]) or
//! the per-chunk fast path ([`UsageIn`]), which agree.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tt_serving_proto::v1 as pb;

/// `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    /// Prompt tokens after templating.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Their sum.
    pub total_tokens: u32,
    /// What the prompt tokens were made of.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`: always present, as OpenAI sends it, so
/// a client that reads `cached_tokens` finds 0 rather than nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens the engine's prefix cache supplied
    /// (`Timings.cached_prompt_tokens`; 0 when the engine does not say).
    pub cached_tokens: u32,
}

impl Usage {
    /// The counts, with their sum.
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }

    /// The usage of a finished request, from its final chunk.
    pub fn of(last: &pb::GenerationFinal) -> Usage {
        let u = last.usage.unwrap_or_default();
        let cached = last
            .timings
            .map_or(0, |t| t.cached_prompt_tokens)
            .min(u.prompt_tokens);
        Usage::new(u.prompt_tokens, u.completion_tokens, cached)
    }

    /// An engine's `usage` object; `cache_n` is llama-server's
    /// `timings.cache_n`, read when the usage has no
    /// `prompt_tokens_details.cached_tokens` (vLLM and recent llama-server
    /// give it). A count that is missing or not a count is 0; one past
    /// `u32` is `u32::MAX`.
    pub fn read(usage: &Value, cache_n: Option<&Value>) -> Usage {
        let count = |v: Option<&Value>| v.and_then(Value::as_u64).map_or(0, saturating_u32);
        let cached = usage
            .pointer("/prompt_tokens_details/cached_tokens")
            .or(cache_n);
        Usage::new(
            count(usage.get("prompt_tokens")),
            count(usage.get("completion_tokens")),
            count(cached),
        )
    }
}

/// An engine's `usage` read without a JSON tree (the fast path): a field
/// of another type fails to match, and the general path
/// ([`Usage::read`]) decides.
#[derive(Debug, Deserialize)]
pub struct UsageIn {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<DetailsIn>,
}

#[derive(Debug, Deserialize)]
struct DetailsIn {
    /// Outer `None`: absent (llama-server's `timings.cache_n` is read
    /// then); `Some(None)`: null, which counts as 0.
    #[serde(default, deserialize_with = "present")]
    cached_tokens: Option<Option<u64>>,
}

/// A field that is there, null or not (`Option<Option<T>>`).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

impl UsageIn {
    /// The counts, as [`Usage::read`] gives them.
    pub fn read(self, cache_n: Option<u64>) -> Usage {
        let cached = match self.prompt_tokens_details.and_then(|d| d.cached_tokens) {
            Some(given) => given,
            None => cache_n,
        };
        Usage::new(
            self.prompt_tokens.map_or(0, saturating_u32),
            self.completion_tokens.map_or(0, saturating_u32),
            cached.map_or(0, saturating_u32),
        )
    }
}

fn saturating_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_always_carries_the_cached_prompt_tokens_as_openai_does() {
        let last = pb::GenerationFinal {
            usage: Some(pb::Usage {
                prompt_tokens: 600,
                completion_tokens: 7,
            }),
            timings: Some(pb::Timings {
                cached_prompt_tokens: 592,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            serde_json::json!(Usage::of(&last)),
            serde_json::json!({
                "prompt_tokens": 600,
                "completion_tokens": 7,
                "total_tokens": 607,
                "prompt_tokens_details": { "cached_tokens": 592 },
            })
        );
        // An engine that says nothing: 0, never absent.
        let silent = pb::GenerationFinal {
            usage: Some(pb::Usage {
                prompt_tokens: 5,
                completion_tokens: 1,
            }),
            ..Default::default()
        };
        assert_eq!(Usage::of(&silent).prompt_tokens_details.cached_tokens, 0);
    }

    #[test]
    fn what_the_door_writes_reads_back_the_same_on_both_paths() {
        let written = Usage::new(600, 7, 592);
        let json = serde_json::to_string(&written).unwrap();
        let tree: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(Usage::read(&tree, None), written);
        let fast: UsageIn = serde_json::from_str(&json).unwrap();
        assert_eq!(fast.read(None), written);
    }

    #[test]
    fn llama_servers_cache_n_counts_only_where_cached_tokens_is_absent() {
        let cases = [
            (r#"{"prompt_tokens":8,"completion_tokens":4}"#, 5),
            (r#"{"prompt_tokens":8,"prompt_tokens_details":{}}"#, 5),
            (r#"{"prompt_tokens":8,"prompt_tokens_details":null}"#, 5),
            (
                r#"{"prompt_tokens":8,"prompt_tokens_details":{"cached_tokens":null}}"#,
                0,
            ),
            (
                r#"{"prompt_tokens":8,"prompt_tokens_details":{"cached_tokens":3}}"#,
                3,
            ),
        ];
        for (usage, cached) in cases {
            let tree: Value = serde_json::from_str(usage).unwrap();
            let read = Usage::read(&tree, Some(&serde_json::json!(5)));
            assert_eq!(read.prompt_tokens_details.cached_tokens, cached, "{usage}");
            let fast: UsageIn = serde_json::from_str(usage).unwrap();
            assert_eq!(fast.read(Some(5)), read, "{usage}");
        }
        let huge: Value = serde_json::from_str(r#"{"prompt_tokens":99999999999}"#).unwrap();
        assert_eq!(Usage::read(&huge, None).prompt_tokens, u32::MAX);
    }
}
