//! The rules that span fields of a typed [`Config`] (the TOML reader,
//! `read.rs`, types it). Every check pushes a [`Problem`] and goes on, so
//! one run of `check-config` shows everything that needs fixing.

use super::problem::{problem, Problem};
use super::schema::*;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

/// Environment variables the daemon sets for every worker; a model may not
/// override them through flags or env tables.
pub const RESERVED_ENV: &[&str] = tt_worker_contract::names::RESERVED;

/// Normalise a PCI address: lower case, domain added when missing.
/// Returns None when `s` is not a BDF.
pub fn parse_bdf(s: &str) -> Option<String> {
    let s = s.trim().to_ascii_lowercase();
    let full = if s.matches(':').count() == 1 {
        format!("0000:{s}")
    } else {
        s
    };
    let (domain, rest) = full.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |p: &str, n: usize| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit());
    let function_ok = function.len() == 1 && matches!(function.as_bytes()[0], b'0'..=b'7');
    (hex(domain, 4) && hex(bus, 2) && hex(device, 2) && function_ok).then_some(full)
}

pub(crate) fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The longest model name a config may give; a request naming a longer one
/// cannot name a served model and is refused before any lookup.
pub const MAX_MODEL_NAME_BYTES: usize = 64;

fn is_model_name(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= MAX_MODEL_NAME_BYTES
        && matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Check a range; zero and absurd values are both configuration mistakes.
fn range(problems: &mut Vec<Problem>, key: &str, value: u64, min: u64, max: u64, unit: &str) {
    if value < min || value > max {
        problems.push(problem(
            key,
            format!("{value} {unit} is out of range; use a value from {min} to {max} {unit}"),
        ));
    }
}

fn absolute(problems: &mut Vec<Problem>, key: &str, path: &Path) {
    if !path.is_absolute() {
        problems.push(problem(
            key,
            format!(
                "`{}` is a relative path; use an absolute path so the daemon does not depend on its working directory",
                path.display()
            ),
        ));
    }
}

/// Every cross-field rule.
pub(super) fn check(config: &Config) -> Vec<Problem> {
    let mut problems = Vec::new();
    check_daemon(&config.daemon, &mut problems);
    check_hardware(&config.hardware, &mut problems);
    check_reset(&config.reset, &mut problems);
    check_inference(&config.inference, &mut problems);
    check_limits(&config.limits, &mut problems);
    check_openai_connections(&config.openai, &mut problems);
    range(
        &mut problems,
        "host.ram_floor_mib",
        config.host.ram_floor_mib,
        0,
        16 * 1024 * 1024,
        "MiB",
    );
    if !config.metrics.listen.is_empty() && config.metrics.listen.parse::<SocketAddr>().is_err() {
        problems.push(problem(
            "metrics.listen",
            format!(
                "`{}` is not an IP address and port; use e.g. \"127.0.0.1:9464\", or \"\" to turn the endpoint off",
                config.metrics.listen
            ),
        ));
    }
    if !config.tracing.otlp_endpoint.is_empty() {
        if let Err(why) = tt_serving_telemetry::check_endpoint(&config.tracing.otlp_endpoint) {
            problems.push(problem(
                "tracing.otlp_endpoint",
                format!(
                    "`{}`: {why}; or \"\" to turn traces off",
                    config.tracing.otlp_endpoint
                ),
            ));
        }
    }
    if !config.openai.listen.is_empty() {
        match config.openai.listen.parse::<SocketAddr>() {
            Err(_) => problems.push(problem(
                "openai.listen",
                format!(
                    "`{}` is not an IP address and port; use e.g. \"127.0.0.1:8000\", or \"\" to turn the OpenAI front door off",
                    config.openai.listen
                ),
            )),
            Ok(address) if address.port() != 0 => {
                for (key, other) in [
                    ("daemon.listen", &config.daemon.listen),
                    ("metrics.listen", &config.metrics.listen),
                ] {
                    if other.parse::<SocketAddr>().is_ok_and(|o| o == address) {
                        problems.push(problem(
                            "openai.listen",
                            format!("{address} is also {key}; give the OpenAI front door its own port"),
                        ));
                    }
                }
            }
            Ok(_) => {}
        }
    }
    // Which model key first claimed each card, to report cards used twice.
    let mut claimed: BTreeMap<String, String> = BTreeMap::new();
    for (name, model) in &config.models {
        check_model(name, model, &mut claimed, &mut problems);
        if let (Some(max), Some((context, option))) =
            (config.limits.max_tokens, declared_context(&model.worker))
        {
            if max >= context {
                problems.push(problem(
                    "limits.max_tokens",
                    format!(
                        "{max} does not fit model {name}'s context of {context} tokens ({option} in its worker command, prompt included): no request could use it; lower it below {context}, or remove it so each engine's context bounds its requests"
                    ),
                ));
            }
        }
    }
    problems
}

/// The context an engine's command line declares: vLLM's `--max-model-len`,
/// llama-server's `-c` / `--ctx-size`. The value and the option.
fn declared_context(worker: &[String]) -> Option<(u32, &'static str)> {
    let dashes = worker.iter().position(|a| a == "--")?;
    let engine = &worker[dashes + 1..];
    for option in ["--max-model-len", "--ctx-size", "-c"] {
        for (i, a) in engine.iter().enumerate() {
            let value = if a == option {
                engine.get(i + 1).map(String::as_str)
            } else {
                a.strip_prefix(option).and_then(|r| r.strip_prefix('='))
            };
            if let Some(n) = value.and_then(|v| v.parse::<u32>().ok()) {
                return Some((n, option));
            }
        }
    }
    None
}

fn check_daemon(d: &DaemonConfig, problems: &mut Vec<Problem>) {
    if d.listen.parse::<SocketAddr>().is_err() {
        problems.push(problem(
            "daemon.listen",
            format!(
                "`{}` is not an IP address and port; use e.g. \"127.0.0.1:50051\" (loopback) or \"0.0.0.0:50051\"",
                d.listen
            ),
        ));
    }
    match u32::from_str_radix(d.control_socket_mode.trim_start_matches("0o"), 8) {
        Ok(mode) if mode > 0o777 => problems.push(problem(
            "daemon.control_socket_mode",
            format!("`{}` has bits beyond 0777; use e.g. \"0660\"", d.control_socket_mode),
        )),
        Ok(mode) if mode & 0o002 != 0 => problems.push(problem(
            "daemon.control_socket_mode",
            format!(
                "`{}` lets every local user connect to the control socket, and so read status and logs and generate with the models (destructive operations still need root or daemon.control_admin_group); drop the world-write bit, e.g. \"0660\", and give the users who should connect daemon.control_socket_group",
                d.control_socket_mode
            ),
        )),
        Ok(mode) if mode & 0o600 != 0o600 => problems.push(problem(
            "daemon.control_socket_mode",
            format!(
                "`{}` denies the owner read/write, so nobody could use the socket; use e.g. \"0660\"",
                d.control_socket_mode
            ),
        )),
        Ok(_) => {}
        Err(_) => problems.push(problem(
            "daemon.control_socket_mode",
            format!("`{}` is not an octal mode; use e.g. \"0660\"", d.control_socket_mode),
        )),
    }
    for (key, group, example) in [
        (
            "daemon.control_socket_group",
            &d.control_socket_group,
            "tenstorrent",
        ),
        (
            "daemon.control_admin_group",
            &d.control_admin_group,
            "tt-admin",
        ),
    ] {
        if let Some(group) = group {
            let valid = !group.is_empty()
                && group
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !valid {
                problems.push(problem(
                    key,
                    format!("`{group}` is not a valid group name, e.g. \"{example}\""),
                ));
            }
        }
    }
    absolute(problems, "daemon.control_socket", &d.control_socket);
    absolute(problems, "daemon.state_dir", &d.state_dir);
    absolute(problems, "daemon.cache_dir", &d.cache_dir);
    absolute(problems, "daemon.lock_dir", &d.lock_dir);
    range(problems, "daemon.tick_ms", d.tick_ms, 50, 60_000, "ms");
    range(
        problems,
        "daemon.runtime_threads",
        d.runtime_threads,
        0,
        1024,
        "threads",
    );
    range(
        problems,
        "daemon.relay_threads",
        d.relay_threads,
        0,
        1024,
        "threads",
    );
}

fn check_inference(i: &InferenceConfig, problems: &mut Vec<Problem>) {
    for (key, path) in [
        ("inference.tokens_file", &i.tokens_file),
        ("inference.tls_cert", &i.tls_cert),
        ("inference.tls_key", &i.tls_key),
    ] {
        if let Some(path) = path {
            if path.as_os_str().is_empty() {
                problems.push(problem(
                    key,
                    "is empty; give the file's absolute path or remove the key",
                ));
            } else {
                absolute(problems, key, path);
            }
        }
    }
    match (&i.tls_cert, &i.tls_key) {
        (Some(_), None) => problems.push(problem(
            "inference.tls_key",
            "inference.tls_cert is set but tls_key is not; give both (the PEM certificate chain and its private key) for TLS, or neither for plaintext",
        )),
        (None, Some(_)) => problems.push(problem(
            "inference.tls_cert",
            "inference.tls_key is set but tls_cert is not; give both (the PEM certificate chain and its private key) for TLS, or neither for plaintext",
        )),
        _ => {}
    }
    range(
        problems,
        "inference.write_timeout_secs",
        i.write_timeout_secs,
        1,
        3600,
        "s",
    );
}

/// The gRPC message limit of the public port is sized from
/// `max_prompt_bytes`; this keeps that size sane.
const MAX_PROMPT_BYTES_LIMIT: u64 = 64 * 1024 * 1024;

fn check_limits(l: &LimitsConfig, problems: &mut Vec<Problem>) {
    range(
        problems,
        "limits.max_prompt_bytes",
        l.max_prompt_bytes,
        1,
        MAX_PROMPT_BYTES_LIMIT,
        "bytes",
    );
    if let Some(max_tokens) = l.max_tokens {
        range(
            problems,
            "limits.max_tokens",
            max_tokens.into(),
            1,
            1_000_000,
            "tokens",
        );
    }
    range(
        problems,
        "limits.max_streams_per_connection",
        l.max_streams_per_connection.into(),
        1,
        10_000,
        "streams",
    );
    range(
        problems,
        "limits.max_stop_strings",
        l.max_stop_strings.into(),
        1,
        1024,
        "stop strings",
    );
    range(
        problems,
        "limits.max_stop_bytes",
        l.max_stop_bytes.into(),
        1,
        65_536,
        "bytes",
    );
    range(
        problems,
        "limits.stream_buffer_chunks",
        l.stream_buffer_chunks.into(),
        1,
        1_000_000,
        "chunks",
    );
}

/// The OpenAI door's timeouts and connection caps (see [`OpenaiConfig`]).
fn check_openai_connections(o: &OpenaiConfig, problems: &mut Vec<Problem>) {
    range(
        problems,
        "openai.header_read_timeout_secs",
        o.header_read_timeout_secs,
        1,
        3600,
        "s",
    );
    range(
        problems,
        "openai.idle_timeout_secs",
        o.idle_timeout_secs,
        1,
        86_400,
        "s",
    );
    range(
        problems,
        "openai.body_read_timeout_secs",
        o.body_read_timeout_secs,
        1,
        3600,
        "s",
    );
    range(
        problems,
        "openai.write_timeout_secs",
        o.write_timeout_secs,
        1,
        3600,
        "s",
    );
    range(
        problems,
        "openai.max_connections",
        o.max_connections.into(),
        1,
        1_000_000,
        "connections",
    );
    range(
        problems,
        "openai.max_connections_per_peer",
        o.max_connections_per_peer.into(),
        1,
        1_000_000,
        "connections",
    );
    if o.max_connections_per_peer > o.max_connections {
        problems.push(problem(
            "openai.max_connections_per_peer",
            format!(
                "{} is above openai.max_connections ({}), so it never applies (one peer meets the door's cap first); lower it to at most {}, or raise max_connections",
                o.max_connections_per_peer, o.max_connections, o.max_connections
            ),
        ));
    }
}

fn check_hardware(h: &HardwareConfig, problems: &mut Vec<Problem>) {
    absolute(problems, "hardware.dev_root", &h.dev_root);
    absolute(problems, "hardware.sys_root", &h.sys_root);
    absolute(problems, "hardware.proc_root", &h.proc_root);
    if h.tt_smi.as_os_str().is_empty() {
        problems.push(problem(
            "hardware.tt_smi",
            "is empty; give the tt-smi executable, e.g. \"tt-smi\" or \"/run/current-system/sw/bin/tt-smi\"",
        ));
    }
}

fn check_reset(r: &ResetConfig, problems: &mut Vec<Problem>) {
    range(
        problems,
        "reset.tt_smi_timeout_secs",
        r.tt_smi_timeout_secs,
        1,
        3600,
        "s",
    );
    range(
        problems,
        "reset.come_back_timeout_secs",
        r.come_back_timeout_secs,
        1,
        3600,
        "s",
    );
    range(
        problems,
        "reset.heartbeat_interval_ms",
        r.heartbeat_interval_ms,
        10,
        60_000,
        "ms",
    );
    range(
        problems,
        "reset.probe_timeout_secs",
        r.probe_timeout_secs,
        1,
        3600,
        "s",
    );
    range(
        problems,
        "reset.attempts",
        r.attempts.into(),
        1,
        100,
        "attempts",
    );
    range(problems, "reset.backoff_ms", r.backoff_ms, 0, 600_000, "ms");
    if r.probe_command.first().is_some_and(|c| c.is_empty()) {
        problems.push(problem(
            "reset.probe_command",
            "the program (first element) is empty; give a command like [\"/usr/local/bin/mesh-check\"] or leave the list empty",
        ));
    }
}

fn check_model(
    name: &str,
    m: &ModelConfig,
    claimed: &mut BTreeMap<String, String>,
    problems: &mut Vec<Problem>,
) {
    let key = |field: &str| format!("models.{name}.{field}");
    if !is_model_name(name) {
        problems.push(problem(
            format!("models.{name}"),
            "model names may use letters, digits, '-', '_' and '.', start with a letter or digit, and be at most 64 characters (they name slots and cache directories)",
        ));
    }
    if m.tp != 1 && m.tp != 2 {
        problems.push(problem(
            key("tp"),
            format!(
                "TP must be 1 (one card) or 2 (two cabled cards), got {}",
                m.tp
            ),
        ));
    }
    match (m.cards.is_empty(), m.replicas.is_empty()) {
        (true, true) => problems.push(problem(
            key("cards"),
            format!(
                "no cards given; list the {} card(s) of this model, e.g. cards = [\"0000:01:00.0\"{}]",
                m.tp,
                if m.tp == 2 { ", \"0000:02:00.0\"" } else { "" }
            ),
        )),
        (false, false) => problems.push(problem(
            key("replicas"),
            "give either `cards` (one replica) or `replicas` (several), not both",
        )),
        (false, true) => check_card_set(&key("cards"), m.tp, &m.cards, claimed, problems),
        (true, false) => {
            for (i, set) in m.replicas.iter().enumerate() {
                check_card_set(&format!("{}[{i}]", key("replicas")), m.tp, set, claimed, problems);
            }
        }
    }
    if m.checkpoint.as_os_str().is_empty() {
        problems.push(problem(
            key("checkpoint"),
            "is empty; give the path of the model's checkpoint, e.g. \"/var/lib/models/model.gguf\"",
        ));
    } else {
        absolute(problems, &key("checkpoint"), &m.checkpoint);
    }
    if let Some(path) = &m.env_file {
        absolute(problems, &key("env_file"), path);
    }
    if m.worker.first().is_some_and(|c| c.is_empty()) {
        problems.push(problem(
            key("worker"),
            "the program (first element) is empty; give a command like [\"tt-worker\"] or leave the list empty for the default",
        ));
    }
    if m.mesh_device
        .as_deref()
        .is_some_and(|s| s.trim().is_empty())
    {
        problems.push(problem(
            key("mesh_device"),
            "is empty; remove it for the default ((1,1) for TP=1, (1,2) for TP=2) or name a mesh",
        ));
    }
    if let Some(mesh) = m.mesh_device.as_deref().filter(|s| !s.trim().is_empty()) {
        match mesh_devices(mesh) {
            Err(e) => problems.push(problem(key("mesh_device"), &e)),
            // vllm-tt-plugin worker.py:123-147: a TT_VISIBLE_DEVICES whose
            // count differs replaces the grid with (1, count), silently.
            Ok(Some(n)) if n != m.tp => problems.push(problem(
                key("mesh_device"),
                format!(
                    "{mesh:?} is a mesh of {n} device(s) but the model has tp = {} card(s): vllm-tt-plugin would silently open (1,{}) instead (TT_VISIBLE_DEVICES wins); name a mesh of {} device(s) or remove it",
                    m.tp, m.tp, m.tp
                ),
            )),
            Ok(_) => {}
        }
    }
    for (field, value) in [("firmware", &m.requires.firmware), ("kmd", &m.requires.kmd)] {
        if let Some(v) = value {
            if crate::cards::driver::Version::parse(v).is_none() {
                problems.push(problem(
                    key(&format!("requires.{field}")),
                    format!("{v:?} is not a version; write the minimum as dotted numbers, e.g. \"19.2.0\""),
                ));
            }
        }
    }
    if let Some(n) = m.readiness.concurrency {
        if n == 0 || n > m.max_in_flight {
            problems.push(problem(
                key("readiness.concurrency"),
                format!(
                    "{n} is not between 1 and max_in_flight ({}): the daemon never sends the engine more at once than max_in_flight",
                    m.max_in_flight
                ),
            ));
        }
    }
    if let Some(tt) = m.tt_json() {
        if let Err(e) = tt_worker_contract::tt_config::check_tt_table(&tt) {
            problems.push(problem(key("tt"), &e));
        }
    }
    for (table, vars) in [
        ("flags", &m.flags),
        ("env", &m.env),
        ("cold_env", &m.cold_env),
        ("warm_env", &m.warm_env),
    ] {
        for var in vars.keys() {
            check_env_name(&format!("{}.{var}", key(table)), var, problems);
        }
    }
    for (i, flag) in m.cache_flags.iter().enumerate() {
        if !is_env_name(flag) {
            problems.push(problem(
                format!("{}[{i}]", key("cache_flags")),
                format!("`{flag}` is not a valid environment variable name (letters, digits, '_'; not starting with a digit)"),
            ));
        }
    }
    for (i, pattern) in m.banners.patterns.iter().enumerate() {
        let valid = !pattern.is_empty()
            && pattern
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '*');
        if !valid {
            problems.push(problem(
                format!("{}[{i}]", key("banners.patterns")),
                format!("`{pattern}` is not a flag-name pattern; use letters, digits, '_' and '*', e.g. \"QWEN*\""),
            ));
        }
    }
    let r = &m.readiness;
    range(
        problems,
        &key("readiness.deadline_secs"),
        r.deadline_secs,
        1,
        86_400,
        "s",
    );
    range(
        problems,
        &key("readiness.ping_max_tokens"),
        r.ping_max_tokens.into(),
        1,
        256,
        "tokens",
    );
    if r.ping_prompt.trim().is_empty() {
        problems.push(problem(
            key("readiness.ping_prompt"),
            "is empty; the readiness ping needs a prompt, e.g. \"The capital of France is\"",
        ));
    }
    for (i, &tokens) in r.warmup_prompt_tokens.iter().enumerate() {
        range(
            problems,
            &format!("{}[{i}]", key("readiness.warmup_prompt_tokens")),
            tokens.into(),
            1,
            1_048_576,
            "tokens",
        );
    }
    if r.warmup_prompt_tokens.len() > 64 {
        problems.push(problem(
            key("readiness.warmup_prompt_tokens"),
            format!(
                "lists {} lengths; every one delays Ready by a compile: list the engine's padded prefill lengths (at most 64)",
                r.warmup_prompt_tokens.len()
            ),
        ));
    }
    if let Some(task) = &r.accuracy {
        match m.accuracy.get(task) {
            None => problems.push(problem(
                key("readiness.accuracy"),
                format!(
                    "{task:?} is not a task of [{}]; define it there with a `file` of questions and a gate",
                    key("accuracy")
                ),
            )),
            Some(gate) if gate.file.is_none() => problems.push(problem(
                key(&format!("accuracy.{task}")),
                "has no `file`; readiness.accuracy runs the task's questions from it (a JSON-lines file of {\"prompt\": ..., \"answer\": ...})",
            )),
            Some(_) => {}
        }
    }
    let s = &m.restart;
    range(
        problems,
        &key("restart.max_attempts"),
        s.max_attempts.into(),
        1,
        1000,
        "attempts",
    );
    range(
        problems,
        &key("restart.max_identical"),
        s.max_identical.into(),
        0,
        1000,
        "failures",
    );
    range(
        problems,
        &key("restart.window_secs"),
        s.window_secs,
        1,
        7 * 86_400,
        "s",
    );
    range(
        problems,
        &key("restart.backoff_ms"),
        s.backoff_ms,
        1,
        3_600_000,
        "ms",
    );
    range(
        problems,
        &key("restart.backoff_max_ms"),
        s.backoff_max_ms,
        1,
        3_600_000,
        "ms",
    );
    if s.backoff_max_ms < s.backoff_ms {
        problems.push(problem(
            key("restart.backoff_max_ms"),
            format!(
                "{} ms is below restart.backoff_ms ({} ms); raise it or lower backoff_ms",
                s.backoff_max_ms, s.backoff_ms
            ),
        ));
    }
    range(
        problems,
        &key("restart.stall_timeout_secs"),
        s.stall_timeout_secs,
        1,
        86_400,
        "s",
    );
    let h = &m.hang;
    range(
        problems,
        &key("hang.operation_timeout_secs"),
        h.operation_timeout_secs,
        0,
        86_400,
        "s",
    );
    range(
        problems,
        &key("hang.capture_timeout_secs"),
        h.capture_timeout_secs,
        1,
        3600,
        "s",
    );
    range(
        problems,
        &key("hang.capture_max_kib"),
        h.capture_max_kib,
        16,
        65_536,
        "KiB",
    );
    range(
        problems,
        &key("restart.stop_timeout_secs"),
        s.stop_timeout_secs,
        1,
        3600,
        "s",
    );
    if let Some(rss) = s.rss_limit_mib {
        range(
            problems,
            &key("restart.rss_limit_mib"),
            rss,
            64,
            16 * 1024 * 1024,
            "MiB",
        );
    }
    range(
        problems,
        &key("restart.rss_growth_window_secs"),
        s.rss_growth_window_secs,
        0,
        30 * 86_400,
        "s",
    );
    range(
        problems,
        &key("restart.rss_growth_report_mib"),
        s.rss_growth_report_mib,
        1,
        16 * 1024 * 1024,
        "MiB",
    );
    if let Some(max) = m.memory_max_mib {
        range(
            problems,
            &key("memory_max_mib"),
            max,
            64,
            16 * 1024 * 1024,
            "MiB",
        );
        // The watchdog's restart is the gentle way out: it must come before
        // the kernel's OOM killer, which kills inside the slot at memory_max.
        if let Some(rss) = s.rss_limit_mib.filter(|rss| *rss >= max) {
            problems.push(problem(
                key("restart.rss_limit_mib"),
                format!(
                    "{rss} MiB is not below memory_max_mib ({max} MiB): the kernel's OOM killer would end the worker before the watchdog restarts it; lower rss_limit_mib (say to 90% of memory_max_mib) or raise memory_max_mib"
                ),
            ));
        }
    }
    for (task, gate) in &m.accuracy {
        check_accuracy_gate(problems, &key(&format!("accuracy.{task}")), gate);
    }
    if let Some((grace, why)) = openai_worker_stop_grace(&m.worker) {
        if s.stop_timeout_secs <= grace {
            problems.push(problem(
                key("restart.stop_timeout_secs"),
                format!(
                    "{} s is not above the worker's own engine stop grace of {grace} s ({why}): the daemon would SIGKILL tt-worker-openai while its engine shuts down (a TT mesh close cut short leaves the cards needing a reset); set it to at least {}",
                    s.stop_timeout_secs,
                    grace + 5
                ),
            ));
        }
    }
    range(
        problems,
        &key("max_queue"),
        m.max_queue.into(),
        1,
        100_000,
        "requests",
    );
    range(
        problems,
        &key("max_in_flight"),
        m.max_in_flight.into(),
        1,
        1024,
        "requests",
    );
    range(
        problems,
        &key("recovery_wait_secs"),
        m.recovery_wait_secs,
        0,
        3600,
        "s",
    );
    range(
        problems,
        &key("max_queue_wait_secs"),
        m.max_queue_wait_secs,
        0,
        86_400,
        "s",
    );
    range(
        problems,
        &key("drain_timeout_secs"),
        m.drain_timeout_secs,
        1,
        3600,
        "s",
    );
}

