use super::*;

fn problems_of(text: &str) -> Vec<Problem> {
    match parse(text) {
        Ok(_) => panic!("config was accepted but should have been rejected:\n{text}"),
        Err(p) => p,
    }
}

/// Asserts that some problem is reported at `key` and its message contains
/// `needle`.
fn assert_rejected(text: &str, key: &str, needle: &str) {
    let problems = problems_of(text);
    assert!(
        problems
            .iter()
            .any(|p| p.key == key && p.message.contains(needle)),
        "expected a problem at `{key}` mentioning `{needle}`, got:\n{}",
        problems
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

const ONE_MODEL: &str = r#"
[models.qwen]
tp = 1
cards = ["0000:01:00.0"]
checkpoint = "/m/q.gguf"
"#;

#[test]
fn example_config_is_valid_and_complete() {
    let config = parse(EXAMPLE_CONFIG).expect("example config must pass check-config");
    assert_eq!(config.models.len(), 1);
    let model = &config.models["smollm2"];
    assert_eq!(model.tp, 2);
    assert_eq!(model.readiness.expect.as_deref(), Some("Paris"));
    // What the host must provide stays few: no groups, no tokens file.
    assert_eq!(config.daemon.control_socket_group, None);
    assert_eq!(config.inference.tokens_file, None);
}

#[test]
fn empty_config_is_valid_with_defaults() {
    let config = parse("").expect("an empty config manages every card");
    assert!(config.models.is_empty());
    assert_eq!(config.hardware.dev_root, std::path::PathBuf::from("/dev"));
    assert_eq!(config.reset.policy, ResetPolicy::IfUnclean);
    assert_eq!(config.daemon.listen, "127.0.0.1:50051");
}

#[test]
fn minimal_model_gets_defaults() {
    let config = parse(ONE_MODEL).unwrap();
    let m = &config.models["qwen"];
    assert_eq!(m.mesh_device(), "(1,1)");
    assert_eq!(
        m.card_sets(),
        vec![vec![CardRef::Bdf("0000:01:00.0".into())]]
    );
}

#[test]
fn tp2_with_one_card_names_key_and_cards() {
    assert_rejected(
        r#"
[models.qwen]
tp = 2
cards = ["0000:01:00.0"]
checkpoint = "/m/q.gguf"
"#,
        "models.qwen.cards",
        "TP=2 needs exactly 2 cards, got 1 ([0000:01:00.0])",
    );
}

#[test]
fn tp_other_than_one_or_two_is_rejected() {
    assert_rejected(
        &ONE_MODEL.replace("tp = 1", "tp = 4"),
        "models.qwen.tp",
        "TP must be 1",
    );
}

#[test]
fn card_in_two_models_is_rejected() {
    let text = format!(
        "{ONE_MODEL}\n[models.other]\ntp = 1\ncards = [\"01:00.0\"]\ncheckpoint = \"/m/o.gguf\"\n"
    );
    assert_rejected(
        &text,
        "models.qwen.cards[0]",
        "already used by models.other.cards[0]",
    );
}

#[test]
fn card_twice_in_one_model_is_rejected() {
    assert_rejected(
        r#"
[models.qwen]
tp = 2
cards = [0, 0]
checkpoint = "/m/q.gguf"
"#,
        "models.qwen.cards[1]",
        "card index 0 is already used",
    );
}

#[test]
fn malformed_bdf_is_rejected() {
    assert_rejected(
        &ONE_MODEL.replace("0000:01:00.0", "01-00-0"),
        "models.qwen.cards[0]",
        "not a PCI address",
    );
}

#[test]
fn missing_cards_is_rejected() {
    assert_rejected(
        "[models.qwen]\ntp = 1\ncheckpoint = \"/m/q.gguf\"\n",
        "models.qwen.cards",
        "no cards given",
    );
}

#[test]
fn cards_and_replicas_together_are_rejected() {
    assert_rejected(
        &format!("{ONE_MODEL}replicas = [[\"0000:02:00.0\"]]\n"),
        "models.qwen.replicas",
        "not both",
    );
}

#[test]
fn replica_with_wrong_card_count_names_the_replica() {
    assert_rejected(
        r#"
[models.qwen]
tp = 2
replicas = [["0000:01:00.0", "0000:02:00.0"], ["0000:03:00.0"]]
checkpoint = "/m/q.gguf"
"#,
        "models.qwen.replicas[1]",
        "TP=2 needs exactly 2 cards, got 1",
    );
}

#[test]
fn duplicate_model_names_are_rejected() {
    let problems = problems_of(&format!("{ONE_MODEL}{ONE_MODEL}"));
    assert!(
        problems[0].key.starts_with("line ") && problems[0].message.contains("duplicate"),
        "{problems:?}"
    );
}

#[test]
fn invalid_flag_name_is_rejected() {
    assert_rejected(
        &format!("{ONE_MODEL}flags = {{ \"1BAD-FLAG\" = \"1\" }}\n"),
        "models.qwen.flags.1BAD-FLAG",
        "not a valid environment variable name",
    );
}

#[test]
fn reserved_env_name_is_rejected() {
    assert_rejected(
        &format!("{ONE_MODEL}env = {{ TT_VISIBLE_DEVICES = \"x\" }}\n"),
        "models.qwen.env.TT_VISIBLE_DEVICES",
        "set by the daemon",
    );
}

#[test]
fn relative_env_file_is_rejected_with_the_fix() {
    assert_rejected(
        &format!("{ONE_MODEL}env_file = \"secrets/qwen.env\"\n"),
        "models.qwen.env_file",
        "use an absolute path",
    );
}

#[test]
fn zero_timeout_is_rejected() {
    assert_rejected(
        &format!("{ONE_MODEL}[models.qwen.readiness]\ndeadline_secs = 0\n"),
        "models.qwen.readiness.deadline_secs",
        "out of range",
    );
}

#[test]
fn prefix_affinity_is_on_by_default_and_takes_only_a_boolean() {
    assert!(parse(ONE_MODEL).unwrap().models["qwen"].prefix_affinity);
    let off = parse(&format!("{ONE_MODEL}prefix_affinity = false\n")).unwrap();
    assert!(!off.models["qwen"].prefix_affinity);
    assert_rejected(
        &format!("{ONE_MODEL}prefix_affinity = \"off\"\n"),
        "models.qwen.prefix_affinity",
        "expected a boolean",
    );
}

#[test]
fn recovery_wait_defaults_to_30_s_may_be_off_and_is_bounded() {
    assert_eq!(
        parse(ONE_MODEL).unwrap().models["qwen"].recovery_wait_secs,
        30
    );
    let off = parse(&format!("{ONE_MODEL}recovery_wait_secs = 0\n")).unwrap();
    assert_eq!(off.models["qwen"].recovery_wait_secs, 0);
    assert_rejected(
        &format!("{ONE_MODEL}recovery_wait_secs = 86400\n"),
        "models.qwen.recovery_wait_secs",
        "use a value from 0 to 3600 s",
    );
}

#[test]
fn absurd_timeout_is_rejected() {
    assert_rejected(
        "[reset]\ntt_smi_timeout_secs = 999999\n",
        "reset.tt_smi_timeout_secs",
        "out of range",
    );
}

#[test]
fn unknown_field_is_named() {
    assert_rejected(
        &ONE_MODEL.replace("tp = 1", "tp = 1\ntpp = 2"),
        "models.qwen.tpp",
        "unknown field",
    );
}

#[test]
fn unknown_section_is_named() {
    assert_rejected("[deamon]\nlisten = \"x\"\n", "deamon", "unknown section");
}

#[test]
fn wrong_type_names_the_key() {
    assert_rejected(
        "[reset]\nattempts = \"three\"\n",
        "reset.attempts",
        "invalid type",
    );
}

#[test]
fn bad_listen_address_is_rejected() {
    assert_rejected(
        "[daemon]\nlisten = \"localhost\"\n",
        "daemon.listen",
        "not an IP address and port",
    );
}

#[test]
fn world_writable_control_socket_is_rejected_with_the_real_rule() {
    for mode in ["0666", "0777"] {
        let problems = problems_of(&format!("[daemon]\ncontrol_socket_mode = \"{mode}\"\n"));
        let message = &problems
            .iter()
            .find(|p| p.key == "daemon.control_socket_mode")
            .expect("a problem at daemon.control_socket_mode")
            .message;
        // The mode decides who may connect, and so read status and
        // generate; destructive operations need root or the admin group
        // whatever the mode, so the message must not claim otherwise.
        assert!(message.contains("world-write"), "{message}");
        assert!(message.contains("every local user"), "{message}");
        assert!(message.contains("generate"), "{message}");
        assert!(message.contains("daemon.control_admin_group"), "{message}");
        assert!(!message.contains("reset cards"), "{message}");
    }
}

#[test]
fn security_and_limit_defaults() {
    let config = parse("").unwrap();
    assert_eq!(config.daemon.control_admin_group, None);
    assert_eq!(config.inference, InferenceConfig::default());
    assert_eq!(config.inference.tokens_file, None);
    assert_eq!(config.limits.max_prompt_bytes, 4 * 1024 * 1024);
    assert_eq!(
        config.limits.max_tokens, None,
        "the engine's context bounds it"
    );
    assert_eq!(config.limits.max_streams_per_connection, 16);
    assert_eq!(config.limits.max_stop_strings, 16);
    assert_eq!(config.limits.max_stop_bytes, 256);
    let example = parse(EXAMPLE_CONFIG).unwrap();
    assert_eq!(example.daemon.control_admin_group, None);
    assert_eq!(example.limits, LimitsConfig::default());
}

#[test]
fn bad_admin_group_name_is_rejected() {
    assert_rejected(
        "[daemon]\ncontrol_admin_group = \"tt admin\"\n",
        "daemon.control_admin_group",
        "not a valid group name",
    );
}

#[test]
fn tls_cert_without_key_is_rejected() {
    assert_rejected(
        "[inference]\ntls_cert = \"/etc/tt/cert.pem\"\n",
        "inference.tls_key",
        "give both",
    );
    assert_rejected(
        "[inference]\ntls_key = \"/etc/tt/key.pem\"\n",
        "inference.tls_cert",
        "give both",
    );
    parse("[inference]\ntls_cert = \"/etc/tt/cert.pem\"\ntls_key = \"/etc/tt/key.pem\"\n")
        .expect("both together are fine");
}

#[test]
fn relative_or_empty_secret_paths_are_rejected() {
    assert_rejected(
        "[inference]\ntokens_file = \"tokens\"\n",
        "inference.tokens_file",
        "relative path",
    );
    assert_rejected(
        "[inference]\ntokens_file = \"\"\n",
        "inference.tokens_file",
        "is empty",
    );
}

#[test]
fn unknown_inference_key_is_named() {
    assert_rejected(
        "[inference]\ntoken = \"secret\"\n",
        "inference.token",
        "unknown field",
    );
}

#[test]
fn zero_or_absurd_limits_are_rejected() {
    assert_rejected(
        "[limits]\nmax_prompt_bytes = 0\n",
        "limits.max_prompt_bytes",
        "out of range",
    );
    assert_rejected(
        "[limits]\nmax_tokens = 0\n",
        "limits.max_tokens",
        "out of range",
    );
    assert_rejected(
        "[limits]\nmax_streams_per_connection = 0\n",
        "limits.max_streams_per_connection",
        "out of range",
    );
    assert_rejected(
        "[limits]\nmax_stop_strings = 0\n",
        "limits.max_stop_strings",
        "out of range",
    );
    assert_rejected(
        "[limits]\nmax_stop_bytes = 100000\n",
        "limits.max_stop_bytes",
        "out of range",
    );
    assert_rejected(
        "[limits]\nmax_prompt_bytes = 1000000000000\n",
        "limits.max_prompt_bytes",
        "out of range",
    );
    assert_rejected(
        "[limits]\nmax_tokens = -1\n",
        "limits.max_tokens",
        "invalid value",
    );
}

#[test]
fn relative_paths_are_rejected() {
    assert_rejected(
        "[hardware]\nsys_root = \"sys\"\n",
        "hardware.sys_root",
        "relative path",
    );
}

#[test]
fn bad_policy_value_is_named() {
    assert_rejected(
        "[reset]\npolicy = \"sometimes\"\n",
        "reset.policy",
        "unknown variant",
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let problems = problems_of(
        r#"
[daemon]
listen = "nowhere"
[models.a]
tp = 3
cards = ["0000:01:00.0"]
checkpoint = "/m/a.gguf"
[models.a.restart]
max_attempts = 0
"#,
    );
    let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
    assert!(keys.contains(&"daemon.listen"), "{keys:?}");
    assert!(keys.contains(&"models.a.tp"), "{keys:?}");
    assert!(keys.contains(&"models.a.restart.max_attempts"), "{keys:?}");
}

#[test]
fn bdf_normalisation() {
    assert_eq!(parse_bdf("01:00.0").as_deref(), Some("0000:01:00.0"));
    assert_eq!(parse_bdf("0000:0A:00.1").as_deref(), Some("0000:0a:00.1"));
    assert_eq!(parse_bdf("0000:01:00.8"), None);
    assert_eq!(parse_bdf("/dev/tenstorrent/0"), None);
}

#[test]
fn metrics_listen_that_is_not_an_address_is_rejected_with_the_fix() {
    assert_rejected(
        "[metrics]\nlisten = \"localhost\"\n",
        "metrics.listen",
        "or \"\" to turn the endpoint off",
    );
    assert!(crate::config::parse("[metrics]\nlisten = \"\"\n").is_ok());
}

#[test]
fn an_otlp_endpoint_the_exporter_cannot_use_is_rejected_with_the_fix() {
    assert_rejected(
        "[tracing]\notlp_endpoint = \"https://collector.example:4317\"\n",
        "tracing.otlp_endpoint",
        "https is not supported",
    );
    assert_rejected(
        "[tracing]\notlp_endpoint = \"127.0.0.1:4317\"\n",
        "tracing.otlp_endpoint",
        "http://",
    );
    let on = crate::config::parse("[tracing]\notlp_endpoint = \"http://127.0.0.1:4317\"\n")
        .expect("a plain http endpoint is accepted");
    assert_eq!(on.tracing.otlp_endpoint, "http://127.0.0.1:4317");
    assert!(crate::config::parse("").is_ok_and(|c| c.tracing.otlp_endpoint.is_empty()));
}

#[test]
fn openai_listen_must_be_an_address_of_its_own() {
    assert_rejected(
        "[openai]\nlisten = \"localhost:8000\"\n",
        "openai.listen",
        "or \"\" to turn the OpenAI front door off",
    );
    assert_rejected(
        "[daemon]\nlisten = \"127.0.0.1:9000\"\n[openai]\nlisten = \"127.0.0.1:9000\"\n",
        "openai.listen",
        "is also daemon.listen",
    );
    assert_rejected(
        "[openai]\nlisten = \"127.0.0.1:8000\"\nport = 1\n",
        "openai.port",
        "",
    );
    let off = crate::config::parse("[openai]\nlisten = \"\"\n").map(|c| c.openai.listen);
    assert_eq!(off.ok().as_deref(), Some(""));
}

#[test]
fn every_unknown_key_in_a_table_is_named() {
    let problems = problems_of(&format!(
        "{ONE_MODEL}tpp = 2\ncheckpont = \"/m/x.gguf\"\n[models.qwen.readiness]\ndeadline = 5\nping = \"x\"\n[daemon]\nlisen = \"x\"\nsocket = \"y\"\n"
    ));
    let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "models.qwen.tpp",
        "models.qwen.checkpont",
        "models.qwen.readiness.deadline",
        "models.qwen.readiness.ping",
        "daemon.lisen",
        "daemon.socket",
    ] {
        assert!(keys.contains(&key), "{key} not named in {keys:?}");
    }
    assert_eq!(problems.len(), 6, "{problems:?}");
}

#[test]
fn unknown_keys_do_not_hide_the_other_rules() {
    // The table is typed without its unknown key, so its ranges and
    // cross-field rules are checked in the same run.
    let problems = problems_of(
        "[models.qwen]\ntp = 3\ncards = [\"0000:01:00.0\"]\ncheckpoint = \"/m/q.gguf\"\ncolour = \"blue\"\n[reset]\nattempts = \"three\"\n[daemon]\ntick_ms = 0\n",
    );
    let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "models.qwen.colour",
        "models.qwen.tp",
        "reset.attempts",
        "daemon.tick_ms",
    ] {
        assert!(keys.contains(&key), "{key} not named in {keys:?}");
    }
}

#[test]
fn runtime_threads_default_to_one_per_cpu_and_are_bounded() {
    let config = parse(ONE_MODEL).expect("one model");
    assert_eq!(config.daemon.runtime_threads, 0);
    let one = parse(&format!("[daemon]\nruntime_threads = 1\n{ONE_MODEL}")).expect("1 thread");
    assert_eq!(one.daemon.runtime_threads, 1);
    assert_rejected(
        &format!("[daemon]\nruntime_threads = 5000\n{ONE_MODEL}"),
        "daemon.runtime_threads",
        "from 0 to 1024",
    );
}

#[test]
fn relay_threads_default_to_one_and_are_bounded() {
    let config = parse(ONE_MODEL).expect("one model");
    assert_eq!(config.daemon.relay_threads, 1);
    let shared = parse(&format!("[daemon]\nrelay_threads = 0\n{ONE_MODEL}")).expect("shared");
    assert_eq!(shared.daemon.relay_threads, 0);
    assert_rejected(
        &format!("[daemon]\nrelay_threads = 2000\n{ONE_MODEL}"),
        "daemon.relay_threads",
        "from 0 to 1024",
    );
}

#[test]
fn a_worker_that_stops_answering_is_caught_within_the_documented_bound() {
    use std::time::Duration;
    // The default tick: the 4 s that docs/ARCHITECTURE.md and
    // example.toml state.
    let default = DaemonConfig::default();
    assert_eq!(default.health_poll_timeout(), Duration::from_secs(1));
    assert_eq!(default.unanswered_health_bound(), Duration::from_secs(4));
    // A short tick polls often but still gives each poll a second.
    let short = DaemonConfig {
        tick_ms: 100,
        ..DaemonConfig::default()
    };
    assert_eq!(short.health_poll_timeout(), Duration::from_secs(1));
    assert_eq!(short.unanswered_health_bound(), Duration::from_millis(3100));
    // A long tick waits a tick per poll.
    let long = DaemonConfig {
        tick_ms: 5000,
        ..DaemonConfig::default()
    };
    assert_eq!(long.unanswered_health_bound(), Duration::from_secs(20));
}

#[test]
fn containment_modes_parse_and_others_are_named() {
    assert_eq!(parse("").unwrap().daemon.containment, ContainmentMode::Auto);
    let forced = parse("[daemon]\ncontainment = \"process-tree\"\n").unwrap();
    assert_eq!(forced.daemon.containment, ContainmentMode::ProcessTree);
    assert_rejected(
        "[daemon]\ncontainment = \"cgroups\"\n",
        "daemon.containment",
        "unknown variant",
    );
}

#[test]
fn memory_max_is_ranged_and_must_stay_above_the_rss_limit() {
    let limited = format!("{ONE_MODEL}memory_max_mib = 4096\n");
    assert_eq!(
        parse(&limited).unwrap().models["qwen"].memory_max_mib,
        Some(4096)
    );
    assert_rejected(
        &format!("{ONE_MODEL}memory_max_mib = 1\n"),
        "models.qwen.memory_max_mib",
        "MiB",
    );
    assert_rejected(
        &format!("{ONE_MODEL}memory_max_mib = 4096\n[models.qwen.restart]\nrss_limit_mib = 4096\n"),
        "models.qwen.restart.rss_limit_mib",
        "not below memory_max_mib (4096 MiB)",
    );
    parse(&format!(
        "{ONE_MODEL}memory_max_mib = 4096\n[models.qwen.restart]\nrss_limit_mib = 3600\n"
    ))
    .unwrap();
}

#[test]
fn a_stop_timeout_shorter_than_tt_worker_openais_engine_grace_is_refused() {
    let vllm_tt = format!(
        "{ONE_MODEL}worker = [\"/run/current-system/sw/bin/tt-worker-openai\", \"--engine\", \"vllm-tt\", \"--\", \"vllm\", \"serve\", \"{{checkpoint}}\"]\n"
    );
    // The daemon's default 20 s would cut vLLM-TT's 60 s mesh close short.
    assert_rejected(
        &vllm_tt,
        "models.qwen.restart.stop_timeout_secs",
        "60 s (the default of --engine vllm-tt)",
    );
    parse(&format!(
        "{vllm_tt}[models.qwen.restart]\nstop_timeout_secs = 75\n"
    ))
    .expect("75 s covers the 60 s grace");
    // The worker's own option is read, in both spellings.
    for given in [
        "\"--stop-timeout-secs\", \"30\"",
        "\"--stop-timeout-secs=30\"",
    ] {
        let text = format!(
            "{ONE_MODEL}worker = [\"tt-worker-openai\", {given}, \"--\", \"vllm\", \"serve\", \"{{checkpoint}}\", \"--stop-timeout-secs\", \"1\"]\n"
        );
        assert_rejected(
            &text,
            "models.qwen.restart.stop_timeout_secs",
            "--stop-timeout-secs 30",
        );
    }
    // llama-server's 15 s default is within the daemon's 20 s; other workers are not read.
    parse(&format!(
        "{ONE_MODEL}worker = [\"tt-worker-openai\", \"--engine\", \"llama-server\", \"--\", \"llama-server\"]\n"
    ))
    .expect("15 s grace, 20 s stop timeout");
    parse(&format!(
        "{ONE_MODEL}worker = [\"my-worker\", \"--engine\", \"vllm-tt\"]\n"
    ))
    .expect("not tt-worker-openai");
}

#[test]
fn warm_up_lengths_and_visible_devices_are_checked() {
    assert_rejected(
        &format!("{ONE_MODEL}[models.qwen.readiness]\nwarmup_prompt_tokens = [128, 0]\n"),
        "models.qwen.readiness.warmup_prompt_tokens[1]",
        "",
    );
    let config = parse(&format!(
        "{ONE_MODEL}visible_devices = \"index\"\n[models.qwen.readiness]\nwarmup_prompt_tokens = [128, 1024]\n"
    ))
    .expect("valid");
    assert_eq!(config.models["qwen"].visible_devices, VisibleDevices::Index);
    assert_eq!(
        config.models["qwen"].readiness.warmup_prompt_tokens,
        vec![128, 1024]
    );
    assert!(parse(&format!("{ONE_MODEL}visible_devices = \"uuid\"\n")).is_err());
}

#[test]
fn accuracy_gates_are_a_reference_with_a_tolerance_or_a_pass_mark() {
    let ok = format!(
        "{ONE_MODEL}\n[models.qwen.accuracy.gsm8k]\npass_mark = \"55/60\"\n\n[models.qwen.accuracy.arc_easy]\nreference = 0.6\ntolerance = 0.02\n"
    );
    let config = parse(&ok).expect("valid gates");
    let gates = &config.models["qwen"].accuracy;
    assert_eq!(gates["gsm8k"].pass_mark.as_deref(), Some("55/60"));
    assert_eq!(gates["arc_easy"].reference, Some(0.6));
    assert_rejected(
        &format!("{ONE_MODEL}\n[models.qwen.accuracy.gsm8k]\npass_mark = \"61/60\"\n"),
        "models.qwen.accuracy.gsm8k.pass_mark",
        "not a pass mark",
    );
    assert_rejected(
        &format!("{ONE_MODEL}\n[models.qwen.accuracy.gsm8k]\nreference = 0.5\n"),
        "models.qwen.accuracy.gsm8k",
        "give `reference` and `tolerance`, or `pass_mark`",
    );
    assert_rejected(
        &format!("{ONE_MODEL}\n[models.qwen.accuracy.gsm8k]\nreference = 55\ntolerance = 1\n"),
        "models.qwen.accuracy.gsm8k",
        "between 0 and 1",
    );
}

#[test]
fn readiness_accuracy_names_a_gate_with_a_file_of_questions() {
    let ok = format!(
        "{ONE_MODEL}\n[models.qwen.readiness]\naccuracy = \"capitals\"\n\n[models.qwen.accuracy.capitals]\nreference = 0.6\ntolerance = 0.1\nfile = \"/srv/tasks/capitals.jsonl\"\n"
    );
    let config = parse(&ok).expect("a readiness accuracy check");
    let m = &config.models["qwen"];
    assert_eq!(m.readiness.accuracy.as_deref(), Some("capitals"));
    assert_eq!(
        m.accuracy["capitals"].rule(),
        Some(tt_serving_proto::accuracy::Gate::Reference {
            reference: 0.6,
            tolerance: 0.1
        })
    );
    assert_rejected(
        &format!("{ONE_MODEL}\n[models.qwen.readiness]\naccuracy = \"capitals\"\n"),
        "models.qwen.readiness.accuracy",
        "not a task of [models.qwen.accuracy]",
    );
    assert_rejected(
        &format!(
            "{ONE_MODEL}\n[models.qwen.readiness]\naccuracy = \"capitals\"\n\n[models.qwen.accuracy.capitals]\npass_mark = \"3/4\"\n"
        ),
        "models.qwen.accuracy.capitals",
        "has no `file`",
    );
    assert_rejected(
        &format!(
            "{ONE_MODEL}\n[models.qwen.accuracy.capitals]\npass_mark = \"3/4\"\nfile = \"tasks/capitals.jsonl\"\n"
        ),
        "models.qwen.accuracy.capitals.file",
        "give an absolute path",
    );
}

#[test]
fn hang_settings_are_on_by_default_bounded_and_unknown_keys_refused() {
    let config = parse(ONE_MODEL).expect("one model");
    let hang = &config.models["qwen"].hang;
    assert_eq!(hang.operation_timeout_secs, 30);
    assert!(hang.capture);
    let off = parse(&format!(
        "{ONE_MODEL}[models.qwen.hang]\noperation_timeout_secs = 0\ncapture = false\n"
    ))
    .expect("off");
    assert_eq!(off.models["qwen"].hang.operation_timeout_secs, 0);
    assert_rejected(
        &format!("{ONE_MODEL}[models.qwen.hang]\ncapture_max_kib = 1\n"),
        "models.qwen.hang.capture_max_kib",
        "from 16 to 65536",
    );
    assert_rejected(
        &format!("{ONE_MODEL}[models.qwen.hang]\ncapture_timeout_secs = 0\n"),
        "models.qwen.hang.capture_timeout_secs",
        "from 1 to 3600",
    );
    let typo = problems_of(&format!("{ONE_MODEL}[models.qwen.hang]\ntimeout = 5\n"));
    assert!(
        typo.iter().any(|p| p.to_string().contains("timeout")),
        "{typo:?}"
    );
}

#[test]
fn tt_settings_are_checked_by_name_and_a_mesh_must_match_the_cards() {
    let tt = |table: &str| format!("{ONE_MODEL}[models.qwen.tt]\n{table}\n");
    let config = parse(&tt(
        "sample_on_device_mode = \"decode_only\"\ntrace_region_size = 56000000",
    ))
    .expect("the plugin's keys pass");
    let json = config.models["qwen"].tt_json().expect("a table");
    assert_eq!(json["trace_region_size"], 56000000);
    assert_rejected(
        &tt("trace_regoin_size = 1"),
        "models.qwen.tt",
        "trace_regoin_size",
    );
    assert_rejected(
        &tt("trace_mode = \"sometimes\""),
        "models.qwen.tt",
        "decode_only",
    );
    // TT_VISIBLE_DEVICES would silently win over a mesh of another size.
    let mesh = |m: &str| format!("{ONE_MODEL}mesh_device = \"{m}\"\n");
    assert_rejected(&mesh("P150x2"), "models.qwen.mesh_device", "tp = 1");
    assert_rejected(&mesh("p150"), "models.qwen.mesh_device", "case matters");
    assert_rejected(
        &mesh("(1,x)"),
        "models.qwen.mesh_device",
        "two positive numbers",
    );
    parse(&mesh("P150")).expect("a one-device preset");
    parse(&mesh("[1, 1]")).expect("a list");
    // A two-card model resets before every start unless told otherwise.
    let two = parse(EXAMPLE_CONFIG).expect("example");
    assert!(two.models["smollm2"].resets_before_every_start());
    assert!(!parse(ONE_MODEL).expect("one").models["qwen"].resets_before_every_start());
    let never = format!("{ONE_MODEL}reset_before_start = \"always\"\n");
    assert!(parse(&never).expect("always").models["qwen"].resets_before_every_start());
}

#[test]
fn a_max_tokens_limit_above_a_models_declared_context_is_refused() {
    let model = |context: &str| {
        format!(
            "[limits]\nmax_tokens = 8192\n[models.v]\ntp = 1\ncards = [0]\ncheckpoint = \"/m\"\nworker = [\"tt-worker-openai\", \"--\", \"vllm\", \"serve\", \"{{checkpoint}}\", \"--port\", \"{{port}}\", \"--max-model-len\", \"{context}\"]\n"
        )
    };
    assert_rejected(
        &model("4096"),
        "limits.max_tokens",
        "model v's context of 4096 tokens (--max-model-len",
    );
    parse(&model("131072")).expect("within the context");
}

#[test]
fn requirements_and_readiness_concurrency_are_checked_by_name() {
    assert_rejected(
        &format!("{ONE_MODEL}[models.qwen.requires]\nfirmware = \"latest\"\n"),
        "models.qwen.requires.firmware",
        "dotted numbers",
    );
    for n in ["0", "9"] {
        assert_rejected(
            &format!("{ONE_MODEL}max_in_flight = 8\n[models.qwen.readiness]\nconcurrency = {n}\n"),
            "models.qwen.readiness.concurrency",
            "between 1 and max_in_flight (8)",
        );
    }
    let config = parse(&format!(
        "{ONE_MODEL}max_in_flight = 2\n[models.qwen.requires]\nkmd = \"2.5.0\"\n"
    ))
    .expect("valid");
    assert_eq!(
        config.models["qwen"].readiness_concurrency(),
        2,
        "max_in_flight caps it"
    );
    assert_rejected(
        &format!("{ONE_MODEL}reset_before_start = \"sometimes\"\n"),
        "models.qwen.reset_before_start",
        "",
    );
}
