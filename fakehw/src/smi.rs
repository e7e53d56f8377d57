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

use crate::layout::{
    begin_in_place_reset, present_cards, read_attr, vanish_card, Layout, PresentCard,
};
use crate::running::FirmwareState;
use crate::snapshot;
use crate::state::{self, PendingReset, SmiInvocation, StateLock};

/// The version the fake reports, the real tool's it mirrors.
pub const TT_SMI_VERSION: &str = "6.8.0";

/// Runs the fake `tt-smi` against the root with `args` (the arguments
/// after the program name), writing what the real tool would print to `out`
/// and `err`, appending the run to `fakehw/tt-smi.log`, and returning the
/// exit code. A run cannot hang in process: one that would (the
/// `smi-hangs` fault) is logged as hung, says so on `err` and returns
/// [`HUNG_EXIT_CODE`]; the binary hangs for real ([`run_smi_to_end`]).
pub fn run_smi(
    root: &std::path::Path,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    match run_smi_to_end(root, args, out, err) {
        SmiEnd::Exit(code) => code,
        SmiEnd::Hang(hang) => {
            say(
                err,
                "tt-smi (tt-fakehw): this reset hangs (smi-hangs fault); run in process it returns 137 instead, what the SIGKILL that ends it gives",
            );
            hang.log(Vec::new(), err);
            HUNG_EXIT_CODE
        }
    }
}

/// What a hung run is logged with: 128 + SIGKILL, the only way it ends.
pub const HUNG_EXIT_CODE: i32 = 137;

/// How a run of the fake `tt-smi` ends.
#[derive(Debug)]
pub enum SmiEnd {
    /// It exits with this code (128 + N: it dies of signal N); logged.
    Exit(i32),
    /// It hangs ([`SmiHang::hang_until_killed`]); not logged yet.
    Hang(SmiHang),
}

/// A run of the fake `tt-smi` that hangs (the `smi-hangs` fault).
#[derive(Debug)]
pub struct SmiHang {
    layout: Layout,
    entry: SmiInvocation,
}

impl SmiHang {
    fn log(mut self, pids: Vec<u32>, err: &mut dyn Write) {
        self.entry.pids = pids;
        if let Err(e) = state::append_smi_log(&self.layout, &self.entry) {
            say(
                err,
                &format!("tt-smi (tt-fakehw): could not log this run: {e}"),
            );
        }
    }

    /// Hangs as tt-smi stuck in the reset ioctl does: deaf to SIGTERM,
    /// SIGINT and SIGHUP, with a forked child deaf to them too (what the
    /// tool started), so that only SIGKILL to the whole process group ends
    /// it. The run is logged, with both pids, once both hang.
    pub fn hang_until_killed(self, err: &mut dyn Write) -> ! {
        use nix::sys::signal::{signal, SigHandler, Signal};
        for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            // SAFETY: ignoring a signal installs no handler; the child
            // inherits it across fork.
            let _ = unsafe { signal(sig, SigHandler::SigIgn) };
        }
        let _ = std::io::stdout().flush();
        let _ = err.flush();
        let mut pids = vec![std::process::id()];
        // SAFETY: the child only sleeps (nanosleep is async-signal-safe),
        // whatever threads the parent has.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => sleep_forever(),
            Ok(nix::unistd::ForkResult::Parent { child }) => {
                pids.extend(u32::try_from(child.as_raw()).ok());
            }
            Err(e) => say(
                err,
                &format!("tt-smi (tt-fakehw): could not fork the hanging child: {e}"),
            ),
        }
        self.log(pids, err);
        sleep_forever()
    }
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// Runs the fake `tt-smi` as [`run_smi`] does, except that a run that
/// hangs is handed back unlogged, for the caller to hang in
/// ([`SmiHang::hang_until_killed`], what the binary does).
pub fn run_smi_to_end(
    root: &std::path::Path,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> SmiEnd {
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
        return SmiEnd::Exit(1);
    }
    let (code, reset_bdfs, hangs) = run(&layout, args, out, err);
    let entry = SmiInvocation {
        unix_ms: state::now_unix_ms(),
        args: args.to_vec(),
        exit_code: code,
        reset_bdfs,
        hung: hangs,
        pids: Vec::new(),
    };
    if hangs {
        return SmiEnd::Hang(SmiHang { layout, entry });
    }
    if let Err(e) = state::append_smi_log(&layout, &entry) {
        say(
            err,
            &format!("tt-smi (tt-fakehw): could not log this run: {e}"),
        );
    }
    SmiEnd::Exit(code)
}

