//! Reading the engine's load from its Prometheus endpoint (`/metrics`).
//!
//! vLLM exports `vllm:num_requests_running` and `vllm:num_requests_waiting`
//! (one series per engine and model, summed here); llama-server exports
//! `llamacpp:requests_processing` and `llamacpp:requests_deferred` when
//! started with `--metrics` (without it `/metrics` answers 501, and the
//! worker falls back to counting its own requests).

/// The sum of every sample of `name` (any labels) in a text exposition;
/// `None` when the metric is absent.
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        // `name{labels} value [timestamp]` or `name value [timestamp]`; a
        // longer metric that merely starts with `name` does not count.
        let rest = match rest.chars().next() {
            Some('{') => match rest.find('}') {
                Some(end) => &rest[end + 1..],
                None => continue,
            },
            Some(c) if c.is_whitespace() => rest,
            _ => continue,
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if value.is_finite() {
            *found.get_or_insert(0.0) += value;
        }
    }
    found
}

/// A gauge as a count.
pub fn count(text: &str, name: &str) -> Option<u32> {
    gauge(text, name).map(|v| v.max(0.0).round().min(u32::MAX as f64) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 2.0
vllm:num_requests_running{engine="1",model_name="qwen"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 9.0
"#;

    #[test]
    fn series_are_summed_and_longer_names_ignored() {
        assert_eq!(count(VLLM, "vllm:num_requests_running"), Some(3));
        assert_eq!(count(VLLM, "vllm:num_requests_waiting"), Some(3));
        assert_eq!(count(VLLM, "vllm:absent"), None);
    }

    #[test]
    fn llama_server_gauges_have_no_labels() {
        let text = "# HELP llamacpp:requests_processing Number of requests processing.\n# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n";
        assert_eq!(count(text, "llamacpp:requests_processing"), Some(1));
        assert_eq!(count(text, "llamacpp:requests_deferred"), Some(0));
    }
}
