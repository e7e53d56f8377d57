//! The fake `tt-smi`: the subset of the tt-smi 6.8 command line the
//! daemon and operators use, with the real tool's wording, exit codes and
//! timing quirks.
//!
//! Arguments are parsed the way Python's argparse parses the real tool's
//! (`-r` takes zero or more values, long options may be abbreviated, unknown
//! arguments are collected and reported together with exit 2), because the
//! daemon's reset code must be written against that behaviour, not against a
//! friendlier one.
//!
//! The quirk that matters most: `tt-smi -r` returns — exit 0 — while the
//! boards are still gone. The real tool does the same (DESIGN.md section 2),
//! which is why the daemon proves every card is back before using it.

use std::io::Write;

use crate::layout::{present_cards, read_attr, vanish_card, Layout, PresentCard};
use crate::running::FirmwareState;
use crate::snapshot;
use crate::state::{self, PendingReset, SmiInvocation, StateLock};

/// The version the fake reports, the real tool's it mirrors.
pub const TT_SMI_VERSION: &str = "6.8.0";

/// Runs the fake `tt-smi` against the root with `args` (the arguments
/// after the program name), writing what the real tool would print to `out`
/// and `err`, appending the run to `fakehw/tt-smi.log`, and returning the
/// exit code.
pub fn run_smi(
    root: &std::path::Path,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let layout = Layout::new(root);
    if !layout.cards_file().is_file() {
        say(
            err,
            &format!(
                "tt-smi (tt-fakehw): {} is not a fake hardware root (no fakehw/cards.json); \
                 create one with `tt-fakehw create --root {} --cards N`",
                root.display(),
                root.display()
            ),
        );
        return 1;
    }
    let code = run(&layout, args, out, err);
    let entry = SmiInvocation {
        unix_ms: state::now_unix_ms(),
        args: args.to_vec(),
        exit_code: code,
    };
    if let Err(e) = state::append_smi_log(&layout, &entry) {
        say(
            err,
            &format!("tt-smi (tt-fakehw): could not log this run: {e}"),
        );
    }
    code
}

fn run(layout: &Layout, args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let args = match parse_args(args) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Help) => {
            say(out, HELP);
            return 0;
        }
        Ok(Parsed::Version) => {
            say(out, TT_SMI_VERSION);
            return 0;
        }
        Err(message) => {
            say(err, USAGE);
            say(err, &format!("tt-smi: error: {message}"));
            return 2;
        }
    };

    if !layout.module_dir().is_dir() {
        say(
            out,
            " No Tenstorrent driver detected! Please install driver using tt-kmd: \
             https://github.com/tenstorrent/tt-kmd ",
        );
        return 1;
    }

    if let Some(targets) = &args.reset {
        // Not something the real tool prints: without the fake's firmware
        // loop no reset completes, which would look like broken cards.
        let firmware = FirmwareState::of(layout);
        if !matches!(firmware, FirmwareState::Running { .. }) {
            say(
                err,
                &format!("tt-smi (tt-fakehw): {}", firmware.describe(layout.root())),
            );
        }
        return reset(layout, targets, args.no_reinit, out);
    }
    if args.list {
        return list(layout, out, err);
    }
    if args.snapshot || args.snapshot_no_tty {
        return match snapshot::snapshot_json(layout) {
            Ok(json) => {
                say(out, &json);
                0
            }
            Err(e) => {
                say(err, &format!(" Error while reading devices: {e} "));
                1
            }
        };
    }
    say(
        err,
        "tt-smi (tt-fakehw): the interactive display is not part of the fake; \
         use -s for a snapshot, -ls to list boards or -r to reset",
    );
    1
}

/// Writes one line, ignoring a closed pipe: the exit code is what matters.
fn say(w: &mut dyn Write, line: &str) {
    let _ = writeln!(w, "{line}");
}

/// The arguments of one run, after parsing.
#[derive(Debug, Default, PartialEq, Eq)]
struct SmiArgs {
    /// `-r` given: the raw values after it (possibly none).
    reset: Option<Vec<String>>,
    /// `-ls` / `--list`.
    list: bool,
    /// `-s` / `--snapshot`.
    snapshot: bool,
    /// `--snapshot_no_tty`.
    snapshot_no_tty: bool,
    /// `--no_reinit`: skip the re-initialisation after a reset.
    no_reinit: bool,
}

/// What argparse would do with the command line.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// Carry on with these arguments.
    Run(SmiArgs),
    /// `-h`: print help, exit 0.
    Help,
    /// `-v`: print the version, exit 0.
    Version,
}

