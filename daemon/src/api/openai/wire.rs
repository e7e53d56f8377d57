//! The OpenAI wire format: what clients send (`/v1/completions`,
//! `/v1/chat/completions`) and what they get back, as the OpenAI API and its
//! SDKs define them. Requests are read strictly: an unknown field is refused
//! by name, and a known parameter the engines cannot honour is refused by
//! name too (fail closed: never ignored silently). What answers carry
//! (`usage`, logprobs, finish reasons, tool call pieces) is written by
//! `tt_openai_wire`, which the worker reads its engine's answers with.

use serde::Deserialize;
use tt_serving_proto::v1 as pb;

/// A string or a list of strings (`prompt`, `stop`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and length parameters both endpoints share.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Common {
    /// Stream Server-Sent Events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Tokens to generate at most.
    pub max_tokens: Option<u32>,
    /// Softmax temperature; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k sampling (vLLM's extension).
    pub top_k: Option<u32>,
    /// The sampler's seed.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<OneOrMany>,
    /// Completions per prompt: only 1.
    pub n: Option<u32>,
    /// The caller's end user, for the caller's own accounting; accepted
    /// and not used.
    #[expect(dead_code, reason = "accepted for OpenAI clients, not used")]
    pub user: Option<String>,
    /// OpenAI's presence penalty, in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty, in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// vLLM's (Hugging Face's) repetition penalty; 1 is off.
    pub repetition_penalty: Option<f32>,
    /// vLLM's: no end of sequence before this many tokens.
    pub min_tokens: Option<u32>,
    /// vLLM's: generate through end-of-sequence tokens (fixed output
    /// lengths for benchmarks).
    pub ignore_eos: Option<bool>,
    /// vLLM's: token ids that end generation.
    pub stop_token_ids: Option<Vec<u32>>,
    /// Refused: see [`Common::refuse_unsupported`].
    pub logit_bias: Option<serde_json::Value>,
    /// `/v1/completions`: an integer (the alternatives per token);
    /// `/v1/chat/completions`: a boolean, with `top_logprobs`.
    pub logprobs: Option<serde_json::Value>,
    /// Chat: the alternatives per token, with `"logprobs": true`.
    pub top_logprobs: Option<u32>,
}

/// `prompt` of `/v1/completions`: text or token ids, one prompt or a
/// batch (OpenAI's four forms; evaluation harnesses send token ids, in
/// batches).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptIn {
    /// One text prompt.
    Text(String),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several text prompts.
    Texts(Vec<String>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

impl PromptIn {
    /// Each prompt as the proto's input.
    fn inputs(self) -> Vec<pb::generate_request::Input> {
        use pb::generate_request::Input;
        let tokens = |ids| Input::PromptTokens(pb::PromptTokens { ids });
        match self {
            PromptIn::Text(t) => vec![Input::Prompt(t)],
            // `[]`: no prompt at all, whichever list it was meant to be.
            PromptIn::Tokens(ids) if ids.is_empty() => Vec::new(),
            PromptIn::Tokens(ids) => vec![tokens(ids)],
            PromptIn::Texts(v) => v.into_iter().map(Input::Prompt).collect(),
            PromptIn::TokenLists(v) => v.into_iter().map(tokens).collect(),
        }
    }
}

/// `POST /v1/completions`: its own fields ([`Common`] is read separately).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// The model, as `/v1/models` lists it.
    pub model: String,
    /// The prompt or prompts.
    pub prompt: PromptIn,
    /// Answer with the prompt before the completion (and its tokens'
    /// logprobs first when `logprobs` is given).
    #[serde(default)]
    pub echo: bool,
    /// Refused unless 1.
    pub best_of: Option<u32>,
    /// Refused.
    pub suffix: Option<String>,
}

/// One chat message; `content` is text or a list of text parts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessageIn {
    /// `system`, `user` or `assistant` (the router checks).
    pub role: String,
    /// The text.
    pub content: Content,
    /// A participant name; not used by the templates, refused.
    pub name: Option<String>,
}

/// Message content: a string, or parts of which only `text` ones are
/// supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts.
    Parts(Vec<ContentPart>),
}

