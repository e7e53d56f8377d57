//! The optional `GenerateRequest` parameters: the names an engine lists in
//! `InfoResponse.supported_parameters`, which of them a request asks for,
//! and the engine-independent rules of the JSON-carrying ones
//! (`response_format`, `tools`). The daemon refuses a request asking for
//! one its engine does not list, so both sides read "asked for" from this
//! one function.

use crate::v1::{GenerateRequest, ResponseFormatType};
use serde_json::Value;

/// `presence_penalty`.
pub const PRESENCE_PENALTY: &str = "presence_penalty";
/// `frequency_penalty`.
pub const FREQUENCY_PENALTY: &str = "frequency_penalty";
/// `repetition_penalty`.
pub const REPETITION_PENALTY: &str = "repetition_penalty";
/// `min_tokens`.
pub const MIN_TOKENS: &str = "min_tokens";
/// `ignore_eos`.
pub const IGNORE_EOS: &str = "ignore_eos";
/// `stop_token_ids`.
pub const STOP_TOKEN_IDS: &str = "stop_token_ids";
/// `logprobs`.
pub const LOGPROBS: &str = "logprobs";
/// `seed`: `SamplingParams.seed`. An engine lists it only if the same seed
/// really gives the same sampled output.
pub const SEED: &str = "seed";
/// `response_format`: JSON output by the engine's guided decoding.
pub const RESPONSE_FORMAT: &str = "response_format";
/// `tools`: with `tool_choice`.
pub const TOOLS: &str = "tools";
/// `prompt_tokens`: a prompt given as token ids.
pub const PROMPT_TOKENS: &str = "prompt_tokens";
/// `prompt_logprobs`: the prompt's log-probabilities (with `prompt_only`).
pub const PROMPT_LOGPROBS: &str = "prompt_logprobs";

/// Every optional parameter, in field order (the names are the proto
/// field names).
pub const OPTIONAL_PARAMETERS: [&str; 12] = [
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    REPETITION_PENALTY,
    MIN_TOKENS,
    IGNORE_EOS,
    STOP_TOKEN_IDS,
    LOGPROBS,
    SEED,
    RESPONSE_FORMAT,
    TOOLS,
    PROMPT_TOKENS,
    PROMPT_LOGPROBS,
];

/// The optional parameters `request` asks for, in field order. A value
/// that means "off" is not asking: 0 for the penalties, min_tokens and
/// ignore_eos, also 1 for `repetition_penalty`, an empty `stop_token_ids`,
/// an absent `logprobs` or seed, a free-text `response_format`, and no
/// tools or tool choice (a NaN penalty is asking, so that it
/// reaches a check that refuses it).
pub fn requested(request: &GenerateRequest) -> Vec<&'static str> {
    let mut asked = Vec::new();
    let mut ask = |on: bool, name: &'static str| {
        if on {
            asked.push(name);
        }
    };
    ask(request.presence_penalty != 0.0, PRESENCE_PENALTY);
    ask(request.frequency_penalty != 0.0, FREQUENCY_PENALTY);
    ask(
        request.repetition_penalty != 0.0 && request.repetition_penalty != 1.0,
        REPETITION_PENALTY,
    );
    ask(request.min_tokens != 0, MIN_TOKENS);
    ask(request.ignore_eos, IGNORE_EOS);
    ask(!request.stop_token_ids.is_empty(), STOP_TOKEN_IDS);
    ask(request.logprobs.is_some(), LOGPROBS);
    ask(request.sampling.is_some_and(|s| s.seed.is_some()), SEED);
    ask(response_format(request).is_some(), RESPONSE_FORMAT);
    ask(asks_for_tools(request), TOOLS);
    ask(
        matches!(
            request.input,
            Some(crate::v1::generate_request::Input::PromptTokens(_))
        ),
        PROMPT_TOKENS,
    );
    ask(
        request.prompt_logprobs.is_some() || request.prompt_only,
        PROMPT_LOGPROBS,
    );
    asked
}

/// The response format asked for, if any (free text is none).
pub fn response_format(request: &GenerateRequest) -> Option<ResponseFormatType> {
    let format = request.response_format.as_ref()?;
    match ResponseFormatType::try_from(format.r#type) {
        Ok(ResponseFormatType::Unspecified) => None,
        Ok(t) => Some(t),
        // An unknown type is asking for something: it reaches `check`,
        // which refuses it by name.
        Err(_) => Some(ResponseFormatType::Unspecified),
    }
}

fn asks_for_tools(request: &GenerateRequest) -> bool {
    !request.tools.is_empty() || !request.tool_choice.is_empty()
}