/// The options of the real parser that the fake accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opt {
    Help,
    Local,
    Version,
    Snapshot,
    List,
    Compact,
    Reset,
    SnapshotNoTty,
    NoReinit,
}

/// Option strings, as the real tool registers them.
const OPTIONS: &[(&str, Opt)] = &[
    ("-h", Opt::Help),
    ("--help", Opt::Help),
    ("-l", Opt::Local),
    ("--local", Opt::Local),
    ("-v", Opt::Version),
    ("--version", Opt::Version),
    ("-s", Opt::Snapshot),
    ("--snapshot", Opt::Snapshot),
    ("-ls", Opt::List),
    ("--list", Opt::List),
    ("-c", Opt::Compact),
    ("--compact", Opt::Compact),
    ("-r", Opt::Reset),
    ("--reset", Opt::Reset),
    ("--snapshot_no_tty", Opt::SnapshotNoTty),
    ("--no_reinit", Opt::NoReinit),
];

/// How argparse names an option in its messages, e.g. `-s/--snapshot`.
fn display_name(opt: Opt) -> String {
    OPTIONS
        .iter()
        .filter(|(_, o)| *o == opt)
        .map(|(s, _)| *s)
        .collect::<Vec<_>>()
        .join("/")
}

fn lookup_exact(s: &str) -> Option<Opt> {
    OPTIONS.iter().find(|(name, _)| *name == s).map(|(_, o)| *o)
}

/// True for a token argparse would treat as an option rather than a value.
/// The parser has no options that look like negative numbers, so `-1` is a value.
fn looks_like_option(token: &str) -> bool {
    token.len() > 1
        && token.starts_with('-')
        && !token[1..].chars().all(|c| c.is_ascii_digit() || c == '.')
}

/// Parses the real tool's command line. `Err` is argparse's error message
/// (the part after `tt-smi: error: `).
fn parse_args(argv: &[String]) -> Result<Parsed, String> {
    let mut args = SmiArgs::default();
    let mut unrecognized: Vec<String> = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let token = &argv[i];
        i += 1;
        if token == "--" {
            unrecognized.extend(argv[i..].iter().cloned());
            break;
        }
        if !looks_like_option(token) {
            unrecognized.push(token.clone());
            continue;
        }
        // Resolve the token to (option, explicit value attached to it).
        let (opt, explicit): (Opt, Option<String>) = if let Some(long) = token.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (format!("--{n}"), Some(v.to_string())),
                None => (token.clone(), None),
            };
            if let Some(opt) = lookup_exact(&name) {
                (opt, value)
            } else {
                let matches: Vec<&str> = OPTIONS
                    .iter()
                    .map(|(s, _)| *s)
                    .filter(|s| s.starts_with("--") && s.starts_with(name.as_str()))
                    .collect();
                match matches.as_slice() {
                    [one] => match lookup_exact(one) {
                        Some(opt) => (opt, value),
                        None => {
                            unrecognized.push(token.clone());
                            continue;
                        }
                    },
                    [] => {
                        unrecognized.push(token.clone());
                        continue;
                    }
                    many => {
                        return Err(format!(
                            "ambiguous option: {name} could match {}",
                            many.join(", ")
                        ))
                    }
                }
            }
        } else if let Some(opt) = lookup_exact(token) {
            (opt, None)
        } else {
            // `-rVALUE`, or several single-letter flags run together (`-sc`).
            let head: String = token.chars().take(2).collect();
            let rest: String = token.chars().skip(2).collect();
            match lookup_exact(&head) {
                Some(Opt::Reset) => (Opt::Reset, Some(rest)),
                Some(opt) => {
                    let mut flags = vec![opt];
                    for c in rest.chars() {
                        match lookup_exact(&format!("-{c}")) {
                            Some(Opt::Reset) | None => {
                                return Err(format!(
                                    "argument {}: ignored explicit argument '{}'",
                                    display_name(opt),
                                    rest
                                ))
                            }
                            Some(flag) => flags.push(flag),
                        }
                    }
                    let last = flags.pop().unwrap_or(opt);
                    for flag in flags {
                        if let Some(done) = apply_flag(&mut args, flag) {
                            return Ok(done);
                        }
                    }
                    (last, None)
                }
                None => {
                    unrecognized.push(token.clone());
                    continue;
                }
            }
        };

        if opt == Opt::Reset {
            let mut values = Vec::new();
            if let Some(v) = explicit {
                values.push(v);
            } else {
                while i < argv.len() && !looks_like_option(&argv[i]) && argv[i] != "--" {
                    values.push(argv[i].clone());
                    i += 1;
                }
            }
            args.reset = Some(values);
            continue;
        }
        if let Some(value) = explicit {
            return Err(format!(
                "argument {}: ignored explicit argument '{}'",
                display_name(opt),
                value
            ));
        }
        if let Some(done) = apply_flag(&mut args, opt) {
            return Ok(done);
        }
    }
    if !unrecognized.is_empty() {
        return Err(format!(
            "unrecognized arguments: {}",
            unrecognized.join(" ")
        ));
    }
    Ok(Parsed::Run(args))
}