/// A content part.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    /// `text` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: String,
}

/// `POST /v1/chat/completions`: its own fields ([`Common`] is read
/// separately).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The model, as `/v1/models` lists it.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessageIn>,
    /// The newer name of `max_tokens`.
    pub max_completion_tokens: Option<u32>,
    /// JSON output (`GenerateRequest.response_format`).
    pub response_format: Option<ResponseFormatIn>,
    /// The functions the model may call, passed on as JSON text
    /// (`GenerateRequest.tools`; the router checks their shape).
    pub tools: Option<serde_json::Value>,
    /// `"none"`, `"auto"`, `"required"` or a named function, passed on as
    /// JSON text (`GenerateRequest.tool_choice`).
    pub tool_choice: Option<serde_json::Value>,
}

/// `response_format`: `{"type": "text" | "json_object"}` or `{"type":
/// "json_schema", "json_schema": {...}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormatIn {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema, with `"type": "json_schema"`.
    pub json_schema: Option<JsonSchemaIn>,
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaIn {
    /// The schema's name.
    pub name: String,
    /// What the output is for; OpenAI shows it to the model, our engines
    /// do not, so it is accepted and not sent.
    #[expect(dead_code, reason = "accepted for OpenAI clients, not sent")]
    pub description: Option<String>,
    /// The JSON Schema itself.
    pub schema: Option<serde_json::Value>,
    /// OpenAI's strict mode.
    #[serde(default)]
    pub strict: Option<bool>,
}

impl ResponseFormatIn {
    /// Into the proto's `ResponseFormat`; `None` for free text.
    fn parse(self) -> Result<Option<pb::ResponseFormat>, Refused> {
        use pb::ResponseFormatType as T;
        let (kind, schema) = match (self.kind.as_str(), self.json_schema) {
            ("text", None) => return Ok(None),
            ("json_object", None) => (T::JsonObject, None),
            ("json_schema", Some(schema)) => (T::JsonSchema, Some(schema)),
            ("json_schema", None) => {
                return Err(refuse(
                    "response_format.json_schema",
                    "give the schema: {\"name\": ..., \"schema\": {...}}",
                ))
            }
            ("text" | "json_object", Some(_)) => {
                return Err(refuse(
                    "response_format.json_schema",
                    "only with \"type\": \"json_schema\"",
                ))
            }
            (other, _) => {
                return Err(refuse(
                    "response_format.type",
                    &format!(
                        "`{}` is not a response format; use text, json_object or json_schema",
                        crate::echo::echo(other)
                    ),
                ))
            }
        };
        let mut format = pb::ResponseFormat {
            r#type: kind as i32,
            ..Default::default()
        };
        if let Some(s) = schema {
            format.name = s.name;
            format.strict = s.strict.unwrap_or(false);
            // OpenAI's schema is optional; absent means any JSON object.
            format.schema = s
                .schema
                .unwrap_or_else(|| serde_json::json!({"type": "object"}))
                .to_string();
        }
        Ok(Some(format))
    }
}

/// The fields both endpoints know ([`Common`]).
const COMMON_FIELDS: &[&str] = &[
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "logit_bias",
    "logprobs",
    "top_logprobs",
];

/// Fields only `/v1/completions` knows ([`CompletionRequest`]).
pub const COMPLETION_FIELDS: &[&str] = &["model", "prompt", "echo", "best_of", "suffix"];

/// Fields only `/v1/chat/completions` knows ([`ChatRequest`]).
pub const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_completion_tokens",
    "response_format",
    "tools",
    "tool_choice",
];

/// Split a body into the endpoint's own fields and the [`Common`] ones, so
/// each is read with its own struct (serde keeps the path of a type error
/// that way, which it loses through `#[serde(flatten)]`), refusing a field
/// neither knows by name.
pub fn split_fields(
    body: serde_json::Value,
    endpoint: &[&str],
) -> Result<(serde_json::Value, serde_json::Value), Refused> {
    let serde_json::Value::Object(fields) = body else {
        return Err(Refused {
            param: String::new(),
            message: "the body must be a JSON object".into(),
        });
    };
    let (mut own, mut common) = (serde_json::Map::new(), serde_json::Map::new());
    for (key, value) in fields {
        if endpoint.contains(&key.as_str()) {
            own.insert(key, value);
        } else if COMMON_FIELDS.contains(&key.as_str()) {
            common.insert(key, value);
        } else {
            let key = crate::echo::echo(&key);
            return Err(refuse(
                &key,
                "not a parameter this server knows; leave it out (it is never ignored silently)",
            ));
        }
    }
    Ok((own.into(), common.into()))
}