/// The engine-independent rules of `response_format`, `tools` and
/// `tool_choice`: chat input only, the JSON texts parse and have OpenAI's
/// shape (so an engine never sees half a request), `tool_choice` only with
/// tools and naming one of them. `Err` is an INVALID_ARGUMENT message
/// starting with the field's name and saying what to send instead. The
/// daemon's router and tt-worker-openai both run it.
pub fn check(request: &GenerateRequest) -> Result<(), String> {
    let chat = matches!(
        request.input,
        Some(crate::v1::generate_request::Input::Chat(_))
    );
    if let Some(format) = &request.response_format {
        match ResponseFormatType::try_from(format.r#type) {
            Ok(ResponseFormatType::Unspecified) => {}
            Ok(_) if !chat => {
                return Err(format!(
                    "{RESPONSE_FORMAT}: only for chat input (OpenAI's chat completions); send the prompt as a chat message"
                ))
            }
            Ok(ResponseFormatType::JsonObject) => {}
            Ok(ResponseFormatType::JsonSchema) => {
                let name = &format.name;
                if name.is_empty()
                    || name.len() > 64
                    || !name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                {
                    return Err(format!(
                        "{RESPONSE_FORMAT}.name: give the schema a name of 1 to 64 letters, digits, `_` or `-` (OpenAI's json_schema.name)"
                    ));
                }
                match serde_json::from_str::<Value>(&format.schema) {
                    Ok(Value::Object(_)) => {}
                    Ok(_) => {
                        return Err(format!(
                            "{RESPONSE_FORMAT}.schema: the JSON Schema must be a JSON object"
                        ))
                    }
                    Err(e) => {
                        return Err(format!(
                            "{RESPONSE_FORMAT}.schema: not valid JSON ({e}); give the JSON Schema as JSON text"
                        ))
                    }
                }
            }
            Err(_) => {
                return Err(format!(
                    "{RESPONSE_FORMAT}.type: {} is not a known format; use json_object or json_schema",
                    format.r#type
                ))
            }
        }
    }
    let tools = if request.tools.is_empty() {
        None
    } else {
        if !chat {
            return Err(format!(
                "{TOOLS}: only for chat input (OpenAI's chat completions); send the prompt as a chat message"
            ));
        }
        Some(tool_names(&request.tools)?)
    };
    if !request.tool_choice.is_empty() {
        let Some(names) = &tools else {
            return Err("tool_choice: only with `tools`; give the tools or leave it out".into());
        };
        check_tool_choice(&request.tool_choice, names)?;
    }
    Ok(())
}

