//! A chat request's `response_format`: `{"type": "text" | "json_object"}`
//! or `{"type": "json_schema", "json_schema": {"name", "description"?,
//! "schema"?, "strict"?}}`. The door reads it into the protocol's
//! `ResponseFormat` ([`ResponseFormat::read`]); tt-worker-openai writes
//! that back for its engine ([`ResponseFormat::write`]), which vLLM
//! (structured outputs) and llama-server (a grammar from the schema) both
//! take in OpenAI's shape.

use crate::request::{refuse, Refused};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tt_serving_proto::echo::echo;
use tt_serving_proto::v1 as pb;

/// `response_format`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema, with `"type": "json_schema"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<JsonSchema>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchema {
    /// The schema's name.
    pub name: String,
    /// What the output is for; OpenAI shows it to the model, our engines
    /// do not, so it is accepted and never sent on.
    #[serde(skip_serializing)]
    pub description: Option<String>,
    /// The JSON Schema itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// OpenAI's strict mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// Into the protocol's `ResponseFormat`; `None` for free text. A type
    /// or a combination OpenAI does not define is refused by name.
    pub fn read(self) -> Result<Option<pb::ResponseFormat>, Refused> {
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
                        echo(other)
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

    /// The protocol's format in OpenAI's shape: a schema with its name, the
    /// schema and `strict` always said; anything else `json_object` (free
    /// text is not asking, so it is not written: `parameters::requested`).
    /// `Err` names the field whose JSON text does not parse
    /// (`parameters::check` has refused that before).
    pub fn write(format: &pb::ResponseFormat) -> Result<ResponseFormat, String> {
        match pb::ResponseFormatType::try_from(format.r#type) {
            Ok(pb::ResponseFormatType::JsonSchema) => Ok(ResponseFormat {
                kind: "json_schema".into(),
                json_schema: Some(JsonSchema {
                    name: format.name.clone(),
                    description: None,
                    schema: Some(crate::request::json_text(
                        "response_format.schema",
                        &format.schema,
                    )?),
                    strict: Some(format.strict),
                }),
            }),
            _ => Ok(ResponseFormat {
                kind: "json_object".into(),
                json_schema: None,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(value: Value) -> Result<Option<pb::ResponseFormat>, Refused> {
        serde_json::from_value::<ResponseFormat>(value)
            .map_err(|e| refuse("response_format", &e.to_string()))?
            .read()
    }

    #[test]
    fn what_the_worker_writes_the_door_reads_back() {
        let formats = [
            pb::ResponseFormat {
                r#type: pb::ResponseFormatType::JsonSchema as i32,
                name: "city".into(),
                schema: r#"{"required":["name"],"type":"object"}"#.into(),
                strict: true,
            },
            pb::ResponseFormat {
                r#type: pb::ResponseFormatType::JsonSchema as i32,
                name: "loose".into(),
                schema: r#"{"type":"object"}"#.into(),
                strict: false,
            },
            pb::ResponseFormat {
                r#type: pb::ResponseFormatType::JsonObject as i32,
                ..Default::default()
            },
        ];
        for format in formats {
            let written = serde_json::to_value(ResponseFormat::write(&format).unwrap()).unwrap();
            assert_eq!(read(written).unwrap(), Some(format));
        }
    }

    #[test]
    fn the_engine_gets_openais_object() {
        let schema = pb::ResponseFormat {
            r#type: pb::ResponseFormatType::JsonSchema as i32,
            name: "city".into(),
            schema: r#"{"type":"object","required":["name"]}"#.into(),
            strict: true,
        };
        assert_eq!(
            serde_json::to_value(ResponseFormat::write(&schema).unwrap()).unwrap(),
            serde_json::json!({"type": "json_schema", "json_schema": {
                "name": "city", "schema": {"type": "object", "required": ["name"]}, "strict": true,
            }})
        );
        let bad = pb::ResponseFormat {
            schema: "{".into(),
            ..schema
        };
        assert!(ResponseFormat::write(&bad)
            .unwrap_err()
            .starts_with("response_format.schema: not valid JSON"));
    }

    #[test]
    fn the_door_refuses_what_openai_does_not_define_by_name() {
        let refused = |v: Value| read(v).unwrap_err().param;
        assert_eq!(
            refused(serde_json::json!({"type": "yaml"})),
            "response_format.type"
        );
        assert_eq!(
            refused(serde_json::json!({"type": "json_schema"})),
            "response_format.json_schema"
        );
        assert_eq!(
            refused(serde_json::json!({"type": "text", "json_schema": {"name": "x"}})),
            "response_format.json_schema"
        );
        assert!(read(serde_json::json!({"type": "text"})).unwrap().is_none());
        // A schema left out is any JSON object; the description is not sent.
        let described = read(serde_json::json!({"type": "json_schema", "json_schema": {
            "name": "n", "description": "for the model"}}))
        .unwrap()
        .unwrap();
        assert_eq!(described.schema, r#"{"type":"object"}"#);
        let again = serde_json::to_value(ResponseFormat::write(&described).unwrap()).unwrap();
        assert!(again["json_schema"].get("description").is_none());
    }
}