/// A refused request field: its name (the OpenAI error's `param`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The field.
    pub param: String,
    /// What is wrong and what to do.
    pub message: String,
}

fn refuse(param: &str, why: &str) -> Refused {
    Refused {
        param: param.to_string(),
        message: format!("{param}: {why}"),
    }
}

impl Common {
    /// Parameters no engine behind this daemon honours are refused by name,
    /// never dropped: a client that asks for a bias and silently gets none
    /// would measure or ship the wrong thing. (The optional parameters an
    /// engine may or may not take are checked by the router against the
    /// engine that would serve the request.)
    fn refuse_unsupported(&self) -> Result<(), Refused> {
        if self.logit_bias.is_some() {
            return Err(refuse(
                "logit_bias",
                "not supported by the engines this server runs; leave it out",
            ));
        }
        if self.n.is_some_and(|n| n != 1) {
            return Err(refuse(
                "n",
                "only n = 1 is supported; send one request per completion",
            ));
        }
        if self.stream_options.is_some() && !self.stream {
            return Err(refuse(
                "stream_options",
                "only allowed with \"stream\": true",
            ));
        }
        Ok(())
    }

    /// The request fields both endpoints carry into `GenerateRequest`.
    fn apply(self, request: &mut pb::GenerateRequest) {
        request.presence_penalty = self.presence_penalty.unwrap_or(0.0);
        request.frequency_penalty = self.frequency_penalty.unwrap_or(0.0);
        request.repetition_penalty = self.repetition_penalty.unwrap_or(0.0);
        request.min_tokens = self.min_tokens.unwrap_or(0);
        request.ignore_eos = self.ignore_eos.unwrap_or(false);
        request.stop_token_ids = self.stop_token_ids.unwrap_or_default();
        request.n = self.n.unwrap_or(0);
        request.max_tokens = self.max_tokens.unwrap_or(0);
        let sampling = pb::SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(0.0),
            top_k: self.top_k.unwrap_or(0),
            seed: self.seed,
        };
        // OpenAI's default temperature is 1; an explicit 0 is greedy, as
        // is the proto's absent sampling.
        request.sampling = Some(sampling);
        request.stop = self.stop.map(OneOrMany::into_vec).unwrap_or_default();
    }
}

/// Whether and how `/v1/completions` answers with the prompt (`echo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// The completion only.
    Off,
    /// The prompt's text first.
    Text,
    /// The prompt's text first, and its tokens' logprobs before the
    /// completion's (the engine's `prompt_logprobs`).
    WithLogprobs,
}

/// The most prompts one `/v1/completions` request may batch (each is one
/// request through the router, run side by side).
pub const MAX_BATCHED_PROMPTS: usize = 64;

/// What the handlers need from a parsed request.
#[derive(Debug)]
pub struct Parsed {
    /// The request for the router (the first prompt's, in a batch).
    pub request: pb::GenerateRequest,
    /// The batch's other prompts' requests (`/v1/completions` with a list
    /// of prompts), answered as choices 1, 2, ...
    pub more: Vec<pb::GenerateRequest>,
    /// Whether the answer starts with the prompt.
    pub echo: Echo,
    /// Stream Server-Sent Events.
    pub stream: bool,
    /// Send `usage` in a last chunk (streaming).
    pub include_usage: bool,
}

