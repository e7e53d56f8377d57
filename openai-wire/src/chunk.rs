//! A completion or chat completion object, streamed (a chunk: `data:
//! {..}` events ending with `data: [DONE]`) or collected: `id`, `object`,
//! `created`, `model`, `choices` (each with `index`, `text` or
//! `delta`/`message`, `logprobs`, `finish_reason`) and `usage`.
//!
//! The door writes them to its clients ([`Head`] for what every chunk and
//! answer repeats, [`Writer`] for a stream's events straight into bytes);
//! the worker reads its engine's chunks into [`Chunk`], by the per-token
//! fast path that builds no JSON tree ([`read_fast`]) or the general path
//! ([`read_tree`]), which agree.

use crate::{finish, logprobs, tool_calls, Endpoint, Usage, UsageIn};
use serde_json::Value;
use std::borrow::Cow;
use tt_serving_proto::v1 as pb;

/// The data of the event that ends a stream.
pub const DONE: &str = "[DONE]";

/// What every chunk and answer repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The answer's id (`cmpl-..`, `chatcmpl-..`).
    pub id: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// The model the client named.
    pub model: String,
    /// Which endpoint answers, which decides `object` and the choices'
    /// shape.
    pub endpoint: Endpoint,
}

impl Head {
    /// A chunk (streamed) or an answer (collected) with these choices.
    pub fn body(&self, streamed: bool, choices: Value) -> Value {
        serde_json::json!({
            "id": self.id,
            "object": self.endpoint.object(streamed),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A collected answer: its choices and the usage of them all.
    pub fn answer(&self, choices: Vec<Value>, usage: &Usage) -> Value {
        let mut body = self.body(false, Value::Array(choices));
        body["usage"] = serde_json::json!(usage);
        body
    }

    /// One streamed choice: new output (with its tokens' logprobs when
    /// asked for), and the finish reason at the end.
    fn delta_choices(
        &self,
        delta: Option<&pb::TokenDelta>,
        logprobs: Value,
        finish: Option<&str>,
    ) -> Value {
        match self.endpoint {
            Endpoint::Completions => serde_json::json!([{
                "index": 0,
                "text": delta.map_or("", |d| d.text.as_str()),
                "logprobs": logprobs,
                "finish_reason": finish,
            }]),
            Endpoint::Chat => {
                let delta = delta.map_or_else(|| serde_json::json!({}), self::delta);
                serde_json::json!([{
                    "index": 0,
                    "delta": delta,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }])
            }
        }
    }

    /// The logprobs of `tokens` in this endpoint's shape; null when none
    /// were asked for. `text_start` is where their text begins in the
    /// answer (completions give offsets).
    pub fn logprobs(&self, tokens: &[pb::TokenLogprob], text_start: usize) -> Value {
        if tokens.is_empty() {
            return Value::Null;
        }
        match self.endpoint {
            Endpoint::Completions => logprobs::completion(tokens, text_start),
            Endpoint::Chat => logprobs::chat(tokens),
        }
    }
}

/// A collected completion's choice.
pub fn text_choice(index: usize, text: String, logprobs: Value, finish: &str) -> Value {
    serde_json::json!({
        "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
    })
}

/// A collected chat's choice: OpenAI's message, `content` null when the
/// turn is only tool calls (`calls`, joined by [`tool_calls::Joined`]);
/// `reasoning_content` and `tool_calls` only when there are some.
pub fn message_choice(
    index: usize,
    text: String,
    reasoning: &str,
    calls: Option<Value>,
    logprobs: Value,
    finish: &str,
) -> Value {
    let mut message = serde_json::json!({
        "role": "assistant",
        "content": if text.is_empty() && calls.is_some() {
            Value::Null
        } else {
            serde_json::json!(text)
        },
    });
    if !reasoning.is_empty() {
        message["reasoning_content"] = serde_json::json!(reasoning);
    }
    if let Some(calls) = calls {
        message["tool_calls"] = calls;
    }
    serde_json::json!({
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish,
    })
}

/// A chat chunk's `delta` as OpenAI's SDKs read it: `content` when there
/// is text (or logprobs for it), `reasoning_content` when the engine's
/// reasoning parser split off thinking (the name DeepSeek's API and
/// llama-server use, and vLLM before it renamed it `reasoning`), and
/// `tool_calls` pieces: the first piece of a call with its `id`, `type`
/// and `function.name`, every piece with `index` and
/// `function.arguments`.
pub fn delta(d: &pb::TokenDelta) -> Value {
    let mut delta = serde_json::Map::new();
    if !d.text.is_empty() || (d.reasoning.is_empty() && d.tool_calls.is_empty()) {
        delta.insert("content".into(), serde_json::json!(d.text));
    }
    if !d.reasoning.is_empty() {
        delta.insert("reasoning_content".into(), serde_json::json!(d.reasoning));
    }
    if !d.tool_calls.is_empty() {
        delta.insert("tool_calls".into(), tool_calls::write(&d.tool_calls));
    }
    Value::Object(delta)
}

/// One whole SSE event, `data: <json>` and its blank line.
pub fn event(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"data: ");
    push_json(&mut out, value);
    out.extend_from_slice(b"\n\n");
    out
}

/// Appends `value` as JSON. Serialising our own values into memory cannot
/// fail; were it ever to, the chunk carries `null` rather than a half
/// value.
fn push_json(out: &mut Vec<u8>, value: &(impl serde::Serialize + ?Sized)) {
    let mark = out.len();
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.truncate(mark);
        out.extend_from_slice(b"null");
    }
}

/// Writes streamed chunks straight into bytes. What every chunk repeats
/// (`data: {"id":..,"object":..,"created":..,"model":..,"choices":`) is
/// rendered once per request; a plain text delta (no logprobs, reasoning
/// or tool calls: nearly every token) is written after it with only its
/// text escaped, so no JSON tree is built and dropped per token. Anything
/// else is rendered from its JSON value, as the collected answer is.
#[derive(Debug)]
pub struct Writer {
    head: Head,
    prefix: Vec<u8>,
}

impl Writer {
    /// The writer of a stream answering as `head`.
    pub fn new(head: Head) -> Writer {
        let mut prefix = Vec::with_capacity(96 + head.id.len() + head.model.len());
        prefix.extend_from_slice(b"data: {\"id\":");
        push_json(&mut prefix, &head.id);
        prefix.extend_from_slice(b",\"object\":");
        push_json(&mut prefix, head.endpoint.object(true));
        prefix.extend_from_slice(b",\"created\":");
        prefix.extend_from_slice(head.created.to_string().as_bytes());
        prefix.extend_from_slice(b",\"model\":");
        push_json(&mut prefix, &head.model);
        prefix.extend_from_slice(b",\"choices\":");
        Writer { head, prefix }
    }