/// One run: its exit code (128 + N for a death by signal N, which the
/// binary then dies of), the cards it reset, and whether it hangs instead.
fn run(
    layout: &Layout,
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> (i32, Vec<String>, bool) {
    let args = match parse_args(args) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Help) => {
            say(out, HELP);
            return (0, Vec::new(), false);
        }
        Ok(Parsed::Version) => {
            let version = state::load_inventory(layout)
                .map(|i| i.tt_smi_version)
                .unwrap_or_else(|_| TT_SMI_VERSION.to_string());
            say(out, &version);
            return (0, Vec::new(), false);
        }
        Err(message) => {
            say(err, USAGE);
            say(err, &format!("tt-smi: error: {message}"));
            return (2, Vec::new(), false);
        }
    };

    // main() checks the driver before anything else (tt_smi.py).
    if !layout.module_dir().join("version").is_file() {
        say(
            out,
            &red(
                "No Tenstorrent driver detected! Please install driver using tt-kmd: \
                  https://github.com/tenstorrent/tt-kmd ",
            ),
        );
        return (1, Vec::new(), false);
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
        let run = reset(layout, targets, args.no_reinit, out);
        let code = match run.signal {
            Some(signal) => 128 + signal,
            None => run.code,
        };
        return (code, run.reset_bdfs, run.hangs);
    }
    if args.list {
        return (list(layout, out, err), Vec::new(), false);
    }
    if args.snapshot || args.snapshot_no_tty {
        return match snapshot::snapshot_json(layout) {
            Ok(json) => {
                say(out, &json);
                (0, Vec::new(), false)
            }
            Err(e) => {
                say(err, &format!(" Error while reading devices: {e} "));
                (1, Vec::new(), false)
            }
        };
    }
    say(
        err,
        "tt-smi (tt-fakehw): the interactive display is not part of the fake; \
         use -s for a snapshot, -ls to list boards or -r to reset",
    );
    (1, Vec::new(), false)
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

/// tt-smi's colours around a message (`tt_tools_common` CMD_LINE_COLOR),
/// printed even without a terminal, as `print(RED, msg, ENDC)` does.
fn red(msg: &str) -> String {
    format!("\x1b[91m {msg} \x1b[0m")
}

fn purple(msg: &str) -> String {
    format!("\x1b[95m {msg} \x1b[0m")
}

/// What `-r` selects, as tt-smi 6.8 classifies it (`device_input.py`
/// `parse_smi_device_input`): one kind per call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selection {
    /// No target, or `all` alone: every card.
    All,
    /// Bare integers: UMD logical ids, positions in PCI-address order.
    LogicalIds(Vec<i64>),
    /// Full PCI addresses, kept as typed (tt-umd compares them exactly).
    Bdfs(Vec<String>),
    /// `/dev/tenstorrent/N`: device indices.
    DevIds(Vec<u32>),
    /// tt-smi before 4.2.0: integer device indices (tt_tools_common
    /// `parse_reset_input` ID_LIST, reset through luwen).
    LegacyIndices(Vec<u32>),
}

/// tt-smi 6.8's kind names, as its mixed-kinds message prints them.
fn kind_name(s: &Selection) -> &'static str {
    match s {
        Selection::LogicalIds(_) => "UMD_LOGICAL_ID",
        Selection::Bdfs(_) => "PCI_BDF",
        Selection::DevIds(_) => "DEV_TENSTORRENT_ID",
        Selection::All | Selection::LegacyIndices(_) => "ALL",
    }
}

