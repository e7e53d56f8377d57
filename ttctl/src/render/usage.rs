//! `ttctl usage`: one row per API key and model.

use tt_serving_proto::v1::KeyUsage;

use super::{or_dash, Table};

/// A table of what each key used of each model (`-`: requests for a
/// model that is not configured), or a line saying there is nothing yet.
pub fn usage_table(usage: &[KeyUsage]) -> String {
    if usage.is_empty() {
        return "no usage recorded (the daemon writes its ledger every 2 s)\n".to_string();
    }
    let mut table = Table::new(&[
        "KEY",
        "MODEL",
        "REQUESTS",
        "PROMPT",
        "CACHED",
        "COMPLETION",
        "REFUSED",
        "ERRORS",
        "STALLED",
    ]);
    for u in usage {
        table.row(vec![
            u.key.clone(),
            or_dash(&u.model).to_string(),
            u.requests.to_string(),
            u.prompt_tokens.to_string(),
            u.cached_prompt_tokens.to_string(),
            u.completion_tokens.to_string(),
            u.refused.to_string(),
            u.errors.to_string(),
            u.stalled.to_string(),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_key_and_model() {
        let text = usage_table(&[KeyUsage {
            key: "team-a".into(),
            model: "llama".into(),
            requests: 3,
            prompt_tokens: 30,
            cached_prompt_tokens: 12,
            completion_tokens: 45,
            refused: 1,
            errors: 0,
            stalled: 2,
        }]);
        assert!(text.starts_with("KEY"), "{text}");
        assert!(text.contains("team-a"), "{text}");
        assert!(text.contains("45"), "{text}");
        assert!(usage_table(&[]).contains("no usage"));
    }
}
