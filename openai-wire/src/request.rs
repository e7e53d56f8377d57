//! A request's body, `POST /v1/completions` and `/v1/chat/completions`:
//! what a client sends the door, and what tt-worker-openai sends its
//! engine, in one set of types. The door reads a body into the protocol's
//! `GenerateRequest` ([`read`]); the worker writes a `GenerateRequest` as a
//! body ([`write`]) that the door would read back into the same request.
//!
//! Reading is strict: an unknown field is refused by name, and a known
//! parameter the engines cannot honour is refused by name too (fail
//! closed: never ignored silently). Client input quoted in a refusal goes
//! through `tt_serving_proto::echo`, bounded.

use crate::response_format::ResponseFormat;
use crate::Endpoint;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tt_serving_proto::echo::echo;
use tt_serving_proto::v1 as pb;

/// A string or a list of strings (`prompt`, `stop`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and length parameters both endpoints share. Written, a
/// field that is `None` (or `stream` false) is left out, and the floats
/// are the decimals a person wrote (see [`decimal`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Common {
    /// Stream Server-Sent Events.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stream: bool,
    /// Streaming options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Tokens to generate at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Softmax temperature; 0 is greedy.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "decimal")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "decimal")]
    pub top_p: Option<f32>,
    /// Top-k sampling (vLLM's extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// The sampler's seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop strings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<OneOrMany>,
    /// Completions per prompt: only 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// The caller's end user, for the caller's own accounting; accepted
    /// and not used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// OpenAI's presence penalty, in [-2, 2].
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "decimal")]
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty, in [-2, 2].
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "decimal")]
    pub frequency_penalty: Option<f32>,
    /// vLLM's (Hugging Face's) repetition penalty; 1 is off.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "decimal")]
    pub repetition_penalty: Option<f32>,
    /// vLLM's: no end of sequence before this many tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// vLLM's: generate through end-of-sequence tokens (fixed output
    /// lengths for benchmarks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// vLLM's: token ids that end generation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Refused: see [`Common::refuse_unsupported`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<Value>,
    /// `/v1/completions`: an integer (the alternatives per token);
    /// `/v1/chat/completions`: a boolean, with `top_logprobs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    /// Chat: the alternatives per token, with `"logprobs": true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// vLLM's: the request's place in the queue when the model is
    /// saturated; lower is sooner, default 0. The daemon's router honours
    /// it (`GenerateRequest.priority`); the worker does not write it to an
    /// engine (vLLM refuses a priority unless its own scheduler was started
    /// with the priority policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// An f32 as the decimal a person wrote (0.9, not 0.8999999761581421,
/// which is what the f32 widened to an f64 would print); not finite is
/// null.
fn decimal<S: serde::Serializer>(x: &Option<f32>, s: S) -> Result<S::Ok, S::Error> {
    match x.map(|x| x.to_string().parse::<f64>()) {
        Some(Ok(x)) => s.serialize_f64(x),
        Some(Err(_)) | None => s.serialize_none(),
    }
}

/// `prompt` of `/v1/completions`: text or token ids, one prompt or a
/// batch (OpenAI's four forms; evaluation harnesses send token ids, in
/// batches).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text prompt.
    Text(String),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several text prompts.
    Texts(Vec<String>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

impl Prompt {
    /// Each prompt as the proto's input.
    fn inputs(self) -> Vec<pb::generate_request::Input> {
        use pb::generate_request::Input;
        let tokens = |ids| Input::PromptTokens(pb::PromptTokens { ids });
        match self {
            Prompt::Text(t) => vec![Input::Prompt(t)],
            // `[]`: no prompt at all, whichever list it was meant to be.
            Prompt::Tokens(ids) if ids.is_empty() => Vec::new(),
            Prompt::Tokens(ids) => vec![tokens(ids)],
            Prompt::Texts(v) => v.into_iter().map(Input::Prompt).collect(),
            Prompt::TokenLists(v) => v.into_iter().map(tokens).collect(),
        }
    }
}

/// `POST /v1/completions`: its own fields ([`Common`] is read separately).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// The model, as `/v1/models` lists it.
    pub model: String,
    /// The prompt or prompts.
    pub prompt: Prompt,
    /// Answer with the prompt before the completion (and its tokens'
    /// logprobs first when `logprobs` is given).
    #[serde(default, skip_serializing_if = "is_false")]
    pub echo: bool,
    /// Refused unless 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_of: Option<u32>,
    /// Refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
}