/// Applies a value-less option; `Some` when it ends parsing (help, version).
fn apply_flag(args: &mut SmiArgs, opt: Opt) -> Option<Parsed> {
    match opt {
        Opt::Help => return Some(Parsed::Help),
        Opt::Version => return Some(Parsed::Version),
        Opt::Snapshot => args.snapshot = true,
        Opt::List => args.list = true,
        Opt::SnapshotNoTty => args.snapshot_no_tty = true,
        Opt::NoReinit => args.no_reinit = true,
        // Accepted for compatibility; they change nothing without a TUI or
        // Wormhole boards.
        Opt::Local | Opt::Compact => {}
        Opt::Reset => args.reset = Some(Vec::new()),
    }
    None
}

const USAGE: &str =
    "usage: tt-smi [-h] [-l] [-v] [-s] [-ls] [-c] [-r [0,1 ...]] [--snapshot_no_tty] [--no_reinit]";

const HELP: &str = "\
usage: tt-smi [-h] [-l] [-v] [-s] [-ls] [-c] [-r [0,1 ...]] [--snapshot_no_tty] [--no_reinit]

Tenstorrent System Management Interface (TT-SMI) is a command line utility to
interact with all Tenstorrent devices on host. (This is tt-fakehw's stand-in,
driving a fake hardware root.)

options:
  -h, --help            show this help message and exit
  -l, --local           Run on local chips (Wormhole only)
  -v, --version         show program's version number and exit
  -s, --snapshot        Dump snapshot of current tt-smi information to STDOUT
  -ls, --list           List boards that are available on host and quit
  -c, --compact         Run in compact mode, hiding the sidebar and other static elements
  -r [0,1 ...], --reset [0,1 ...]
                        Provide a list of PCI indices, /dev/tenstorrent/N paths or PCI BDFs.
                        Find PCI index of board using the -ls option. If no indices are
                        provided, all devices will be reset
  --snapshot_no_tty     Force no-tty behavior in the snapshot to stdout
  --no_reinit           Don't detect devices post reset";

/// One reset target as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `/dev/tenstorrent/N` or a plain `N`.
    Index(u32),
    /// A PCI BDF, normalised to the `0000:bb:dd.f` form.
    Bdf(String),
}

/// Classifies one comma-separated token the way tt-smi 6.8 does.
fn classify(token: &str) -> Result<Target, String> {
    if let Some(n) = token.strip_prefix("/dev/tenstorrent/") {
        return n
            .parse()
            .map(Target::Index)
            .map_err(|_| format!("Invalid path: {token} (expected /dev/tenstorrent/<integer>)"));
    }
    if is_bdf(token) {
        return Ok(Target::Bdf(token.to_ascii_lowercase()));
    }
    if token.len() == 7 && is_bdf(&format!("0000:{token}")) {
        return Ok(Target::Bdf(format!("0000:{}", token.to_ascii_lowercase())));
    }
    if let Ok(n) = token.parse() {
        return Ok(Target::Index(n));
    }
    Err(format!(
        "Invalid reset target: '{token}'. Use UMD logical ID (integer), PCI BDF \
         (e.g. 0000:0a:00.0 or 0a:00.0), or /dev/tenstorrent/<integer>."
    ))
}

/// True for a full BDF, `dddd:bb:dd.f` in hex.
fn is_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && matches!(b[11], b'0'..=b'7')
        && [0, 1, 2, 3, 5, 6, 8, 9]
            .iter()
            .all(|&i| b[i].is_ascii_hexdigit())
}