/// When the worker is tt-worker-openai: the seconds it gives its engine
/// from SIGTERM to SIGKILL (`--stop-timeout-secs`, else its engine's
/// default: 60 for `--engine vllm-tt`, 15 otherwise, as
/// openai-worker/src/cli.rs says) and where that number comes from.
fn openai_worker_stop_grace(worker: &[String]) -> Option<(u64, String)> {
    let program = worker.first()?;
    if Path::new(program).file_name()? != "tt-worker-openai" {
        return None;
    }
    let own = worker[1..].iter().take_while(|a| a.as_str() != "--");
    let mut engine = "vllm".to_string();
    let mut given = None;
    let mut args = own.peekable();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.peek().map(|v| v.to_string()))
        };
        match flag {
            "--engine" => engine = value().unwrap_or(engine),
            "--stop-timeout-secs" => given = value().and_then(|v| v.parse::<u64>().ok()),
            _ => {}
        }
    }
    Some(match given {
        Some(secs) => (secs, format!("--stop-timeout-secs {secs}")),
        None if engine == "vllm-tt" => (60, "the default of --engine vllm-tt".into()),
        None => (15, format!("the default of --engine {engine}")),
    })
}

fn check_env_name(key: &str, var: &str, problems: &mut Vec<Problem>) {
    if !is_env_name(var) {
        problems.push(problem(
            key,
            format!("`{var}` is not a valid environment variable name (letters, digits, '_'; not starting with a digit)"),
        ));
    } else if RESERVED_ENV.contains(&var) {
        problems.push(problem(
            key,
            format!(
                "`{var}` is set by the daemon for every worker; remove it from the model's config"
            ),
        ));
    }
}