/// True for a full BDF as tt-smi's `PCI_BDF_FULL_RE` matches it:
/// `hhhh:hh:hh.h` in hex of either case (function digit included).
fn is_full_bdf(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && [0, 1, 2, 3, 5, 6, 8, 9, 11]
            .iter()
            .all(|&i| b[i].is_ascii_hexdigit())
}

/// Classifies the `-r` values the way tt-smi 6.8 does; `Err` is the
/// message it prints before exiting 1.
fn select_68(values: &[String]) -> Result<Selection, String> {
    let inputs: Vec<&str> = values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if inputs.is_empty() || (inputs.len() == 1 && inputs[0].eq_ignore_ascii_case("all")) {
        return Ok(Selection::All);
    }
    let mut selection: Option<Selection> = None;
    for input in inputs {
        let one = if input.eq_ignore_ascii_case("all") {
            return Err("Use 'all' as the only argument to select all devices".into());
        } else if let Some(suffix) = input.strip_prefix("/dev/tenstorrent/") {
            let suffix = suffix.trim();
            match suffix.parse::<u32>() {
                Ok(n) if suffix.chars().all(|c| c.is_ascii_digit()) => Selection::DevIds(vec![n]),
                _ => {
                    return Err(format!(
                        "Invalid path: {input} (expected /dev/tenstorrent/<integer>)"
                    ))
                }
            }
        } else if is_full_bdf(input) {
            Selection::Bdfs(vec![input.to_string()])
        } else if !input.trim_start_matches('-').is_empty()
            && input
                .trim_start_matches('-')
                .chars()
                .all(|c| c.is_ascii_digit())
        {
            // Python's int() of what passed `lstrip("-").isdigit()`.
            match input.parse::<i64>() {
                Ok(n) => Selection::LogicalIds(vec![n]),
                Err(_) => return Err(format!("invalid literal for int() with base 10: '{input}'")),
            }
        } else {
            return Err(format!(
                "Invalid device target: '{input}'. Use UMD logical ID (integer), PCI BDF \
                 (e.g. 0000:0a:00.0), or /dev/tenstorrent/<integer>."
            ));
        };
        selection = Some(match (selection, one) {
            (None, one) => one,
            (Some(Selection::LogicalIds(mut v)), Selection::LogicalIds(w)) => {
                if !v.contains(&w[0]) {
                    v.push(w[0]);
                }
                Selection::LogicalIds(v)
            }
            (Some(Selection::Bdfs(mut v)), Selection::Bdfs(w)) => {
                if !v.contains(&w[0]) {
                    v.push(w[0].clone());
                }
                Selection::Bdfs(v)
            }
            (Some(Selection::DevIds(mut v)), Selection::DevIds(w)) => {
                if !v.contains(&w[0]) {
                    v.push(w[0]);
                }
                Selection::DevIds(v)
            }
            (Some(earlier), one) => {
                return Err(format!(
                    "Mixed device target kinds are not allowed. Got '{input}' which is a {}, \
                     but earlier inputs were {}. Use only one kind per invocation.",
                    kind_name(&one),
                    kind_name(&earlier)
                ))
            }
        });
    }
    Ok(match selection {
        Some(Selection::LogicalIds(mut v)) => {
            v.sort_unstable();
            Selection::LogicalIds(v)
        }
        Some(Selection::DevIds(mut v)) => {
            v.sort_unstable();
            Selection::DevIds(v)
        }
        Some(other) => other,
        None => Selection::All,
    })
}

