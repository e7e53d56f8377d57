//! Log-probabilities in OpenAI's two shapes, written from the protocol's
//! `TokenLogprob` (the door) and read back into it (the worker, from its
//! engine):
//!
//! - `/v1/completions`: parallel lists `tokens`, `token_logprobs` (null
//!   for the prompt's first token), `top_logprobs` (objects from a token's
//!   text to its logprob; null for the first) and `text_offset`;
//! - `/v1/chat/completions`: `content`, one entry per token with its
//!   `token`, `logprob`, `bytes` and `top_logprobs` (each with the same
//!   three).
//!
//! The engine names tokens by text: what is read has no ids (the worker
//! sets them from the token ids it was given).

use crate::cut;
use serde_json::Value;
use tt_serving_proto::v1 as pb;

/// Logprobs as `/v1/completions` gives them: parallel lists.
pub fn completion(tokens: &[pb::TokenLogprob], text_start: usize) -> Value {
    let mut offset = text_start;
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(offset);
        offset += t.token.len();
    }
    serde_json::json!({
        "tokens": tokens.iter().map(|t| t.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens
            .iter()
            .map(|t| {
                t.top_logprobs
                    .iter()
                    .map(|a| (a.token.clone(), serde_json::json!(a.logprob)))
                    .collect::<serde_json::Map<_, _>>()
            })
            .collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// Logprobs of an echoed completion: the prompt's tokens, then the
/// completion's, as one list from the answer's first byte. The first
/// prompt token has no logprob (nothing precedes it): null, as OpenAI and
/// vLLM write it, and as evaluation harnesses skip it.
pub fn echo(prompt: &[pb::TokenLogprob], generated: &[pb::TokenLogprob]) -> Value {
    let all: Vec<pb::TokenLogprob> = prompt.iter().chain(generated).cloned().collect();
    let mut value = completion(&all, 0);
    if !prompt.is_empty() {
        value["token_logprobs"][0] = Value::Null;
        value["top_logprobs"][0] = Value::Null;
    }
    value
}

/// Logprobs as `/v1/chat/completions` gives them: one entry per token.
pub fn chat(tokens: &[pb::TokenLogprob]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            serde_json::json!({
                "token": t.token,
                "logprob": t.logprob,
                "bytes": t.bytes,
                "top_logprobs": t.top_logprobs.iter().map(|a| serde_json::json!({
                    "token": a.token, "logprob": a.logprob, "bytes": a.bytes,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({ "content": content })
}

/// Reads the completions shape ([`completion`], [`echo`]).
pub fn read_completion(value: &Value) -> Result<Vec<pb::TokenLogprob>, String> {
    let list = |k: &str| value.get(k).and_then(Value::as_array);
    let (Some(tokens), Some(logprobs)) = (list("tokens"), list("token_logprobs")) else {
        return Err(format!(
            "the engine sent logprobs without `tokens` and `token_logprobs`: {}",
            cut(&value.to_string(), 200)
        ));
    };
    let tops = list("top_logprobs");
    if tokens.len() != logprobs.len() {
        return Err(format!(
            "the engine sent logprobs of {} tokens with {} logprobs",
            tokens.len(),
            logprobs.len(),
        ));
    }
    let mut out = Vec::with_capacity(tokens.len());
    for (i, (token, logprob)) in tokens.iter().zip(logprobs).enumerate() {
        let text = token.as_str().unwrap_or_default();
        let top = tops
            .and_then(|t| t.get(i))
            .and_then(Value::as_object)
            .map(|alternatives| {
                alternatives
                    .iter()
                    .map(|(t, lp)| (t.as_str(), None, lp.as_f64().unwrap_or(f64::NEG_INFINITY)))
                    .collect()
            })
            .unwrap_or_default();
        out.push(token_logprob(text, None, logprob.as_f64(), top));
    }
    Ok(out)
}

/// Reads the chat shape ([`chat`]).
pub fn read_chat(value: &Value) -> Result<Vec<pb::TokenLogprob>, String> {
    let Some(content) = value.get("content").and_then(Value::as_array) else {
        return Err(format!(
            "the engine sent chat logprobs without `content`: {}",
            cut(&value.to_string(), 200)
        ));
    };
    let bytes = |v: &Value| -> Option<Vec<u8>> {
        v.get("bytes")?
            .as_array()?
            .iter()
            .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect()
    };
    fn text(v: &Value) -> &str {
        v.get("token").and_then(Value::as_str).unwrap_or_default()
    }
    let mut out = Vec::with_capacity(content.len());
    for entry in content {
        let top = entry
            .get("top_logprobs")
            .and_then(Value::as_array)
            .map(|alternatives| {
                alternatives
                    .iter()
                    .map(|a| {
                        let lp = a.get("logprob").and_then(Value::as_f64);
                        (text(a), bytes(a), lp.unwrap_or(f64::NEG_INFINITY))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let logprob = entry.get("logprob").and_then(Value::as_f64);
        out.push(token_logprob(text(entry), bytes(entry), logprob, top));
    }
    Ok(out)
}

/// One token's logprob for the protocol, its id not yet known: its
/// alternatives most likely first (ties by text). A missing logprob (the
/// prompt's first token) is 0, as the protocol writes it.
fn token_logprob(
    text: &str,
    bytes: Option<Vec<u8>>,
    logprob: Option<f64>,
    mut top: Vec<(&str, Option<Vec<u8>>, f64)>,
) -> pb::TokenLogprob {
    top.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(b.0)));
    pb::TokenLogprob {
        token_id: 0,
        token: text.to_string(),
        bytes: bytes.unwrap_or_else(|| text.as_bytes().to_vec()),
        logprob: logprob.unwrap_or(0.0) as f32,
        top_logprobs: top
            .into_iter()
            .map(|(t, b, lp)| pb::TopLogprob {
                token_id: None,
                token: t.to_string(),
                bytes: b.unwrap_or_else(|| t.as_bytes().to_vec()),
                logprob: lp as f32,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str, logprob: f32, top: &[(&str, f32)]) -> pb::TokenLogprob {
        pb::TokenLogprob {
            token_id: 0,
            token: text.into(),
            bytes: text.as_bytes().to_vec(),
            logprob,
            top_logprobs: top
                .iter()
                .map(|(t, lp)| pb::TopLogprob {
                    token_id: None,
                    token: (*t).into(),
                    bytes: t.as_bytes().to_vec(),
                    logprob: *lp,
                })
                .collect(),
        }
    }

    fn tokens() -> Vec<pb::TokenLogprob> {
        vec![
            token("The", -0.5, &[("The", -0.5), ("A", -1.5)]),
            token(" cat", -2.0, &[(" dog", -1.0), (" cat", -2.0)]),
        ]
    }

    #[test]
    fn what_the_door_writes_the_worker_reads_back_in_both_shapes() {
        let written = tokens();
        assert_eq!(read_completion(&completion(&written, 0)).unwrap(), written);
        assert_eq!(read_chat(&chat(&written)).unwrap(), written);
    }

    #[test]
    fn completions_give_offsets_and_an_echo_nulls_the_first_prompt_token() {
        let value = completion(&tokens(), 4);
        assert_eq!(value["text_offset"], serde_json::json!([4, 7]));
        let echoed = echo(&tokens()[..1], &tokens()[1..]);
        assert_eq!(echoed["text_offset"], serde_json::json!([0, 3]));
        assert_eq!(echoed["token_logprobs"][0], Value::Null);
        assert_eq!(echoed["top_logprobs"][0], Value::Null);
        // Read back, the first prompt token's logprob is the protocol's 0.
        let read = read_completion(&echoed).unwrap();
        assert_eq!((read[0].logprob, read[0].top_logprobs.len()), (0.0, 0));
        assert_eq!(read[1], tokens()[1]);
    }

    #[test]
    fn malformed_logprobs_are_the_engines_error() {
        let missing = read_completion(&serde_json::json!({"tokens": []})).unwrap_err();
        assert!(
            missing.contains("without `tokens` and `token_logprobs`"),
            "{missing}"
        );
        let uneven = serde_json::json!({"tokens": ["a"], "token_logprobs": []});
        assert!(read_completion(&uneven)
            .unwrap_err()
            .contains("of 1 tokens with 0"));
        assert!(read_chat(&serde_json::json!({})).is_err());
    }
}