    /// What every chunk repeats.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// One event: the prefix, `choices`, any further top-level fields
    /// (`,"usage":{..}`), and the end.
    fn push(&self, out: &mut Vec<u8>, choices: impl FnOnce(&mut Vec<u8>), rest: &[u8]) {
        out.extend_from_slice(&self.prefix);
        choices(out);
        out.extend_from_slice(rest);
        out.extend_from_slice(b"}\n\n");
    }

    /// A chat stream's opening event: the assistant's role.
    pub fn role(&self, out: &mut Vec<u8>) {
        self.push(
            out,
            |o| {
                o.extend_from_slice(
                    br#"[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#,
                )
            },
            b"",
        );
    }

    /// A delta's event; `text_start` is where its text begins in the
    /// answer (completions' logprobs give offsets).
    pub fn delta(&self, out: &mut Vec<u8>, d: &pb::TokenDelta, text_start: usize) {
        out.reserve(self.prefix.len() + d.text.len() + 64);
        let plain = d.logprobs.is_empty() && d.reasoning.is_empty() && d.tool_calls.is_empty();
        if !plain {
            let logprobs = self.head.logprobs(&d.logprobs, text_start);
            let choices = self.head.delta_choices(Some(d), logprobs, None);
            self.push(out, |o| push_json(o, &choices), b"");
            return;
        }
        let (open, close): (&[u8], &[u8]) = match self.head.endpoint {
            Endpoint::Completions => (
                br#"[{"index":0,"text":"#,
                br#","logprobs":null,"finish_reason":null}]"#,
            ),
            Endpoint::Chat => (
                br#"[{"index":0,"delta":{"content":"#,
                br#"},"logprobs":null,"finish_reason":null}]"#,
            ),
        };
        self.push(
            out,
            |o| {
                o.extend_from_slice(open);
                push_json(o, d.text.as_str());
                o.extend_from_slice(close);
            },
            b"",
        );
    }