/// What an old tt-smi (before 4.2.0) does with `-r` values
/// (tt_tools_common 1.6 `reset_common/reset_utils.py` parse_reset_input):
/// `all` or nothing, one value that names a file (read as a JSON reset
/// config — a `/dev/tenstorrent/N` path included), or integers.
fn select_legacy(layout: &Layout, values: &[String]) -> Result<Selection, String> {
    if values.is_empty() || (values.len() == 1 && values[0] == "all") {
        return Ok(Selection::All);
    }
    const INVALID: &str = "Invalid input! Provide list of comma separated numbers or a json file.\n To generate a reset json config file run tt-smi -g";
    let ints = |items: Vec<&str>| -> Result<Selection, String> {
        let mut v: Vec<u32> = Vec::new();
        for item in items {
            v.push(item.trim().parse().map_err(|_| INVALID.to_string())?);
        }
        v.sort_unstable();
        v.dedup();
        Ok(Selection::LegacyIndices(v))
    };
    if values.len() == 1 {
        let value = &values[0];
        // It opens the value as a file first. A path under /dev is looked
        // up in the fake root's dev dir, where the nodes are plain empty
        // files: json.load fails on them as on a real node.
        let path = match value.strip_prefix("/dev/") {
            Some(rest) => layout.dev_root().join(rest),
            None => std::path::PathBuf::from(value),
        };
        if path.exists() {
            return Err("Please check the format of the json file.\n Expecting value: line 1 column 1 (char 0)\n\
                 Traceback (most recent call last):\n  ...\nAttributeError: 'NoneType' object has no attribute 'type'"
                .to_string());
        }
        return ints(value.split(',').collect());
    }
    ints(values.iter().map(String::as_str).collect())
}

/// Python's repr of a list of strings.
fn py_strs(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("'{s}'")).collect();
    format!("[{}]", items.join(", "))
}