fn check_card_set(
    key: &str,
    tp: u32,
    cards: &[CardRef],
    claimed: &mut BTreeMap<String, String>,
    problems: &mut Vec<Problem>,
) {
    if (tp == 1 || tp == 2) && cards.len() != tp as usize {
        let listed: Vec<String> = cards.iter().map(|c| c.to_string()).collect();
        problems.push(problem(
            key,
            format!(
                "TP={tp} needs exactly {tp} card{}, got {} ([{}])",
                if tp == 1 { "" } else { "s" },
                cards.len(),
                listed.join(", ")
            ),
        ));
    }
    for (i, card) in cards.iter().enumerate() {
        let here = format!("{key}[{i}]");
        let id = match card {
            CardRef::Index(n) => format!("index {n}"),
            CardRef::Bdf(s) => match parse_bdf(s) {
                Some(bdf) => bdf,
                None => {
                    problems.push(problem(
                        &here,
                        format!("`{s}` is not a PCI address like \"0000:01:00.0\" nor a device index like 0"),
                    ));
                    continue;
                }
            },
        };
        if let Some(first) = claimed.get(&id) {
            problems.push(problem(
                &here,
                format!("card {id} is already used by {first}; a card can belong to one slot only"),
            ));
        } else {
            claimed.insert(id, here);
        }
    }
}