/// Turns the `-r` values into the present cards to reset, or the message
/// the real tool prints before exiting 1.
fn resolve_targets(values: &[String], present: &[PresentCard]) -> Result<Vec<PresentCard>, String> {
    let tokens: Vec<&str> = values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if tokens.is_empty() || (tokens.len() == 1 && tokens[0].eq_ignore_ascii_case("all")) {
        if present.is_empty() {
            return Err(" No Tenstorrent devices detected! Nothing to reset. ".to_string());
        }
        return Ok(present.to_vec());
    }
    let mut chosen: Vec<PresentCard> = Vec::new();
    for token in tokens {
        if token.eq_ignore_ascii_case("all") {
            return Err(" Use 'all' as the only argument to reset all devices ".to_string());
        }
        let target = classify(token).map_err(|m| format!(" {m} "))?;
        let found = present.iter().find(|c| match &target {
            Target::Index(n) => c.index == *n,
            Target::Bdf(bdf) => c.bdf == *bdf,
        });
        let Some(card) = found else {
            let present_list = present
                .iter()
                .map(|c| format!("{} ({})", c.index, c.bdf))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(format!(
                " No Tenstorrent device found for reset target '{token}'. \
                 Devices on host: [{present_list}]. Use tt-smi -ls to list boards. "
            ));
        };
        if !chosen.contains(card) {
            chosen.push(card.clone());
        }
    }
    chosen.sort_by_key(|c| c.index);
    Ok(chosen)
}

/// `tt-smi -r`: makes the targets vanish, leaves their return to the
/// firmware, and exits 0 without waiting for it.
fn reset(layout: &Layout, values: &[String], no_reinit: bool, out: &mut dyn Write) -> i32 {
    match reset_inner(layout, values, no_reinit, out) {
        Ok(code) => code,
        Err(e) => {
            say(out, &format!(" Error while resetting devices: {e} "));
            1
        }
    }
}

fn reset_inner(
    layout: &Layout,
    values: &[String],
    no_reinit: bool,
    out: &mut dyn Write,
) -> crate::Result<i32> {
    let _lock = StateLock::acquire(layout)?;
    let inventory = state::load_inventory(layout)?;
    let faults = state::load_faults(layout)?;
    let present = present_cards(layout)?;
    let targets = match resolve_targets(values, &present) {
        Ok(t) => t,
        Err(message) => {
            say(out, &message);
            return Ok(1);
        }
    };
    let indices = targets
        .iter()
        .map(|c| c.index.to_string())
        .collect::<Vec<_>>()
        .join(", ");

    say(
        out,
        &format!(" Starting PCI link reset on BH devices at PCI indices: {indices} "),
    );

    if let Some(failing) = targets
        .iter()
        .find(|c| faults.get(&c.bdf).is_some_and(|f| f.smi_exit_1))
    {
        say(
            out,
            &format!(" Finishing PCI link reset on BH devices at PCI indices: {indices} "),
        );
        say(out, " Re-initializing boards after reset....");
        say(
            out,
            &format!(
                " Error when re-initializing chips!\n  Failed to initialize chip at PCI index {} \
                 ({}): timed out waiting for ARC firmware to respond ",
                failing.index, failing.bdf
            ),
        );
        return Ok(1);
    }

    say(
        out,
        " Waiting for up to 60 seconds for asic to come back after reset",
    );
    let mut pending = state::load_pending(layout)?;
    let now = state::now_unix_ms();
    for card in &targets {
        vanish_card(layout, &card.bdf, card.index)?;
        let delay = faults
            .get(&card.bdf)
            .and_then(|f| f.slow_delay_ms)
            .unwrap_or(inventory.reset_delay_ms);
        pending.retain(|p| p.bdf != card.bdf);
        pending.push(PendingReset {
            bdf: card.bdf.clone(),
            old_index: card.index,
            due_unix_ms: now.saturating_add(delay),
        });
        say(
            out,
            &format!(" Config space reset completed for device {} ", card.index),
        );
    }
    state::save_pending(layout, &pending)?;
    say(
        out,
        &format!(" Finishing PCI link reset on BH devices at PCI indices: {indices} "),
    );
    if !no_reinit {
        // Like the real tool, re-detection runs right away and counts
        // whatever is on the bus now — which excludes the cards still coming
        // back. The exit code stays 0 regardless.
        say(out, " Re-initializing boards after reset....");
        let detected = present_cards(layout)?.len();
        say(out, &format!(" Detected Chips: {detected}"));
    }
    Ok(0)
}