    /// The finish's event (the protocol's `FinishReason`).
    pub fn finish(&self, out: &mut Vec<u8>, reason: i32) {
        let choices = self
            .head
            .delta_choices(None, Value::Null, Some(finish::name(reason)));
        self.push(out, |o| push_json(o, &choices), b"");
    }

    /// The usage chunk (`stream_options.include_usage`): no choices.
    pub fn usage(&self, out: &mut Vec<u8>, usage: &Usage) {
        let mut rest = b",\"usage\":".to_vec();
        push_json(&mut rest, usage);
        self.push(out, |o| o.extend_from_slice(b"[]"), &rest);
    }

    /// The event that ends the stream.
    pub fn done(out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(DONE.as_bytes());
        out.extend_from_slice(b"\n\n");
    }
}

/// One streamed chunk as the worker reads it from its engine, as far as
/// it uses it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chunk {
    /// New text.
    pub text: String,
    /// New reasoning text (chat: `delta.reasoning`, vLLM's name since it
    /// renamed `reasoning_content`; `delta.reasoning_content`, older vLLM's
    /// and llama-server's).
    pub reasoning: String,
    /// Pieces of tool calls (chat: `delta.tool_calls`).
    pub tool_calls: Vec<pb::ToolCallDelta>,
    /// The ids of the new tokens, when the engine returned them.
    pub token_ids: Vec<u32>,
    /// The ids of the prompt's tokens (vLLM's first chunk, with
    /// `return_token_ids`).
    pub prompt_token_ids: Vec<u32>,
    /// Log-probabilities of the prompt's tokens (echo: first, one per
    /// `prompt_token_ids`) and then of the new tokens; each token's
    /// alternatives most likely first, all the engine sent. The engine
    /// names tokens by text: the ids are set by tt-worker-openai's
    /// `assign_ids`, which the relay calls knowing whether the request
    /// echoed its prompt.
    pub logprobs: Vec<pb::TokenLogprob>,
    /// `finish_reason`, once the choice ended.
    pub finish_reason: Option<String>,
    /// Token counts (the `include_usage` chunk).
    pub usage: Option<Usage>,
}

/// The general path: a chunk from its JSON tree (an error object is the
/// caller's to look for first: `crate::error::read`). `Err` names what in
/// its tool calls or logprobs is malformed.
pub fn read_tree(value: &Value, endpoint: Endpoint) -> Result<Chunk, String> {
    let mut chunk = Chunk::default();
    let choice = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first());
    if let Some(choice) = choice {
        let text = match endpoint {
            Endpoint::Completions => choice.get("text"),
            Endpoint::Chat => choice.get("delta").and_then(|d| d.get("content")),
        };
        chunk.text = text.and_then(Value::as_str).unwrap_or_default().to_string();
        if let (Endpoint::Chat, Some(delta)) = (endpoint, choice.get("delta")) {
            chunk.reasoning = ["reasoning", "reasoning_content"]
                .iter()
                .find_map(|k| delta.get(*k).and_then(Value::as_str))
                .unwrap_or_default()
                .to_string();
            chunk.tool_calls = tool_calls::read(delta.get("tool_calls"))?;
        }
        chunk.finish_reason = choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(String::from);
        // vLLM puts the delta's ids in the choice (`return_token_ids`);
        // llama-server's native stream has `tokens` beside the content.
        chunk.token_ids = ids(choice.get("token_ids"))
            .or_else(|| ids(choice.get("tokens")))
            .unwrap_or_default();
        chunk.prompt_token_ids = ids(choice.get("prompt_token_ids")).unwrap_or_default();
        if let Some(logprobs) = choice.get("logprobs").filter(|l| !l.is_null()) {
            chunk.logprobs = match endpoint {
                Endpoint::Completions => logprobs::read_completion(logprobs)?,
                Endpoint::Chat => logprobs::read_chat(logprobs)?,
            };
        }
    }
    if chunk.token_ids.is_empty() {
        chunk.token_ids = ids(value.get("tokens")).unwrap_or_default();
    }
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        chunk.usage = Some(Usage::read(usage, value.pointer("/timings/cache_n")));
    }
    Ok(chunk)
}