/// One chat message; `content` is text or a list of text parts.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (the router checks).
    pub role: String,
    /// The text.
    pub content: Content,
    /// A participant name; not used by the templates, refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Message content: a string, or parts of which only `text` ones are
/// supported.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts.
    Parts(Vec<ContentPart>),
}

/// A content part.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The model, as `/v1/models` lists it.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// The newer name of `max_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// JSON output (`GenerateRequest.response_format`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// The functions the model may call, passed on as JSON text
    /// (`GenerateRequest.tools`; the router checks their shape).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    /// `"none"`, `"auto"`, `"required"` or a named function, passed on as
    /// JSON text (`GenerateRequest.tool_choice`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
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
    "priority",
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
pub fn split_fields(body: Value, endpoint: &[&str]) -> Result<(Value, Value), Refused> {
    let Value::Object(fields) = body else {
        return Err(Refused {
            param: String::new(),
            message: "the body must be a JSON object".into(),
        });
    };
    let (mut own, mut common) = (Map::new(), Map::new());
    for (key, value) in fields {
        if endpoint.contains(&key.as_str()) {
            own.insert(key, value);
        } else if COMMON_FIELDS.contains(&key.as_str()) {
            common.insert(key, value);
        } else {
            let key = echo(&key);
            return Err(refuse(
                &key,
                "not a parameter this server knows; leave it out (it is never ignored silently)",
            ));
        }
    }
    Ok((own.into(), common.into()))
}

/// A refused request field: its name (the OpenAI error's `param`, empty
/// when the refusal is of the whole body) and why. The door answers it as
/// a 400 naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The field.
    pub param: String,
    /// What is wrong and what to do.
    pub message: String,
}