impl CompletionRequest {
    /// Into the router's request, or the field refused.
    pub fn parse(self, common: Common) -> Result<Parsed, Refused> {
        common.refuse_unsupported()?;
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(refuse("best_of", "only best_of = 1 is supported"));
        }
        if self.suffix.is_some() {
            return Err(refuse(
                "suffix",
                "insertion (suffix) is not supported; leave it out",
            ));
        }
        let inputs = self.prompt.inputs();
        if inputs.is_empty() {
            return Err(refuse(
                "prompt",
                "the list of prompts is empty; give at least one",
            ));
        }
        if inputs.len() > MAX_BATCHED_PROMPTS {
            return Err(refuse(
                "prompt",
                &format!(
                    "{} prompts in one request is above this server's limit of {MAX_BATCHED_PROMPTS}; send them in several requests",
                    inputs.len()
                ),
            ));
        }
        if let Some(i) = inputs.iter().position(
            |p| matches!(p, pb::generate_request::Input::PromptTokens(t) if t.ids.is_empty()),
        ) {
            return Err(refuse(
                &format!("prompt[{i}]"),
                "a prompt of no tokens; give at least one token",
            ));
        }
        let (stream, include_usage) = streaming(&common);
        if stream && inputs.len() > 1 {
            return Err(refuse(
                "prompt",
                &format!(
                    "{} prompts with \"stream\": true; a stream answers one prompt, so send one streamed request per prompt (or leave stream out to get them as choices)",
                    inputs.len()
                ),
            ));
        }
        if stream && self.echo {
            return Err(refuse(
                "echo",
                "not supported with \"stream\": true; leave stream out to get the prompt back with the answer",
            ));
        }
        let max_tokens = common.max_tokens;
        if max_tokens == Some(0) && !self.echo {
            return Err(refuse(
                "max_tokens",
                "0 generates nothing; give at least 1 (0 is for scoring the prompt with \"echo\": true)",
            ));
        }
        // Completions: `logprobs` is the number of alternatives per token.
        let logprobs = match &common.logprobs {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        refuse(
                            "logprobs",
                            "give the number of alternatives per token (an integer, 0 for the chosen token's only)",
                        )
                    })?,
            ),
        };
        if common.top_logprobs.is_some() {
            return Err(refuse(
                "top_logprobs",
                "a chat parameter; on /v1/completions give the number as `logprobs`",
            ));
        }
        let echo = match (self.echo, logprobs) {
            (false, _) => Echo::Off,
            (true, None) => Echo::Text,
            (true, Some(_)) => Echo::WithLogprobs,
        };
        let mut template = pb::GenerateRequest {
            model: self.model,
            ..Default::default()
        };
        common.apply(&mut template);
        template.logprobs = logprobs;
        if self.echo {
            // Echoing token ids needs their text, which only the engine
            // has: it comes with the prompt's logprobs.
            let tokens = inputs
                .iter()
                .any(|p| matches!(p, pb::generate_request::Input::PromptTokens(_)));
            if echo == Echo::WithLogprobs || tokens {
                template.prompt_logprobs = Some(logprobs.unwrap_or(0));
            }
            if max_tokens == Some(0) {
                if template.prompt_logprobs.is_none() {
                    return Err(refuse(
                        "max_tokens",
                        "0 with \"echo\" and no \"logprobs\" answers the prompt you sent and nothing else; give logprobs to score it, or max_tokens of 1 or more",
                    ));
                }
                template.prompt_only = true;
                template.max_tokens = 0;
                template.logprobs = None;
            }
        }
        let mut requests = inputs.into_iter().map(|input| pb::GenerateRequest {
            input: Some(input),
            ..template.clone()
        });
        let request = requests.next().unwrap_or(template.clone());
        Ok(Parsed {
            request,
            more: requests.collect(),
            echo,
            stream,
            include_usage,
        })
    }
}