/// A gate is a reference with a tolerance (scores 0 to 1) or a pass mark
/// `N/M`, one or the other.
fn check_accuracy_gate(problems: &mut Vec<Problem>, key: &str, gate: &AccuracyGate) {
    let score = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
    match (gate.reference, gate.tolerance, &gate.pass_mark) {
        (Some(r), Some(t), None) => {
            if !score(r) || !score(t) {
                problems.push(problem(
                    key.to_string(),
                    format!("reference {r} and tolerance {t} must both be scores between 0 and 1"),
                ));
            }
        }
        (None, None, Some(mark)) => {
            if tt_serving_proto::accuracy::pass_mark(mark).is_none() {
                problems.push(problem(
                    format!("{key}.pass_mark"),
                    format!("{mark:?} is not a pass mark; write \"N/M\", at least N correct of M samples (e.g. \"55/60\")"),
                ));
            }
        }
        _ => problems.push(problem(
            key.to_string(),
            "give `reference` and `tolerance`, or `pass_mark` (\"N/M\"), not both and not one of the first two alone".to_string(),
        )),
    }
    if let Some(file) = gate.file.as_ref().filter(|f| !f.is_absolute()) {
        problems.push(problem(
            format!("{key}.file"),
            format!(
                "{} is relative; give an absolute path (the daemon's working directory is not the config's)",
                file.display()
            ),
        ));
    }
}