/// Python's repr of a list of integers.
fn py_ints<T: std::fmt::Display>(v: &[T]) -> String {
    let items: Vec<String> = v.iter().map(|n| n.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// tt-umd's `warm_reset` with the cards a selection matched: an empty list
/// means every card on the host (`warm_reset.cpp`: "If pci_device_ids is
/// empty, enumerate all devices").
fn or_every_card(chosen: Vec<PresentCard>, present: &[PresentCard]) -> Vec<PresentCard> {
    if chosen.is_empty() {
        present.to_vec()
    } else {
        chosen
    }
}

/// What one `-r` run did, for the log.
#[derive(Default)]
struct ResetRun {
    code: i32,
    reset_bdfs: Vec<String>,
    /// Die by this signal instead of exiting (tt-umd indexing out of
    /// bounds for a negative logical id).
    signal: Option<i32>,
    /// Hang instead of exiting (the `smi-hangs` fault).
    hangs: bool,
}

/// `tt-smi -r`: resolves the targets as the real tool does, resets them
/// (in place, or off the bus for a hot-plug card or a driver before
/// 2.4.1), leaves their return to the firmware, and exits without waiting
/// for it.
fn reset(layout: &Layout, values: &[String], no_reinit: bool, out: &mut dyn Write) -> ResetRun {
    match reset_inner(layout, values, no_reinit, out) {
        Ok(run) => run,
        Err(e) => {
            say(out, &red(&format!("Error while resetting devices: {e}")));
            ResetRun {
                code: 1,
                ..ResetRun::default()
            }
        }
    }
}

fn reset_inner(
    layout: &Layout,
    values: &[String],
    no_reinit: bool,
    out: &mut dyn Write,
) -> crate::Result<ResetRun> {
    let _lock = StateLock::acquire(layout)?;
    let inventory = state::load_inventory(layout)?;
    let faults = state::load_faults(layout)?;
    let present = present_cards(layout)?;
    let failed = |code| ResetRun {
        code,
        ..ResetRun::default()
    };
    let legacy = !crate::kmd::tt_smi_takes_bdfs(&inventory.tt_smi_version);
    let selection = if legacy {
        select_legacy(layout, values)
    } else {
        select_68(values)
    };
    let selection = match selection {
        Ok(s) => s,
        Err(message) => {
            say(out, &red(&message));
            return Ok(failed(1));
        }
    };
    // UMD logical ids are positions in PCI-address order (tt-umd
    // enumerate_devices sorts by BDF).
    let mut by_bdf = present.clone();
    by_bdf.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    let targets: Vec<PresentCard> = match &selection {
        Selection::All => {
            let ids: Vec<u32> = present.iter().map(|c| c.index).collect();
            say(
                out,
                &format!("Resetting all PCI devices: {}", py_ints(&ids)),
            );
            present.clone()
        }
        Selection::LogicalIds(ids) => {
            say(out, &format!("Resetting UMD logical IDs: {}", py_ints(ids)));
            if ids.iter().any(|&id| id < 0) {
                // tt-umd indexes its device list with the id unchecked.
                return Ok(ResetRun {
                    code: 139,
                    reset_bdfs: Vec::new(),
                    signal: Some(nix::libc::SIGSEGV),
                    ..ResetRun::default()
                });
            }
            // Out-of-range ids are skipped (a warning, hidden without a
            // TTY); none left means every card (warm_reset.cpp).
            let chosen: Vec<PresentCard> = ids
                .iter()
                .filter_map(|&id| {
                    usize::try_from(id)
                        .ok()
                        .and_then(|i| by_bdf.get(i))
                        .cloned()
                })
                .collect();
            or_every_card(chosen, &present)
        }
        Selection::Bdfs(bdfs) => {
            say(out, &format!("Resetting PCI BDFs: {}", py_strs(bdfs)));
            // Matched exactly against sysfs' lower-case addresses: absent
            // or upper-case ones match nothing, and none left means every
            // card (warm_reset.cpp warm_reset_pci_bdfs, then warm_reset).
            let chosen: Vec<PresentCard> = present
                .iter()
                .filter(|c| bdfs.contains(&c.bdf))
                .cloned()
                .collect();
            or_every_card(chosen, &present)
        }
        Selection::DevIds(ids) => {
            say(
                out,
                &format!("Resetting /dev/tenstorrent IDs: {}", py_ints(ids)),
            );
            // Absent indices are skipped silently; the list itself is never
            // empty here, so it never widens to every card.
            present
                .iter()
                .filter(|c| ids.contains(&c.index))
                .cloned()
                .collect()
        }
        Selection::LegacyIndices(ids) => {
            let mut chosen = Vec::new();
            for id in ids {
                match present.iter().find(|c| c.index == *id) {
                    Some(c) => chosen.push(c.clone()),
                    None => say(
                        out,
                        &red(&format!(
                            "Error accessing board at PCI index {id}! Use -ls to see all devices available to reset"
                        )),
                    ),
                }
            }
            say(
                out,
                &format!(
                    " Starting PCI link reset on BH devices at PCI indices: {} ",
                    chosen
                        .iter()
                        .map(|c| c.index.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            chosen
        }
    };

    if targets
        .iter()
        .any(|c| faults.get(&c.bdf).is_some_and(|f| f.smi_hangs))
    {
        // Stuck in the reset ioctl: nothing more is printed (tt-umd's
        // progress lines are info, hidden without a TTY) and no card is
        // touched here; the root's lock goes with this function.
        return Ok(ResetRun {
            code: HUNG_EXIT_CODE,
            hangs: true,
            ..ResetRun::default()
        });
    }
    if targets
        .iter()
        .any(|c| faults.get(&c.bdf).is_some_and(|f| f.smi_exit_1))
    {
        say(
            out,
            "Traceback (most recent call last):\n  File \"tt_smi/reset.py\", in umd_pci_warm_reset\n\
             RuntimeError: tt-umd raised during the reset (tt-fakehw smi-exit-1 fault)",
        );
        return Ok(failed(1));
    }

    // Every card this run resets is recorded as pending *before* any card
    // is touched, and the whole record is written at once. A failure or a
    // kill midway then leaves each card either untouched or recorded, and
    // a recorded card is one the firmware brings back. The other order once
    // left a card half reset with nobody to finish it: a reset of cards 0
    // and 1 while card 1 was still in its last reset converted card 0,
    // failed on card 1 and returned before recording card 0, whose
    // unreadable heartbeat then stopped the firmware for every card (issue 46).
    let mut pending = state::load_pending(layout)?;
    let now = state::now_unix_ms();
    let mut steps = Vec::new();
    let mut lost = false;
    for card in &targets {
        let card_faults = faults.get(&card.bdf).cloned().unwrap_or_default();
        if card_faults.ioctl_fails {
            // log_error in pci_device.cpp send_reset_ioctl_to_devices; the
            // reset goes on without this card.
            say(
                out,
                &format!(
                    "ERROR | UMD | Sending reset ioctl to device {} failed: TENSTORRENT_IOCTL_RESET_DEVICE: Input/output error",
                    card.index
                ),
            );
            continue;
        }
        let Some(info) = inventory.card(&card.bdf) else {
            continue;
        };
        let in_place = inventory.kmd.resets_in_place() && !card_faults.leaves_the_bus();
        // A card still in an earlier reset cannot be read; its count from
        // before that reset is the one to keep.
        let earlier = pending.iter().find(|p| p.bdf == card.bdf);
        let therm_trips = match earlier {
            Some(p) => p.therm_trips,
            None => read_attr(
                &layout
                    .class_dir(&card.bdf, card.index)
                    .join("tt_therm_trip_count"),
            )
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
        };
        let delay = card_faults
            .slow_delay_ms
            .unwrap_or(inventory.reset_delay_ms);
        lost |= !in_place && card_faults.never_returns;
        steps.push((
            info,
            PendingReset {
                bdf: card.bdf.clone(),
                old_index: card.index,
                due_unix_ms: now.saturating_add(delay),
                in_place,
                therm_trips,
            },
        ));
    }
    pending.retain(|p| !steps.iter().any(|(_, step)| step.bdf == p.bdf));
    pending.extend(steps.iter().map(|(_, step)| step.clone()));
    state::save_pending(layout, &pending)?;
    let reset_bdfs: Vec<String> = steps.iter().map(|(_, step)| step.bdf.clone()).collect();
    for (info, step) in &steps {
        let touched = if step.in_place {
            begin_in_place_reset(layout, info, step.old_index, &inventory.kmd)
        } else {
            vanish_card(layout, &step.bdf, step.old_index)
        };
        if let Err(e) = touched {
            say(out, &red(&format!("Error while resetting devices: {e}")));
            return Ok(ResetRun {
                code: 1,
                reset_bdfs,
                ..ResetRun::default()
            });
        }
    }
    if lost {
        // tt-umd waits up to 10 s for every card on the host to reappear,
        // then logs this and skips the POST_RESET ioctl (warm_reset.cpp).
        say(out, "ERROR | UMD | Reset failed.");
    }
    if !no_reinit {
        // Re-initialisation re-discovers every card on the host, not only
        // the targets (reset.py pci_board_reset: TopologyDiscovery).
        say(out, &purple("Re-initializing boards after reset...."));
        let now_present = present_cards(layout)?;
        if let Some(bad) = now_present
            .iter()
            .find(|c| faults.get(&c.bdf).is_some_and(|f| f.reinit_fails))
        {
            say(
                out,
                &red(&format!(
                    "Error when re-initializing chips!\n Failed to initialize chip at PCI index {} ({}): timed out waiting for ARC firmware to respond",
                    bad.index, bad.bdf
                )),
            );
            return Ok(ResetRun {
                code: 1,
                reset_bdfs,
                ..ResetRun::default()
            });
        }
    }
    Ok(ResetRun {
        code: 0,
        reset_bdfs,
        ..ResetRun::default()
    })
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

    /// The demo's failure step (issue 46): card 1 never returns from a
    /// reset, and the next reset names both cards of the slot. Card 0 must
    /// be reset and recorded like card 1, never converted and forgotten
    /// (which stopped the firmware for both: its heartbeat was unreadable
    /// with no reset to finish).
    #[test]
    fn a_reset_naming_a_card_still_in_reset_resets_and_records_every_card() {
        use crate::{FakeRoot, Fault};
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeRoot::create(
            &dir.path().join("hw"),
            2,
            std::path::Path::new("/nonexistent/tt-fakehw"),
        )
        .unwrap();
        let (a, b) = (FakeRoot::bdf(0), FakeRoot::bdf(1));
        fake.set_fault(&b, Fault::NeverReturns).unwrap();
        let first = fake.run_smi(&["--no_reinit", "-r", &b]);
        assert_eq!(first.code, 0, "{first:?}");
        let both = format!("{a},{b}");
        let second = fake.run_smi(&["--no_reinit", "-r", &both]);
        assert_eq!(second.code, 0, "{second:?}");
        assert!(!second.stdout.contains('\x1b'), "{second:?}");
        let mut pending: Vec<String> = fake
            .pending_resets()
            .unwrap()
            .into_iter()
            .map(|p| p.bdf)
            .collect();
        pending.sort();
        assert_eq!(pending, [a.clone(), b.clone()]);
        let logged = fake.tt_smi_log().unwrap();
        assert_eq!(logged.last().unwrap().reset_bdfs, [a.clone(), b.clone()]);
        // Past every delay: card 0 is back with a fresh heartbeat, card 1
        // stays in its reset, and the step itself does not fail.
        let later = state::now_unix_ms() + 60_000;
        let report = fake.tick_at(later).unwrap();
        let back: Vec<&str> = report.returned.iter().map(|r| r.bdf.as_str()).collect();
        assert_eq!(back, [a.as_str()]);
        assert_eq!(
            fake.heartbeat(&a),
            Some(crate::layout::HEARTBEAT_AFTER_RESET)
        );
        assert_eq!(fake.heartbeat(&b), None);
        fake.tick_at(later + 50).unwrap();
        assert_eq!(
            fake.heartbeat(&a),
            Some(crate::layout::HEARTBEAT_AFTER_RESET + 1)
        );
    }

    fn sel(values: &[&str]) -> Result<Selection, String> {
        select_68(&values.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn targets_are_classified_like_tt_smi_6_8() {
        assert_eq!(sel(&[]), Ok(Selection::All));
        assert_eq!(sel(&["ALL"]), Ok(Selection::All));
        assert_eq!(sel(&["/dev/tenstorrent/3"]), Ok(Selection::DevIds(vec![3])));
        assert_eq!(sel(&["2,0,2"]), Ok(Selection::LogicalIds(vec![0, 2])));
        assert_eq!(sel(&["-1"]), Ok(Selection::LogicalIds(vec![-1])));
        // Kept as typed: tt-umd compares it exactly (and finds nothing).
        assert_eq!(
            sel(&["0000:0A:00.0"]),
            Ok(Selection::Bdfs(vec!["0000:0A:00.0".into()]))
        );
        assert_eq!(
            sel(&["0000:01:00.0", "0000:02:00.0,0000:01:00.0"]),
            Ok(Selection::Bdfs(vec![
                "0000:01:00.0".into(),
                "0000:02:00.0".into()
            ]))
        );
    }

    #[test]
    fn mixed_short_and_odd_targets_are_refused_like_tt_smi_6_8() {
        let mixed = sel(&["/dev/tenstorrent/0,0000:02:00.0"]).unwrap_err();
        assert!(mixed.starts_with("Mixed device target kinds are not allowed. Got '0000:02:00.0' which is a PCI_BDF, but earlier inputs were DEV_TENSTORRENT_ID"), "{mixed}");
        let short = sel(&["01:00.0"]).unwrap_err();
        assert!(
            short.starts_with("Invalid device target: '01:00.0'"),
            "{short}"
        );
        assert_eq!(
            sel(&["0,all"]),
            Err("Use 'all' as the only argument to select all devices".into())
        );
        assert!(sel(&["/dev/tenstorrent/x"])
            .unwrap_err()
            .starts_with("Invalid path"));
    }
}