fn ids(value: Option<&Value>) -> Option<Vec<u32>> {
    value?
        .as_array()?
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// The fields of an ordinary chunk, borrowed from the event's text where it
/// has no escapes: the per-token fast path, which builds no JSON tree. Any
/// other shape (an error, tool calls, a field of a type this does not
/// expect, a duplicated key) fails to match here and is read by the
/// general path, which decides what it means.
#[derive(serde::Deserialize)]
struct ChunkIn<'a> {
    #[serde(borrow, default)]
    choices: Option<Vec<ChoiceIn<'a>>>,
    #[serde(default)]
    usage: Option<UsageIn>,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    /// llama-server's, for `cache_n` (see [`Usage::read`]).
    #[serde(default)]
    timings: Option<TimingsIn>,
    #[serde(default)]
    error: Option<serde::de::IgnoredAny>,
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct ChoiceIn<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<DeltaIn<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    /// Present (not null): the general path reads them.
    #[serde(default)]
    logprobs: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    prompt_token_ids: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct DeltaIn<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct TimingsIn {
    #[serde(default)]
    cache_n: Option<u64>,
}

/// An ordinary chunk read without a JSON tree, or `None` for the general
/// path ([`read_tree`]; see `ChunkIn`).
pub fn read_fast(data: &str, endpoint: Endpoint) -> Option<Chunk> {
    let wire: ChunkIn = serde_json::from_str(data).ok()?;
    if wire.error.is_some() || wire.object.as_deref() == Some("error") {
        return None;
    }
    let mut chunk = Chunk::default();
    if let Some(choice) = wire.choices.and_then(|c| c.into_iter().next()) {
        let delta = choice.delta.as_ref();
        if endpoint == Endpoint::Chat && delta.is_some_and(|d| d.tool_calls.is_some()) {
            return None;
        }
        if choice.logprobs.is_some() || choice.prompt_token_ids.is_some() {
            return None;
        }
        let text = match endpoint {
            Endpoint::Completions => choice.text.as_deref(),
            Endpoint::Chat => delta.and_then(|d| d.content.as_deref()),
        };
        chunk.text = text.unwrap_or_default().to_string();
        if let (Endpoint::Chat, Some(d)) = (endpoint, delta) {
            chunk.reasoning = d
                .reasoning
                .as_deref()
                .or(d.reasoning_content.as_deref())
                .unwrap_or_default()
                .to_string();
        }
        chunk.finish_reason = choice.finish_reason.as_deref().map(String::from);
        chunk.token_ids = choice.token_ids.or(choice.tokens).unwrap_or_default();
    }
    if chunk.token_ids.is_empty() {
        chunk.token_ids = wire.tokens.unwrap_or_default();
    }
    if let Some(usage) = wire.usage {
        chunk.usage = Some(usage.read(wire.timings.and_then(|t| t.cache_n)));
    }
    Some(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(endpoint: Endpoint) -> Head {
        Head {
            id: "chatcmpl-1-2".into(),
            created: 1_765_000_000,
            model: "smol\"lm".into(),
            endpoint,
        }
    }

    /// The JSON of each `data: ` event written, `[DONE]` as is.
    fn events(out: &[u8]) -> Vec<String> {
        let text = std::str::from_utf8(out).unwrap();
        assert!(text.ends_with("\n\n"), "{text}");
        text.split_terminator("\n\n")
            .map(|e| e.strip_prefix("data: ").unwrap().to_string())
            .collect()
    }

    /// What a chunk reads back as, by both paths (which must agree where
    /// the fast one reads it).
    fn read(data: &str, endpoint: Endpoint) -> Chunk {
        let tree = read_tree(&serde_json::from_str(data).unwrap(), endpoint).unwrap();
        if let Some(fast) = read_fast(data, endpoint) {
            assert_eq!(fast, tree, "{data}");
        }
        tree
    }

    fn token(text: &str, logprob: f32) -> pb::TokenLogprob {
        pb::TokenLogprob {
            token: text.into(),
            bytes: text.as_bytes().to_vec(),
            logprob,
            top_logprobs: vec![pb::TopLogprob {
                token: text.into(),
                bytes: text.as_bytes().to_vec(),
                logprob,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_plain_delta_is_written_as_openai_sends_it_field_for_field() {
        let mut out = Vec::new();
        let d = pb::TokenDelta {
            text: "a\"b\n".into(),
            ..Default::default()
        };
        Writer::new(head(Endpoint::Completions)).delta(&mut out, &d, 0);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "data: {\"id\":\"chatcmpl-1-2\",\"object\":\"text_completion\",\"created\":1765000000,\"model\":\"smol\\\"lm\",\"choices\":[{\"index\":0,\"text\":\"a\\\"b\\n\",\"logprobs\":null,\"finish_reason\":null}]}\n\n"
        );
        let chat = Writer::new(head(Endpoint::Chat));
        let mut out = Vec::new();
        chat.role(&mut out);
        chat.delta(&mut out, &d, 0);
        Writer::done(&mut out);
        assert_eq!(
            events(&out),
            [
                r#"{"id":"chatcmpl-1-2","object":"chat.completion.chunk","created":1765000000,"model":"smol\"lm","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
                r#"{"id":"chatcmpl-1-2","object":"chat.completion.chunk","created":1765000000,"model":"smol\"lm","choices":[{"index":0,"delta":{"content":"a\"b\n"},"logprobs":null,"finish_reason":null}]}"#,
                DONE,
            ]
        );
        // A plain delta is the tree's rendering, only faster.
        let tree = head(Endpoint::Chat).body(
            true,
            head(Endpoint::Chat).delta_choices(Some(&d), Value::Null, None),
        );
        let written: Value = serde_json::from_str(&events(&out)[1]).unwrap();
        assert_eq!(written, tree);
    }

    #[test]
    fn what_the_door_streams_the_worker_reads_back() {
        for endpoint in [Endpoint::Completions, Endpoint::Chat] {
            let writer = Writer::new(head(endpoint));
            let mut deltas = vec![
                pb::TokenDelta {
                    text: "plain é".into(),
                    ..Default::default()
                },
                pb::TokenDelta {
                    text: " scored".into(),
                    logprobs: vec![token(" sc", -0.5), token("ored", -1.25)],
                    ..Default::default()
                },
            ];
            if endpoint == Endpoint::Chat {
                deltas.push(pb::TokenDelta {
                    reasoning: "hmm".into(),
                    ..Default::default()
                });
                deltas.push(pb::TokenDelta {
                    tool_calls: vec![pb::ToolCallDelta {
                        index: 0,
                        id: "call-1".into(),
                        name: "weather".into(),
                        arguments: "{\"city\"".into(),
                    }],
                    ..Default::default()
                });
            }
            let mut out = Vec::new();
            let mut text_len = 0;
            for d in &deltas {
                writer.delta(&mut out, d, text_len);
                text_len += d.text.len();
            }
            let last = pb::GenerationFinal {
                finish_reason: pb::FinishReason::Length as i32,
                ..Default::default()
            };
            writer.finish(&mut out, last.finish_reason);
            let usage = Usage::new(9, 4, 2);
            writer.usage(&mut out, &usage);
            Writer::done(&mut out);
            let events = events(&out);
            assert_eq!(events.len(), deltas.len() + 3, "{endpoint:?}");
            for (d, data) in deltas.iter().zip(&events) {
                let read = read(data, endpoint);
                assert_eq!(read.text, d.text, "{data}");
                assert_eq!(read.reasoning, d.reasoning, "{data}");
                assert_eq!(read.tool_calls, d.tool_calls, "{data}");
                assert_eq!(read.logprobs, d.logprobs, "{data}");
                assert_eq!((read.finish_reason, read.usage), (None, None), "{data}");
            }
            let finished = read(&events[deltas.len()], endpoint);
            assert_eq!(finished.finish_reason.as_deref(), Some("length"));
            assert_eq!(
                finish::read(finished.finish_reason.as_deref().unwrap()),
                pb::FinishReason::Length
            );
            let counted = read(&events[deltas.len() + 1], endpoint);
            assert_eq!(counted.usage, Some(usage));
            assert_eq!(counted.text, "");
            assert_eq!(events[deltas.len() + 2], DONE);
        }
    }

    #[test]
    fn a_collected_answer_reads_as_openai_writes_it() {
        let usage = Usage::new(3, 2, 0);
        let completion = head(Endpoint::Completions).answer(
            vec![text_choice(0, "hi".into(), Value::Null, "stop")],
            &usage,
        );
        assert_eq!(completion["object"], "text_completion");
        assert_eq!(completion["choices"][0]["text"], "hi");
        assert_eq!(completion["usage"], serde_json::json!(usage));
        let calls = serde_json::json!([{"id": "call-1"}]);
        let only_calls = message_choice(
            1,
            String::new(),
            "",
            Some(calls.clone()),
            Value::Null,
            "tool_calls",
        );
        assert_eq!(
            only_calls,
            serde_json::json!({
                "index": 1,
                "message": {"role": "assistant", "content": null, "tool_calls": calls},
                "logprobs": null,
                "finish_reason": "tool_calls",
            })
        );
        let thought = message_choice(0, String::new(), "hmm", None, Value::Null, "stop");
        assert_eq!(
            thought["message"],
            serde_json::json!({"role": "assistant", "content": "", "reasoning_content": "hmm"})
        );
    }

    #[test]
    fn chat_deltas_carry_reasoning_and_tool_calls_as_openai_sdks_read_them() {
        let text = pb::TokenDelta {
            text: "hi".into(),
            ..Default::default()
        };
        assert_eq!(delta(&text), serde_json::json!({"content": "hi"}));
        let thinking = pb::TokenDelta {
            reasoning: "hmm".into(),
            ..Default::default()
        };
        assert_eq!(
            delta(&thinking),
            serde_json::json!({"reasoning_content": "hmm"})
        );
        // Only tool calls: no `content` (their pieces' shape is
        // tool_calls').
        let calls = pb::TokenDelta {
            tool_calls: vec![pb::ToolCallDelta {
                index: 0,
                id: "call-1".into(),
                name: "weather".into(),
                arguments: String::new(),
            }],
            ..Default::default()
        };
        assert_eq!(
            delta(&calls),
            serde_json::json!({"tool_calls": tool_calls::write(&calls.tool_calls)})
        );
    }

    #[test]
    fn the_fast_path_reads_every_ordinary_chunk_as_the_general_path_does() {
        let cases = [
            r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[279]}],"usage":null}"#,
            r#"{"choices":[{"index":0,"text":"a\"b\u00e9\n","finish_reason":"length","token_ids":[]}],"tokens":[5,6]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":3}}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":null}},"timings":{"cache_n":5}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4,"prompt_tokens_details":null},"timings":{"cache_n":5}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4,"prompt_tokens_details":{}},"timings":{"cache_n":5}}"#,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"hi","reasoning":null,"reasoning_content":"hmm"},"tokens":[1,2]}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning":"think"},"finish_reason":null,"token_ids":[9]}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"x","tool_calls":null}}],"usage":{"prompt_tokens":99999999999,"completion_tokens":1}}"#,
            r#"{"content":" w","tokens":[12],"stop":false}"#,
        ];
        for data in cases {
            for endpoint in [Endpoint::Completions, Endpoint::Chat] {
                let fast = read_fast(data, endpoint)
                    .unwrap_or_else(|| panic!("not on the fast path: {data}"));
                let tree: Value = serde_json::from_str(data).unwrap();
                assert!(crate::error::read(&tree).is_none(), "{data}");
                assert_eq!(
                    Ok(fast),
                    read_tree(&tree, endpoint),
                    "{data} as {endpoint:?}"
                );
            }
        }
    }
}