/// The number of devices a MESH_DEVICE names, read as vllm-tt-plugin reads
/// it (`utils/dp_discovery.py:23-75` at e3fc849): a two-number tuple or
/// list, or one of its preset names (case-sensitive). `Ok(None)`: a Galaxy
/// preset, whose grid the plugin takes from the system.
pub fn mesh_devices(mesh: &str) -> Result<Option<u32>, String> {
    const PRESETS: [(&str, u32); 11] = [
        ("N150", 1),
        ("P100", 1),
        ("P150", 1),
        ("P150x2", 2),
        ("N300", 2),
        ("P300", 2),
        ("N150x4", 4),
        ("P150x4", 4),
        ("T3K", 8),
        ("P150x8", 8),
        ("P300x2", 4),
    ];
    let trimmed = mesh.trim();
    if let Some(inner) = trimmed
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .or_else(|| trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')))
    {
        let dims: Vec<Result<u32, _>> = inner.split(',').map(|d| d.trim().parse::<u32>()).collect();
        return match dims.as_slice() {
            [Ok(r), Ok(c)] if *r > 0 && *c > 0 => Ok(Some(r * c)),
            _ => Err(format!(
                "{mesh:?} is not a mesh shape: give two positive numbers, e.g. \"(1,2)\""
            )),
        };
    }
    if let Some((_, n)) = PRESETS.iter().find(|(name, _)| *name == trimmed) {
        return Ok(Some(*n));
    }
    if matches!(trimmed, "TG" | "BH-Galaxy") {
        return Ok(None);
    }
    let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
    Err(format!(
        "{mesh:?} is neither a shape like \"(1,2)\" nor a name vllm-tt-plugin knows (\"Invalid MESH_DEVICE\"); use one of {}, TG, BH-Galaxy (case matters)",
        names.join(", ")
    ))
}