/// The function names of a `tools` JSON text, checked to be OpenAI's
/// shape: a non-empty array of `{"type": "function", "function": {"name":
/// ...}}` with distinct names.
fn tool_names(tools: &str) -> Result<Vec<String>, String> {
    let value: Value = serde_json::from_str(tools)
        .map_err(|e| format!("{TOOLS}: not valid JSON ({e}); give OpenAI's array of tools"))?;
    let Value::Array(list) = value else {
        return Err(format!(
            "{TOOLS}: must be a JSON array of tools (`[{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}]`)"
        ));
    };
    if list.is_empty() {
        return Err(format!(
            "{TOOLS}: the array is empty; give tools or leave it out"
        ));
    }
    let mut names = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(format!(
                "{TOOLS}[{i}].type: only `function` tools are supported"
            ));
        }
        let name = tool
            .pointer("/function/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| format!("{TOOLS}[{i}].function.name: give the function's name"))?;
        if let Some(p) = tool.pointer("/function/parameters") {
            if !p.is_object() {
                return Err(format!(
                    "{TOOLS}[{i}].function.parameters: must be a JSON Schema object"
                ));
            }
        }
        if names.iter().any(|n| n == name) {
            return Err(format!(
                "{TOOLS}[{i}].function.name: `{}` is given twice; names must be distinct",
                cut(name)
            ));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

fn check_tool_choice(choice: &str, names: &[String]) -> Result<(), String> {
    let value: Value = serde_json::from_str(choice).map_err(|e| {
        format!("tool_choice: not valid JSON ({e}); give \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
    })?;
    match &value {
        Value::String(s) if ["none", "auto", "required"].contains(&s.as_str()) => Ok(()),
        Value::Object(_) => {
            let name = value
                .pointer("/function/name")
                .and_then(Value::as_str)
                .filter(|_| value.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    "tool_choice: a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}".to_string()
                })?;
            if names.iter().any(|n| n == name) {
                Ok(())
            } else {
                Err(format!(
                    "tool_choice.function.name: `{}` is not one of the tools given",
                    cut(name)
                ))
            }
        }
        _ => Err(
            "tool_choice: give \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"
                .into(),
        ),
    }
}

/// A client's string in an error, at most 64 bytes.
fn cut(s: &str) -> String {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = s[..end]
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if end < s.len() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{self as pb, generate_request::Input};

    fn chat() -> GenerateRequest {
        GenerateRequest {
            input: Some(Input::Chat(pb::ChatMessages {
                messages: vec![pb::ChatMessage {
                    role: "user".into(),
                    content: "hi".into(),
                }],
            })),
            ..Default::default()
        }
    }

    const WEATHER: &str =
        r#"[{"type":"function","function":{"name":"weather","parameters":{"type":"object"}}}]"#;

    #[test]
    fn off_values_ask_for_nothing_and_each_field_names_itself() {
        assert!(requested(&GenerateRequest::default()).is_empty());
        let off = GenerateRequest {
            repetition_penalty: 1.0,
            n: 1,
            sampling: Some(pb::SamplingParams {
                temperature: 1.0,
                ..Default::default()
            }),
            response_format: Some(pb::ResponseFormat::default()),
            ..Default::default()
        };
        assert!(requested(&off).is_empty());
        let all = GenerateRequest {
            presence_penalty: 0.5,
            frequency_penalty: -0.5,
            repetition_penalty: f32::NAN,
            min_tokens: 3,
            ignore_eos: true,
            stop_token_ids: vec![2],
            logprobs: Some(0),
            sampling: Some(pb::SamplingParams {
                seed: Some(0),
                ..Default::default()
            }),
            response_format: Some(pb::ResponseFormat {
                r#type: ResponseFormatType::JsonObject as i32,
                ..Default::default()
            }),
            tools: WEATHER.into(),
            input: Some(pb::generate_request::Input::PromptTokens(
                pb::PromptTokens { ids: vec![1, 2] },
            )),
            prompt_logprobs: Some(0),
            ..Default::default()
        };
        assert_eq!(requested(&all), OPTIONAL_PARAMETERS.to_vec());
    }

    #[test]
    fn json_fields_are_checked_with_the_field_named() {
        let with = |f: &dyn Fn(&mut GenerateRequest)| {
            let mut r = chat();
            f(&mut r);
            check(&r)
        };
        assert_eq!(with(&|r| r.tools = WEATHER.into()), Ok(()));
        let e = with(&|r| r.tools = "[{".into()).unwrap_err();
        assert!(e.starts_with("tools: not valid JSON"), "{e}");
        let e = with(&|r| r.tools = r#"[{"type":"retrieval"}]"#.into()).unwrap_err();
        assert!(e.starts_with("tools[0].type"), "{e}");
        let e = with(&|r| r.tool_choice = r#""auto""#.into()).unwrap_err();
        assert!(e.starts_with("tool_choice: only with `tools`"), "{e}");
        let e = with(&|r| {
            r.tools = WEATHER.into();
            r.tool_choice = r#"{"type":"function","function":{"name":"time"}}"#.into();
        })
        .unwrap_err();
        assert!(e.starts_with("tool_choice.function.name: `time`"), "{e}");
        assert_eq!(
            with(&|r| {
                r.tools = WEATHER.into();
                r.tool_choice = r#""required""#.into();
            }),
            Ok(())
        );
        let schema = |schema: &str| pb::ResponseFormat {
            r#type: ResponseFormatType::JsonSchema as i32,
            name: "answer".into(),
            schema: schema.into(),
            strict: true,
        };
        assert_eq!(
            with(&|r| r.response_format = Some(schema(r#"{"type":"object"}"#))),
            Ok(())
        );
        let e = with(&|r| r.response_format = Some(schema("{nope"))).unwrap_err();
        assert!(
            e.starts_with("response_format.schema: not valid JSON"),
            "{e}"
        );
        let e = with(&|r| r.response_format = Some(schema("[1]"))).unwrap_err();
        assert!(
            e.starts_with("response_format.schema: the JSON Schema must be"),
            "{e}"
        );
        let e = with(&|r| {
            r.response_format = Some(pb::ResponseFormat {
                name: String::new(),
                ..schema("{}")
            })
        })
        .unwrap_err();
        assert!(e.starts_with("response_format.name"), "{e}");
        let prompt = GenerateRequest {
            input: Some(Input::Prompt("x".into())),
            tools: WEATHER.into(),
            ..Default::default()
        };
        assert!(check(&prompt)
            .unwrap_err()
            .starts_with("tools: only for chat input"));
    }
}