impl ChatRequest {
    /// Into the router's request, or the field refused.
    pub fn parse(self, common: Common) -> Result<Parsed, Refused> {
        common.refuse_unsupported()?;
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.into_iter().enumerate() {
            if m.name.is_some() {
                return Err(refuse(
                    &format!("messages[{i}].name"),
                    "participant names are not supported; leave it out",
                ));
            }
            let content = match m.content {
                Content::Text(text) => text,
                Content::Parts(parts) => {
                    let mut text = String::new();
                    for (j, part) in parts.into_iter().enumerate() {
                        if part.kind != "text" {
                            return Err(refuse(
                                &format!("messages[{i}].content[{j}].type"),
                                &format!(
                                    "`{}` parts are not supported; send text",
                                    crate::echo::echo(&part.kind)
                                ),
                            ));
                        }
                        text.push_str(&part.text);
                    }
                    text
                }
            };
            messages.push(pb::ChatMessage {
                role: m.role,
                content,
            });
        }
        let (stream, include_usage) = streaming(&common);
        let max_completion_tokens = self.max_completion_tokens;
        let response_format = match self.response_format {
            Some(f) => f.parse()?,
            None => None,
        };
        // Passed on as JSON text; `tt_serving_proto::parameters::check`
        // (the router's validation) names what is wrong inside, and the
        // router refuses them by name where the engine does not list
        // `tools`.
        let tools = match self.tools {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(v @ serde_json::Value::Array(_)) => v.to_string(),
            Some(_) => return Err(refuse("tools", "give a list of tools")),
        };
        let tool_choice = match self.tool_choice {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(v) => v.to_string(),
        };
        // Chat: `logprobs` is a boolean, `top_logprobs` the alternatives.
        let logprobs =
            match &common.logprobs {
                None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => {
                    if common.top_logprobs.is_some() {
                        return Err(refuse("top_logprobs", "only with \"logprobs\": true"));
                    }
                    None
                }
                Some(serde_json::Value::Bool(true)) => Some(common.top_logprobs.unwrap_or(0)),
                Some(_) => return Err(refuse(
                    "logprobs",
                    "a boolean on /v1/chat/completions; give the alternatives as `top_logprobs`",
                )),
            };
        let mut request = pb::GenerateRequest {
            model: self.model,
            input: Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                messages,
            })),
            ..Default::default()
        };
        common.apply(&mut request);
        request.logprobs = logprobs;
        request.response_format = response_format;
        request.tools = tools;
        request.tool_choice = tool_choice;
        if let Some(max) = max_completion_tokens {
            request.max_tokens = max;
        }
        Ok(Parsed {
            request,
            more: Vec::new(),
            echo: Echo::Off,
            stream,
            include_usage,
        })
    }
}

fn streaming(common: &Common) -> (bool, bool) {
    (
        common.stream,
        common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: serde_json::Value) -> Result<Parsed, Refused> {
        let (own, common) = split_fields(body, CHAT_FIELDS)?;
        let common: Common = serde_json::from_value(common).map_err(|e| Refused {
            param: String::new(),
            message: e.to_string(),
        })?;
        let request: ChatRequest = serde_json::from_value(own).map_err(|e| Refused {
            param: String::new(),
            message: e.to_string(),
        })?;
        request.parse(common)
    }

    #[test]
    fn response_format_and_tools_become_the_proto_fields() {
        let parsed = chat(serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "seed": 3,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "city", "schema": {"type": "object"}, "strict": true}},
            "tools": [{"type": "function", "function": {"name": "weather"}}],
            "tool_choice": "required",
        }))
        .unwrap();
        let r = parsed.request;
        assert_eq!(r.sampling.and_then(|s| s.seed), Some(3));
        let format = r.response_format.unwrap();
        assert_eq!(format.r#type, pb::ResponseFormatType::JsonSchema as i32);
        assert_eq!((format.name.as_str(), format.strict), ("city", true));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&format.schema).unwrap(),
            serde_json::json!({"type": "object"})
        );
        assert_eq!(r.tool_choice, "\"required\"");
        assert!(r.tools.contains("weather"));
        let text = chat(serde_json::json!({
            "model": "m", "messages": [], "response_format": {"type": "text"},
        }))
        .unwrap();
        assert!(text.request.response_format.is_none());
        let bad = chat(serde_json::json!({
            "model": "m", "messages": [], "response_format": {"type": "yaml"},
        }))
        .unwrap_err();
        assert_eq!(bad.param, "response_format.type");
        let missing = chat(serde_json::json!({
            "model": "m", "messages": [], "response_format": {"type": "json_schema"},
        }))
        .unwrap_err();
        assert_eq!(missing.param, "response_format.json_schema");
        let tools =
            chat(serde_json::json!({"model": "m", "messages": [], "tools": {}})).unwrap_err();
        assert_eq!(tools.param, "tools");
    }
}