pub(crate) fn refuse(param: &str, why: &str) -> Refused {
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
        request.priority = self.priority.unwrap_or(0);
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

/// What the door's handlers need from a request it read.
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

/// A body (a JSON value) as the endpoint's request, or the field refused:
/// its fields split ([`split_fields`]), each part read with its struct (a
/// type error names the field's path), then checked as a whole.
pub fn read(body: Value, endpoint: Endpoint) -> Result<Parsed, Refused> {
    let fields = match endpoint {
        Endpoint::Completions => COMPLETION_FIELDS,
        Endpoint::Chat => CHAT_FIELDS,
    };
    let (own, common) = split_fields(body, fields)?;
    let typed = |e: serde_path_to_error::Error<serde_json::Error>| {
        let path = e.path().to_string();
        let param = if path == "." { String::new() } else { path };
        let message = if param.is_empty() {
            e.inner().to_string()
        } else {
            format!("{param}: {}", e.inner())
        };
        Refused { param, message }
    };
    let common: Common = serde_path_to_error::deserialize(common).map_err(typed)?;
    match endpoint {
        Endpoint::Completions => serde_path_to_error::deserialize::<_, CompletionRequest>(own)
            .map_err(typed)?
            .parse(common),
        Endpoint::Chat => serde_path_to_error::deserialize::<_, ChatRequest>(own)
            .map_err(typed)?
            .parse(common),
    }
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
            None | Some(Value::Null) => None,
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
                                    echo(&part.kind)
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
            Some(f) => f.read()?,
            None => None,
        };
        // Passed on as JSON text; `tt_serving_proto::parameters::check`
        // (the router's validation) names what is wrong inside, and the
        // router refuses them by name where the engine does not list
        // `tools`.
        let tools = match self.tools {
            None | Some(Value::Null) => String::new(),
            Some(v @ Value::Array(_)) => v.to_string(),
            Some(_) => return Err(refuse("tools", "give a list of tools")),
        };
        let tool_choice = match self.tool_choice {
            None | Some(Value::Null) => String::new(),
            Some(v) => v.to_string(),
        };
        // Chat: `logprobs` is a boolean, `top_logprobs` the alternatives.
        let logprobs =
            match &common.logprobs {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {
                    if common.top_logprobs.is_some() {
                        return Err(refuse("top_logprobs", "only with \"logprobs\": true"));
                    }
                    None
                }
                Some(Value::Bool(true)) => Some(common.top_logprobs.unwrap_or(0)),
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

/// The endpoint's own fields of a body being written.
#[derive(Debug, Clone, PartialEq)]
pub enum Own {
    /// `/v1/completions`.
    Completion(CompletionRequest),
    /// `/v1/chat/completions`.
    Chat(ChatRequest),
}

/// A body being written: the endpoint it goes to, its own fields and the
/// common ones. The writer of a request adds what is its own business
/// (streaming, a default `max_tokens`, the log-probabilities as its engine
/// counts them: [`Body::ask_logprobs`], [`Body::echo_prompt`]) before
/// [`Body::into_json`].
#[derive(Debug, Clone, PartialEq)]
pub struct Body {
    /// Where it goes.
    pub endpoint: Endpoint,
    /// The endpoint's own fields.
    pub own: Own,
    /// The fields both endpoints share.
    pub common: Common,
}

/// `request` as OpenAI's body for `model` (the engine's name for it): the
/// prompt or the messages, the length, sampling (absent sampling is greedy,
/// said out loud since OpenAI's default temperature is 1; `top_p` of 0 or
/// 1 and `top_k` of 0 are off, said by leaving them out, since engines
/// differ in which values they take as off) and every optional parameter
/// the request asks for (`parameters::requested`) under its own name.
/// Log-probabilities are left to the writer ([`Body::ask_logprobs`]).
/// `Err` is an `INVALID_ARGUMENT` message naming the field.
pub fn write(request: &pb::GenerateRequest, model: &str) -> Result<Body, String> {
    use pb::generate_request::Input;
    let mut own = match &request.input {
        Some(Input::Prompt(p)) => Own::Completion(completion(model, Prompt::Text(p.clone()))),
        Some(Input::PromptTokens(t)) => {
            if t.ids.is_empty() {
                return Err("prompt_tokens.ids is empty; give at least one token".into());
            }
            Own::Completion(completion(model, Prompt::Tokens(t.ids.clone())))
        }
        Some(Input::Chat(c)) => {
            if c.messages.is_empty() {
                return Err("chat.messages is empty; give at least one message".into());
            }
            Own::Chat(ChatRequest {
                model: model.to_string(),
                messages: c
                    .messages
                    .iter()
                    .map(|m| ChatMessage {
                        role: m.role.clone(),
                        content: Content::Text(m.content.clone()),
                        name: None,
                    })
                    .collect(),
                max_completion_tokens: None,
                response_format: None,
                tools: None,
                tool_choice: None,
            })
        }
        None => return Err("request has neither `prompt` nor `chat`".into()),
    };
    let endpoint = match own {
        Own::Completion(_) => Endpoint::Completions,
        Own::Chat(_) => Endpoint::Chat,
    };
    let mut common = Common {
        max_tokens: (request.max_tokens != 0).then_some(request.max_tokens),
        ..Default::default()
    };
    let sampling = request.sampling.unwrap_or_default();
    if !sampling.temperature.is_finite() || sampling.temperature < 0.0 {
        return Err(format!(
            "sampling.temperature must be >= 0, got {}",
            sampling.temperature
        ));
    }
    if !(0.0..=1.0).contains(&sampling.top_p) {
        return Err(format!(
            "sampling.top_p must be within [0, 1], got {}",
            sampling.top_p
        ));
    }
    common.temperature = Some(sampling.temperature);
    if sampling.top_p > 0.0 && sampling.top_p < 1.0 {
        common.top_p = Some(sampling.top_p);
    }
    if sampling.top_k > 0 {
        common.top_k = Some(sampling.top_k);
    }
    if !request.stop.is_empty() {
        common.stop = Some(OneOrMany::Many(request.stop.clone()));
    }
    use tt_serving_proto::parameters as p;
    p::check(request)?;
    for name in p::requested(request) {
        match name {
            p::PRESENCE_PENALTY => common.presence_penalty = Some(request.presence_penalty),
            p::FREQUENCY_PENALTY => common.frequency_penalty = Some(request.frequency_penalty),
            p::REPETITION_PENALTY => common.repetition_penalty = Some(request.repetition_penalty),
            p::MIN_TOKENS => common.min_tokens = Some(request.min_tokens),
            p::IGNORE_EOS => common.ignore_eos = Some(true),
            p::STOP_TOKEN_IDS => common.stop_token_ids = Some(request.stop_token_ids.clone()),
            p::SEED => common.seed = sampling.seed,
            p::RESPONSE_FORMAT | p::TOOLS => {
                // `parameters::check` allows them on chat input only.
                let Own::Chat(chat) = &mut own else {
                    return Err(format!("{name}: only for chat input"));
                };
                if name == p::TOOLS {
                    if !request.tool_choice.is_empty() {
                        chat.tool_choice = Some(json_text("tool_choice", &request.tool_choice)?);
                    }
                    chat.tools = Some(json_text(p::TOOLS, &request.tools)?);
                } else if let Some(format) = &request.response_format {
                    chat.response_format = Some(ResponseFormat::write(format)?);
                }
            }
            // The prompt above, as ids; the log-probabilities are the
            // writer's ([`Body::ask_logprobs`]).
            _ => {}
        }
    }
    Ok(Body {
        endpoint,
        own,
        common,
    })
}

fn completion(model: &str, prompt: Prompt) -> CompletionRequest {
    CompletionRequest {
        model: model.to_string(),
        prompt,
        echo: false,
        best_of: None,
        suffix: None,
    }
}

/// A JSON text field parsed for a body.
pub(crate) fn json_text(field: &str, text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{field}: not valid JSON ({e})"))
}

impl Body {
    /// Asks for `alternatives` log-probabilities per token in the
    /// endpoint's shape: completions' `logprobs` is the number, chat's is
    /// `true` with the number as `top_logprobs`.
    pub fn ask_logprobs(&mut self, alternatives: u32) {
        match self.endpoint {
            Endpoint::Completions => {
                self.common.logprobs = Some(Value::from(alternatives));
            }
            Endpoint::Chat => {
                self.common.logprobs = Some(Value::Bool(true));
                self.common.top_logprobs = Some(alternatives);
            }
        }
    }

    /// Asks for the prompt back (`echo`, with its tokens' logprobs when
    /// [`Body::ask_logprobs`] asked for them); with `prompt_only`,
    /// `max_tokens: 0`: the prompt scored and nothing generated. OpenAI's
    /// chat has no `echo`: `Err` on a chat.
    pub fn echo_prompt(&mut self, prompt_only: bool) -> Result<(), String> {
        let Own::Completion(completion) = &mut self.own else {
            return Err("echo: only for a prompt (/v1/completions), not a chat".into());
        };
        completion.echo = true;
        if prompt_only {
            self.common.max_tokens = Some(0);
        }
        Ok(())
    }

    /// The body as one JSON object: the endpoint's own fields and the
    /// common ones.
    pub fn into_json(self) -> Result<Map<String, Value>, String> {
        let own = match self.own {
            Own::Completion(c) => serde_json::to_value(c),
            Own::Chat(c) => serde_json::to_value(c),
        };
        let fields = |v: Result<Value, serde_json::Error>| match v {
            Ok(Value::Object(map)) => Ok(map),
            Ok(other) => Err(format!("the request body wrote as {other}, not an object")),
            Err(e) => Err(format!("the request body could not be written: {e}")),
        };
        let mut body = fields(own)?;
        body.extend(fields(serde_json::to_value(self.common))?);
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<Parsed, Refused> {
        read(body, Endpoint::Chat)
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
            serde_json::from_str::<Value>(&format.schema).unwrap(),
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

    #[test]
    fn unknown_fields_and_what_no_engine_honours_are_refused_by_name() {
        let refused = |endpoint, body: Value| read(body, endpoint).unwrap_err();
        let r = refused(
            Endpoint::Chat,
            serde_json::json!({"model": "m", "messages": [], "return_token_ids": true}),
        );
        assert_eq!(r.param, "return_token_ids");
        assert!(
            r.message.contains("never ignored silently"),
            "{}",
            r.message
        );
        // A field of the other endpoint is unknown here.
        let r = refused(
            Endpoint::Completions,
            serde_json::json!({"model": "m", "prompt": "x", "messages": []}),
        );
        assert_eq!(r.param, "messages");
        let r = refused(
            Endpoint::Completions,
            serde_json::json!({"model": "m", "prompt": "x", "logit_bias": {}}),
        );
        assert_eq!(r.param, "logit_bias");
        // A type error names the field's path.
        let r = refused(
            Endpoint::Chat,
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": 7}]}),
        );
        assert!(r.param.starts_with("messages[0]"), "{r:?}");
        let r = refused(Endpoint::Chat, serde_json::json!([1]));
        assert_eq!(
            (r.param.as_str(), r.message.as_str()),
            ("", "the body must be a JSON object")
        );
    }

    fn user(text: &str) -> Option<pb::generate_request::Input> {
        Some(pb::generate_request::Input::Chat(pb::ChatMessages {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: text.into(),
            }],
        }))
    }

    /// Written as the worker writes it (the logprobs as asked), read as the
    /// door reads it.
    fn round_trip(request: &pb::GenerateRequest) -> pb::GenerateRequest {
        let mut body = write(request, &request.model).unwrap();
        let most = request
            .logprobs
            .into_iter()
            .chain(request.prompt_logprobs)
            .max();
        if let Some(n) = most {
            body.ask_logprobs(n);
        }
        if request.prompt_logprobs.is_some() {
            body.echo_prompt(request.prompt_only).unwrap();
        }
        let endpoint = body.endpoint;
        let json = Value::Object(body.into_json().unwrap());
        // Through the bytes, as it travels.
        let json: Value = serde_json::from_str(&json.to_string()).unwrap();
        read(json, endpoint).unwrap().request
    }

    #[test]
    fn what_the_worker_writes_the_door_reads_back_into_the_same_request() {
        let sampled = pb::SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 40,
            seed: Some(11),
        };
        let requests = [
            pb::GenerateRequest {
                input: Some(pb::generate_request::Input::Prompt("the cat".into())),
                sampling: Some(pb::SamplingParams::default()),
                ..Default::default()
            },
            pb::GenerateRequest {
                model: "m".into(),
                input: Some(pb::generate_request::Input::PromptTokens(
                    pb::PromptTokens { ids: vec![1, 2, 3] },
                )),
                max_tokens: 7,
                sampling: Some(sampled),
                stop: vec!["\n".into(), "END".into()],
                presence_penalty: 0.5,
                frequency_penalty: -0.25,
                repetition_penalty: 1.1,
                min_tokens: 2,
                ignore_eos: true,
                stop_token_ids: vec![7, 9],
                logprobs: Some(3),
                ..Default::default()
            },
            // lm-eval's log-likelihood: the prompt scored, one token more.
            pb::GenerateRequest {
                model: "m".into(),
                input: Some(pb::generate_request::Input::Prompt("x".into())),
                max_tokens: 1,
                sampling: Some(pb::SamplingParams::default()),
                logprobs: Some(1),
                prompt_logprobs: Some(1),
                ..Default::default()
            },
            // The prompt scored alone.
            pb::GenerateRequest {
                model: "m".into(),
                input: Some(pb::generate_request::Input::Prompt("x".into())),
                sampling: Some(pb::SamplingParams::default()),
                prompt_logprobs: Some(0),
                prompt_only: true,
                ..Default::default()
            },
            pb::GenerateRequest {
                model: "m".into(),
                input: user("where?"),
                sampling: Some(sampled),
                logprobs: Some(2),
                response_format: Some(pb::ResponseFormat {
                    r#type: pb::ResponseFormatType::JsonSchema as i32,
                    name: "city".into(),
                    schema: r#"{"required":["name"],"type":"object"}"#.into(),
                    strict: true,
                }),
                tools: r#"[{"function":{"name":"weather"},"type":"function"}]"#.into(),
                tool_choice: r#"{"function":{"name":"weather"},"type":"function"}"#.into(),
                ..Default::default()
            },
            pb::GenerateRequest {
                model: "m".into(),
                input: user("{}"),
                sampling: Some(pb::SamplingParams::default()),
                response_format: Some(pb::ResponseFormat {
                    r#type: pb::ResponseFormatType::JsonObject as i32,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        for request in requests {
            assert_eq!(round_trip(&request), request, "{request:?}");
        }
    }

    #[test]
    fn floats_are_written_as_the_decimals_a_person_wrote() {
        let request = pb::GenerateRequest {
            input: user("hi"),
            sampling: Some(pb::SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                ..Default::default()
            }),
            presence_penalty: 0.1,
            ..Default::default()
        };
        let json = Value::Object(write(&request, "m").unwrap().into_json().unwrap()).to_string();
        assert!(json.contains(r#""temperature":0.9,"#), "{json}");
        assert!(json.contains(r#""top_p":0.95"#), "{json}");
        assert!(json.contains(r#""presence_penalty":0.1,"#), "{json}");
        // Greedy is said out loud; off is left out.
        let greedy = write(
            &pb::GenerateRequest {
                input: user("hi"),
                ..Default::default()
            },
            "m",
        )
        .unwrap()
        .into_json()
        .unwrap();
        assert_eq!(
            Value::Object(greedy),
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0.0})
        );
    }

    #[test]
    fn a_chat_has_no_echo() {
        let mut body = write(
            &pb::GenerateRequest {
                input: user("hi"),
                ..Default::default()
            },
            "m",
        )
        .unwrap();
        assert!(body.echo_prompt(false).is_err());
    }
}