/// `tt-smi -ls`: a plain table of the present boards.
fn list(layout: &Layout, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let present = match present_cards(layout) {
        Ok(p) => p,
        Err(e) => {
            say(err, &format!(" Error while listing devices: {e} "));
            return 1;
        }
    };
    say(out, "All available boards on host:");
    say(
        out,
        &format!(
            "{:<12} {:<12} {:<15} {:<18} {:<14}",
            "PCI Dev ID", "Board Type", "Device Series", "Board Number", "PCI BDF"
        ),
    );
    for card in present {
        let class = layout.class_dir(&card.bdf, card.index);
        let series = read_attr(&class.join("tt_card_type")).unwrap_or_else(|_| "N/A".into());
        let serial = read_attr(&class.join("tt_serial")).unwrap_or_else(|_| "N/A".into());
        say(
            out,
            &format!(
                "{:<12} {:<12} {:<15} {:<18} {:<14}",
                card.index, "Blackhole", series, serial, card.bdf
            ),
        );
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed, String> {
        parse_args(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn run_args(args: &[&str]) -> SmiArgs {
        match parse(args) {
            Ok(Parsed::Run(a)) => a,
            other => panic!("expected Run for {args:?}, got {other:?}"),
        }
    }

    #[test]
    fn reset_takes_zero_or_more_values() {
        assert_eq!(run_args(&["-r"]).reset, Some(vec![]));
        assert_eq!(
            run_args(&["-r", "/dev/tenstorrent/0,1"]).reset,
            Some(vec!["/dev/tenstorrent/0,1".to_string()])
        );
        assert_eq!(
            run_args(&["--reset", "0", "1", "-s"]),
            SmiArgs {
                reset: Some(vec!["0".into(), "1".into()]),
                snapshot: true,
                ..Default::default()
            }
        );
        assert_eq!(run_args(&["--reset=0,1"]).reset, Some(vec!["0,1".into()]));
        assert_eq!(run_args(&["-r0"]).reset, Some(vec!["0".into()]));
    }

    #[test]
    fn list_and_snapshot_flags() {
        assert!(run_args(&["-ls"]).list);
        assert!(run_args(&["--list"]).list);
        assert!(run_args(&["-s"]).snapshot);
        assert!(run_args(&["--snapshot_no_tty"]).snapshot_no_tty);
        assert!(run_args(&["--snapshot_n"]).snapshot_no_tty);
        assert!(run_args(&["--no_r", "-r"]).no_reinit);
    }

    #[test]
    fn help_and_version_end_parsing() {
        assert_eq!(parse(&["-h"]), Ok(Parsed::Help));
        assert_eq!(parse(&["--bogus", "--help"]), Ok(Parsed::Help));
        assert_eq!(parse(&["-v"]), Ok(Parsed::Version));
        assert_eq!(parse(&["--vers"]), Ok(Parsed::Version));
    }

    #[test]
    fn errors_read_like_argparse() {
        assert_eq!(
            parse(&["--bogus", "x"]),
            Err("unrecognized arguments: --bogus x".to_string())
        );
        assert_eq!(
            parse(&["--snap"]),
            Err("ambiguous option: --snap could match --snapshot, --snapshot_no_tty".to_string())
        );
        assert_eq!(
            parse(&["--snapshot=1"]),
            Err("argument -s/--snapshot: ignored explicit argument '1'".to_string())
        );
    }

    #[test]
    fn targets_are_classified_like_tt_smi() {
        assert_eq!(classify("/dev/tenstorrent/3"), Ok(Target::Index(3)));
        assert_eq!(classify("2"), Ok(Target::Index(2)));
        assert_eq!(
            classify("0000:0A:00.0"),
            Ok(Target::Bdf("0000:0a:00.0".into()))
        );
        assert_eq!(classify("01:00.0"), Ok(Target::Bdf("0000:01:00.0".into())));
        assert!(classify("/dev/tenstorrent/x").is_err());
        assert!(classify("card0").is_err());
    }

    #[test]
    fn unknown_target_is_refused() {
        let present = vec![PresentCard {
            index: 0,
            bdf: "0000:01:00.0".into(),
        }];
        assert!(resolve_targets(&["5".into()], &present).is_err());
        assert!(resolve_targets(&["0000:09:00.0".into()], &present).is_err());
        assert_eq!(
            resolve_targets(&["0,/dev/tenstorrent/0".into()], &present),
            Ok(present.clone())
        );
        assert_eq!(resolve_targets(&["all".into()], &present), Ok(present));
        assert!(resolve_targets(&[], &[]).is_err());
    }
}
