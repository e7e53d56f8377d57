use super::*;

#[test]
fn socket_is_global_and_defaults_to_the_module_path() {
    let before =
        Cli::try_parse_from(["ttctl", "--socket", "/a.sock", "card", "reset", "1"]).unwrap();
    assert_eq!(before.socket, Path::new("/a.sock"));
    let after = Cli::try_parse_from([
        "ttctl",
        "card",
        "reset",
        "0000:01:00.0",
        "--socket",
        "/b.sock",
    ])
    .unwrap();
    assert_eq!(after.socket, Path::new("/b.sock"));
    assert!(matches!(
        after.command,
        Command::Card(CardCommand::Reset { ref card }) if card == "0000:01:00.0"
    ));
    if std::env::var_os("TTCTL_SOCKET").is_none() {
        let default = Cli::try_parse_from(["ttctl", "status"]).unwrap();
        assert_eq!(default.socket, Path::new(DEFAULT_SOCKET));
    }
}

#[test]
fn top_interval_outside_its_range_is_a_usage_error_naming_the_range() {
    for (value, says) in [
        ("0.05", "0.05 is outside 0.1..3600 seconds"),
        ("7200", "7200 is outside 0.1..3600 seconds"),
        ("soon", "not a number of seconds"),
    ] {
        let err = Cli::try_parse_from(["ttctl", "top", "--interval", value]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{value}: {err}");
        assert!(err.to_string().contains(says), "{value}: {err}");
    }
    let cli =
        Cli::try_parse_from(["ttctl", "top", "--interval", "0.1", "--iterations", "3"]).unwrap();
    let Command::Top(args) = cli.command else {
        panic!("{cli:?}");
    };
    assert_eq!((args.interval, args.iterations), (0.1, 3));
}

#[test]
fn new_commands_parse_with_their_defaults() {
    let cli = Cli::try_parse_from(["ttctl", "generate", "qwen", "Hello"]).unwrap();
    let Command::Generate(args) = cli.command else {
        panic!("{cli:?}");
    };
    assert_eq!(
        (args.model.as_str(), args.prompt.as_deref()),
        ("qwen", Some("Hello"))
    );
    assert_eq!(args.max_tokens, 64);
    assert!(!args.chat && args.stop.is_empty() && args.seed.is_none());
    assert_eq!(
        crate::generate::request(&args, "Hello".into()).sampling,
        None
    );
    let plain = crate::generate::request(&args, "Hello".into());
    assert!(tt_serving_proto::parameters::requested(&plain).is_empty());

    let cli = Cli::try_parse_from([
        "ttctl",
        "generate",
        "qwen",
        "Hello",
        "--ignore-eos",
        "--min-tokens",
        "4",
        "--presence-penalty",
        "-0.5",
        "--frequency-penalty",
        "1",
        "--repetition-penalty",
        "1.2",
        "--stop-token-id",
        "2",
        "--stop-token-id",
        "7",
    ])
    .unwrap();
    let Command::Generate(args) = cli.command else {
        panic!("{cli:?}");
    };
    let asked = crate::generate::request(&args, "Hello".into());
    assert_eq!(asked.presence_penalty, -0.5);
    assert_eq!(asked.stop_token_ids, [2, 7]);
    assert_eq!(
        tt_serving_proto::parameters::requested(&asked),
        [
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "min_tokens",
            "ignore_eos",
            "stop_token_ids"
        ]
    );

    let cli = Cli::try_parse_from(["ttctl", "logs", "qwen/1"]).unwrap();
    let Command::Logs(args) = cli.command else {
        panic!("{cli:?}");
    };
    assert_eq!(
        (args.slot.as_str(), args.lines, args.follow),
        ("qwen/1", 100, false)
    );
    let cli = Cli::try_parse_from(["ttctl", "logs", "-f", "-n", "20", "qwen"]).unwrap();
    assert!(matches!(
        cli.command,
        Command::Logs(LogsArgs {
            lines: 20,
            follow: true,
            ..
        })
    ));

    assert!(matches!(
        Cli::try_parse_from(["ttctl", "cache", "ls", "--json"])
            .unwrap()
            .command,
        Command::Cache(CacheCommand::Ls { json: true })
    ));
    assert!(matches!(
        Cli::try_parse_from(["ttctl", "slot", "restart", "m/0"]).unwrap().command,
        Command::Slot(SlotCommand::Restart { ref slot, no_wait: false }) if slot == "m/0"
    ));
}

#[test]
fn usage_errors_exit_2_and_help_documents_exit_codes() {
    for argv in [
        &["ttctl"][..],
        &["ttctl", "card"],
        &["ttctl", "card", "reset"],
        &["ttctl", "status", "--bogus"],
        &["ttctl", "generate", "qwen"],
        &["ttctl", "generate", "qwen", "hi", "--max-tokens", "many"],
        &["ttctl", "generate", "qwen", "hi", "--stop"],
        &["ttctl", "logs"],
        &["ttctl", "logs", "qwen", "-n", "-1"],
        &["ttctl", "slot"],
        &["ttctl", "slot", "restart"],
        &["ttctl", "cache"],
        &["ttctl", "cache", "verify"],
        &["ttctl", "cache", "rm"],
    ] {
        let err = Cli::try_parse_from(argv).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{argv:?}: {err}");
    }
    let help = Cli::try_parse_from(["ttctl", "--help"])
        .unwrap_err()
        .to_string();
    assert!(help.contains("Exit codes:"), "{help}");
    assert!(help.contains("3  tt-servingd cannot be reached"), "{help}");
    assert!(help.contains("TTCTL_SOCKET"), "{help}");
}

#[test]
fn the_generate_prompt_comes_from_the_line_a_file_or_stdin() {
    let parse = |argv: &[&str]| -> crate::GenerateArgs {
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Generate(args)) => args,
            other => panic!("{other:?}"),
        }
    };
    let text = |args: &crate::GenerateArgs, stdin: &[u8]| {
        crate::generate::prompt_text(args, &mut std::io::Cursor::new(stdin.to_vec()))
    };
    let long = "word ".repeat(200_000);
    let args = parse(&["ttctl", "generate", "m", "-"]);
    assert_eq!(
        text(&args, long.as_bytes()).ok().as_deref(),
        Some(long.as_str())
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, "from a file").unwrap();
    let args = parse(&[
        "ttctl",
        "generate",
        "m",
        "--prompt-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(text(&args, b"").ok().as_deref(), Some("from a file"));
    let args = parse(&["ttctl", "generate", "m", "--prompt-file", "-"]);
    assert_eq!(text(&args, b"piped").ok().as_deref(), Some("piped"));
    std::fs::write(&file, [0x66, 0xff, 0x66]).unwrap();
    let args = parse(&[
        "ttctl",
        "generate",
        "m",
        "--prompt-file",
        file.to_str().unwrap(),
    ]);
    let Err(crate::outcome::Failure::Failed(why)) = text(&args, b"") else {
        panic!("not UTF-8 is refused");
    };
    assert!(why.contains("is not UTF-8 (byte 1)"), "{why}");
    let missing = dir.path().join("missing");
    let args = parse(&[
        "ttctl",
        "generate",
        "m",
        "--prompt-file",
        missing.to_str().unwrap(),
    ]);
    assert!(
        matches!(text(&args, b""), Err(crate::outcome::Failure::Failed(w)) if w.contains("cannot read the prompt file"))
    );
    // Exactly one of them.
    assert!(Cli::try_parse_from(["ttctl", "generate", "m"]).is_err());
    assert!(Cli::try_parse_from(["ttctl", "generate", "m", "x", "--prompt-file", "f"]).is_err());
}

#[test]
fn audit_since_reads_a_time_or_a_duration_back_from_now() {
    let cli = Cli::try_parse_from([
        "ttctl",
        "audit",
        "--since",
        "2026-12-05T16:00:00+01:00",
        "-n",
        "5",
        "--json",
    ])
    .unwrap();
    let Command::Audit(args) = cli.command else {
        panic!("{cli:?}");
    };
    assert_eq!(
        (args.since, args.lines, args.json),
        (Some(1_796_482_800_000), 5, true)
    );
    let before = tt_serving_proto::time::now_unix_ms();
    let Command::Audit(args) = Cli::try_parse_from(["ttctl", "audit", "--since", "2h"])
        .unwrap()
        .command
    else {
        panic!("not audit");
    };
    let since = args.since.unwrap();
    assert!(since <= before - 7_200_000 + 1_000 && since + 7_200_000 >= before);
    for bad in [
        "yesterday",
        "15",
        "m",
        "99999999999999999999d",
        "2026-12-05",
    ] {
        let err = Cli::try_parse_from(["ttctl", "audit", "--since", bad]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{bad}");
    }
}

#[test]
fn usage_takes_since_a_key_and_json() {
    let cli = Cli::try_parse_from([
        "ttctl",
        "usage",
        "--since",
        "2026-12-05T16:00:00+01:00",
        "--key",
        "team-a",
        "--json",
    ])
    .unwrap();
    let Command::Usage(args) = cli.command else {
        panic!("{cli:?}");
    };
    assert_eq!(
        (args.since, args.key.as_deref(), args.json),
        (Some(1_796_482_800_000), Some("team-a"), true)
    );
    let Command::Usage(args) = Cli::try_parse_from(["ttctl", "usage"]).unwrap().command else {
        panic!("not usage");
    };
    assert_eq!((args.since, args.key, args.json), (None, None, false));
    let err = Cli::try_parse_from(["ttctl", "usage", "--since", "yesterday"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
}
