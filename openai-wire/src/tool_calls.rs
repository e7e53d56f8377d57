//! A chat delta's `tool_calls`: `[{"index", "id"?, "type"?, "function"?:
//! {"name"?, "arguments"?}}]`, every field but `index` optional (OpenAI's
//! SDKs, vLLM's `DeltaToolCall`, llama-server's
//! `server_chat_msg_diff_to_json_oaicompat`): the first piece of a call
//! carries its `id`, `type` and `function.name`, every piece its `index`
//! and more of `function.arguments`. A collected answer's
//! `message.tool_calls` holds the whole calls, joined ([`Joined`]).

use crate::cut;
use serde_json::Value;
use tt_serving_proto::v1 as pb;

/// The pieces as a delta's `tool_calls`.
pub fn write(pieces: &[pb::ToolCallDelta]) -> Value {
    let calls: Vec<Value> = pieces
        .iter()
        .map(|c| {
            let mut call = serde_json::json!({ "index": c.index });
            let mut function = serde_json::json!({ "arguments": c.arguments });
            if !c.id.is_empty() {
                call["id"] = serde_json::json!(c.id);
                call["type"] = serde_json::json!("function");
            }
            if !c.name.is_empty() {
                function["name"] = serde_json::json!(c.name);
            }
            call["function"] = function;
            call
        })
        .collect();
    Value::Array(calls)
}

/// A delta's `tool_calls` (absent or null: none). A piece without an
/// index cannot be placed, so it fails the stream rather than being
/// dropped.
pub fn read(value: Option<&Value>) -> Result<Vec<pb::ToolCallDelta>, String> {
    let Some(list) = value.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = list.as_array().ok_or_else(|| {
        format!(
            "the engine sent delta.tool_calls that is not a list: {}",
            cut(&list.to_string(), 200)
        )
    })?;
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
    list.iter()
        .map(|call| {
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| {
                    format!(
                        "the engine sent a tool call piece without its index: {}",
                        cut(&call.to_string(), 200)
                    )
                })?;
            let function = call.get("function");
            Ok(pb::ToolCallDelta {
                index,
                id: text(call.get("id")),
                name: text(function.and_then(|f| f.get("name"))),
                arguments: text(function.and_then(|f| f.get("arguments"))),
            })
        })
        .collect()
}

/// The whole tool calls of a collected answer, joined from their pieces
/// by index: the first id and name given, the arguments concatenated.
#[derive(Debug, Default)]
pub struct Joined(std::collections::BTreeMap<u32, (String, String, String)>);

impl Joined {
    /// Adds a delta's pieces.
    pub fn add(&mut self, pieces: &[pb::ToolCallDelta]) {
        for p in pieces {
            let (id, name, arguments) = self.0.entry(p.index).or_default();
            if id.is_empty() {
                id.clone_from(&p.id);
            }
            if name.is_empty() {
                name.clone_from(&p.name);
            }
            arguments.push_str(&p.arguments);
        }
    }

    /// `message.tool_calls`, or `None` when the model called nothing.
    pub fn json(&self) -> Option<Value> {
        if self.0.is_empty() {
            return None;
        }
        Some(Value::Array(
            self.0
                .values()
                .map(|(id, name, arguments)| {
                    serde_json::json!({
                        "id": id,
                        "type": "function",
                        "function": { "name": name, "arguments": arguments },
                    })
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(index: u32, id: &str, name: &str, arguments: &str) -> pb::ToolCallDelta {
        pb::ToolCallDelta {
            index,
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_calls_first_piece_names_it_and_the_rest_carry_arguments() {
        assert_eq!(
            write(&[piece(0, "call-1", "weather", "")]),
            serde_json::json!([{
                "index": 0, "id": "call-1", "type": "function",
                "function": {"name": "weather", "arguments": ""},
            }])
        );
        assert_eq!(
            write(&[piece(0, "", "", "{\"city\"")]),
            serde_json::json!([{"index": 0, "function": {"arguments": "{\"city\""}}])
        );
    }

    #[test]
    fn what_the_door_writes_the_worker_reads_back() {
        let pieces = vec![
            piece(0, "call-1", "weather", "{\"ci"),
            piece(1, "", "", "ty\"}"),
        ];
        assert_eq!(read(Some(&write(&pieces))).unwrap(), pieces);
        assert_eq!(read(None).unwrap(), []);
        assert_eq!(read(Some(&Value::Null)).unwrap(), []);
        let unplaced = serde_json::json!([{"function": {"arguments": "x"}}]);
        assert!(read(Some(&unplaced))
            .unwrap_err()
            .contains("without its index"));
        assert!(read(Some(&serde_json::json!({})))
            .unwrap_err()
            .contains("not a list"));
    }

    #[test]
    fn collected_tool_calls_join_their_pieces_by_index() {
        let mut calls = Joined::default();
        assert_eq!(calls.json(), None);
        calls.add(&[piece(0, "a", "weather", "{\"ci")]);
        calls.add(&[piece(1, "b", "time", "{}"), piece(0, "", "", "ty\": 1}")]);
        assert_eq!(
            calls.json(),
            Some(serde_json::json!([
                {"id": "a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": 1}"}},
                {"id": "b", "type": "function", "function": {"name": "time", "arguments": "{}"}},
            ]))
        );
    }
}
