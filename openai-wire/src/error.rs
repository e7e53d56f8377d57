//! An error in OpenAI's shape, `{"error": {"message", "type", "param",
//! "code"}}`: the door writes it ([`write`]) as an error answer's body and
//! as the event that ends a stream already started; tt-worker-openai reads
//! it ([`read`]) from its engine's stream and error answers, where older
//! vLLM also sends `{"object": "error", "message", "type", "code"}`.
//! OpenAI's `code` is a word (`invalid_api_key`); vLLM's is the HTTP
//! status, the only kind the reader keeps.

use crate::cut;
use serde_json::Value;

/// The error object: `message` what happened and what to do, `kind`
/// OpenAI's `type` (`invalid_request_error`), `param` the field at fault,
/// `code` OpenAI's word for the case; `param` and `code` null when absent.
pub fn write(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    serde_json::json!({
        "error": {
            "message": message,
            "type": kind,
            "param": param,
            "code": code,
        }
    })
}

/// An error an engine sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineError {
    /// Its message (the error's JSON, cut, when it has none).
    pub message: String,
    /// Its HTTP-style code, when given as a number.
    pub code: Option<u16>,
}

/// The error `value` is, in either shape; `None` when it is not one (a
/// null `error` is none).
pub fn read(value: &Value) -> Option<EngineError> {
    let error = match value.get("error") {
        Some(e) if !e.is_null() => e,
        _ if value.get("object").and_then(Value::as_str) == Some("error") => value,
        _ => return None,
    };
    let message = match error {
        Value::String(s) => s.clone(),
        e => e
            .get("message")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or_else(|| cut(&e.to_string(), 500)),
    };
    let code = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok());
    Some(EngineError { message, code })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_door_writes_reads_back_as_its_message() {
        let written = write(
            "model `m` has no slot that can serve this request now",
            "unavailable_error",
            None,
            None,
        );
        assert_eq!(
            written,
            serde_json::json!({"error": {
                "message": "model `m` has no slot that can serve this request now",
                "type": "unavailable_error", "param": null, "code": null,
            }})
        );
        let read_back = read(&written).unwrap();
        assert_eq!(
            read_back,
            EngineError {
                message: "model `m` has no slot that can serve this request now".into(),
                code: None
            }
        );
        // OpenAI's word for the case is not a status.
        let named = write(
            "no",
            "authentication_error",
            Some("model"),
            Some("invalid_api_key"),
        );
        assert_eq!(named["error"]["param"], "model");
        assert_eq!(read(&named).unwrap().code, None);
    }

    #[test]
    fn engines_errors_are_read_in_both_shapes() {
        let new: Value = serde_json::from_str(
            r#"{"error":{"message":"boom","type":"InternalServerError","code":500}}"#,
        )
        .unwrap();
        assert_eq!(
            read(&new),
            Some(EngineError {
                message: "boom".into(),
                code: Some(500)
            })
        );
        let old: Value = serde_json::from_str(
            r#"{"object":"error","message":"too long","type":"BadRequestError","code":400}"#,
        )
        .unwrap();
        assert_eq!(
            read(&old),
            Some(EngineError {
                message: "too long".into(),
                code: Some(400)
            })
        );
        let plain: Value = serde_json::from_str(r#"{"error":"out of memory"}"#).unwrap();
        assert_eq!(read(&plain).unwrap().message, "out of memory");
        let nameless: Value = serde_json::from_str(r#"{"error":{"code":503}}"#).unwrap();
        assert_eq!(read(&nameless).unwrap().message, r#"{"code":503}"#);
        let chunk: Value = serde_json::from_str(r#"{"choices":[],"error":null}"#).unwrap();
        assert_eq!(read(&chunk), None);
    }
}
