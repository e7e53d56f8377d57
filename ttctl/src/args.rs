//! The command line, declared with clap's derive API.
//!
//! Commands are grouped by the thing they act on (`card ...`, `slot ...`,
//! `cache ...`), so the help output reads like the daemon's own vocabulary;
//! the everyday checks and whole-daemon actions (`status`, `generate`,
//! `logs`, `top`, `reload`) sit at the top level.
//! A group is only added together with a command that does something.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::client::DEFAULT_SOCKET;

/// Exit codes, shown at the end of `--help` so scripts can branch on them.
const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the operation failed (the daemon said no, a reset was not proven, a
     generation failed, a cache variant is not warm)
  2  usage error (bad arguments)
  3  tt-servingd cannot be reached (not running, stale socket, permission denied)";

/// ttctl, the operator's tool for tt-servingd.
#[derive(Debug, Parser)]
#[command(
    name = "ttctl",
    version,
    about = "Operate tt-servingd: status, card resets, slot restarts and logs, \
             quick generations, the tensor cache",
    long_about = "Operate tt-servingd, the tt-serving daemon that owns this host's \
                  Tenstorrent cards.\n\nttctl talks to the daemon over its local control \
                  socket (a unix socket; its group decides who may use it).",
    after_help = EXIT_CODES,
    propagate_version = true
)]
pub struct Cli {
    /// The daemon's control socket.
    #[arg(
        long,
        global = true,
        value_name = "PATH",
        env = "TTCTL_SOCKET",
        default_value = DEFAULT_SOCKET
    )]
    pub socket: PathBuf,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The rules between options clap cannot say: the eval runner's
    /// options of `ttctl ab` mean nothing without `--eval`.
    pub fn check(&self) -> Result<(), clap::Error> {
        use clap::CommandFactory;
        if let Command::Ab(ab) = &self.command {
            let runner = &ab.runner;
            if ab.eval.is_none() && (runner.lm_eval.is_some() || runner.limit.is_some()) {
                return Err(Cli::command().error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "--lm-eval and --limit say how `ttctl ab` runs its eval: give the task with --eval TASK",
                ));
            }
        }
        Ok(())
    }
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the daemon, every card and every slot.
    #[command(after_help = EXIT_CODES)]
    Status(StatusArgs),

    /// Card maintenance.
    #[command(subcommand)]
    Card(CardCommand),

    /// Slot maintenance.
    #[command(subcommand)]
    Slot(SlotCommand),

    /// Generate text with a served model, for a quick check from the host.
    ///
    /// The request goes through the daemon's router exactly like one on the
    /// inference port. The text is printed as it is generated; a summary
    /// (finish reason, token counts, slot, time to first token, decode
    /// speed) follows on stderr, so stdout holds only the model's text.
    /// Exits 1 when the daemon refuses the request (unknown model, no ready
    /// slot, queue full, bad parameters), when the generation fails or is
    /// cancelled, or when the stream ends without its final chunk.
    #[command(after_help = EXIT_CODES)]
    Generate(GenerateArgs),

    /// Show a slot worker's recent output, optionally following new lines.
    ///
    /// Lines from the worker's stdout and stderr are printed as they are,
    /// in the order the daemon read them; notes from the daemon itself (for
    /// example lines skipped because the reader fell behind) are printed in
    /// brackets. With --follow, ttctl keeps printing until Ctrl-C (exit 0)
    /// or until the daemon goes away (exit 3).
    #[command(after_help = EXIT_CODES)]
    Logs(LogsArgs),

    /// Show the audit trail: who did what on the control socket, and how it ended.
    ///
    /// One line per destructive call (card reset and borrow, cache build,
    /// verify and removal, slot restart, stop and start, reload, `ab`
    /// trials with or without --eval), refused ones included, oldest
    /// first: when, the caller's uid and user and why the daemon let them
    /// in (`root`, or `group NAME`: daemon.control_admin_group), the
    /// command and its arguments, the outcome (`ok`, `failed`, `refused`,
    /// or `ended` when the call ended before its outcome was known) and the
    /// final message.
    /// The daemon keeps the trail in `<daemon.state_dir>/audit.jsonl`.
    #[command(after_help = EXIT_CODES)]
    Audit(AuditArgs),

    /// Show usage per API key and model: requests, tokens, refusals, errors.
    ///
    /// Keys are the names in inference.tokens_file (`<token> <name>` per
    /// line; a token without a name is `key-` and a prefix of its digest);
    /// requests without a token count as `anonymous`. Summed from the
    /// daemon's ledger, `<daemon.state_dir>/usage.jsonl` (and `.1`), which
    /// it writes every 2 s and when it stops.
    #[command(after_help = EXIT_CODES)]
    Usage(UsageArgs),

    /// The tensor cache: list, verify and remove variants.
    #[command(subcommand)]
    Cache(CacheCommand),

    /// A live picture for a terminal: per slot tokens/s, requests/s,
    /// requests in flight, the model's queue, median time to first token
    /// and inter-token latency, worker memory. Redraws every --interval
    /// seconds until Ctrl-C (or --iterations frames).
    ///
    /// Rates are computed from the daemon's counters between two frames, so
    /// the first frame shows `-` for them. Latencies are medians over each
    /// slot's recent requests as the daemon sees them (queueing included).
    /// Prometheus gets the full histograms at `metrics.listen`.
    #[command(after_help = EXIT_CODES)]
    Top(TopArgs),

    /// Re-read the daemon's config file and apply only what changed.
    ///
    /// Slots whose definition is unchanged keep running untouched; a change
    /// to only max_queue, max_in_flight, recovery_wait_secs,
    /// rollback_on_failure or prefix_affinity is applied live; any other change drains and
    /// restarts the slot (a changed cache flag means one cold build); removed slots drain and stop and
    /// their cards are released; added slots start. Changes outside
    /// `[models]` (daemon, hardware, reset, metrics, ...) are listed as
    /// needing a restart and are not applied. An invalid file is refused as a whole and the old
    /// config keeps serving. Prints the plan and, once the started slots
    /// are Ready or have failed, each slot's result. SIGHUP and `systemctl
    /// reload tenstorrent-serving` do the same. Exits 1 when the file is
    /// refused or a started slot failed to come up.
    #[command(after_help = EXIT_CODES)]
    Reload(ReloadArgs),

    /// Measure a served model through the daemon, the way the field does.
    ///
    /// For every rung (each --batch with each --prompt-tokens) it sends
    /// --warmup rounds that are not counted, then --repeats rounds of B
    /// concurrent requests of the rung's prompt length and exactly
    /// --output-tokens tokens each (ignore_eos), and reports: time to first
    /// token p50/p99, decode tokens/s per user over the steady-state window
    /// (after every stream has its first --steady-skip tokens and before
    /// the first one finishes), aggregate tokens/s, inter-token latency
    /// p50/p99, makespan and errors. Prompts are built deterministically,
    /// unique per request (no prefix cache favours a round) and calibrated
    /// against the server's own usage.prompt_tokens to within 5%; a rung
    /// outside that is flagged in its record. Each rung appends one JSON
    /// line to --out with the engine, cards, flags and banners it ran with.
    /// `ttctl bench cite DOC RECORDS...` checks a document's numbers
    /// against such records.
    #[command(after_help = EXIT_CODES, args_conflicts_with_subcommands = true)]
    Bench(BenchArgs),

    /// A/B a model's flags on its own cards, the way the field does.
    ///
    /// Each arm runs as a trial: the daemon brings the model's slots up
    /// with the configured definition plus the arm's flags (not written to
    /// the config; `ttctl status` shows the trial), waits for Ready with
    /// the banner rule in `both` mode over the arm's flags (a truthy flag
    /// must print `<FLAG> engaged`, a falsy one must not), and the arm runs
    /// the `ttctl bench` workload. Arms alternate (A B A B ...) for
    /// --repeats rounds so drift hits all of them. Each record says its
    /// arm, round and order, and the banners seen; a record whose arm's
    /// banners changed, or whose slot restarted, is invalid. At the end,
    /// on a failure and on Ctrl-C the configured definition is restored
    /// (also if ttctl dies: the daemon restores when it goes away). Prints
    /// per rung each arm's median and spread, the ratio to the first arm,
    /// and a verdict only when the spreads do not overlap. In the first
    /// round every arm also answers fixed prompts greedily (the summary's
    /// greedy agreement with the first arm: identical tokens, where they
    /// part, the logprobs' difference) and, with --eval, is evaluated on a
    /// task; an arm scoring below the first by more than the tolerance is
    /// refused for accuracy. Exits 1 when an arm does not come up, a run is
    /// invalid or an arm is refused for accuracy, 130 on Ctrl-C.
    #[command(after_help = EXIT_CODES)]
    Ab(AbArgs),

    /// Measure a served model's accuracy through the daemon, as clients get it.
    ///
    /// Two engines of the eval. With --lm-eval PATH, EleutherAI's
    /// lm-evaluation-harness (`scripts/lm-eval.sh` installs it) runs task
    /// TASK (a task of its registry, or of --include-path) with its
    /// `local-completions` model against the daemon's OpenAI door; give
    /// --tokenizer (a Hugging Face tokenizer directory or name) for tasks
    /// that score log-likelihoods. Without it, the built-in exact-match
    /// runner reads TASK as a JSON-lines file, one question a line
    /// ({"prompt": ..., "answer": ...} or "answers": [...]), asks each
    /// greedily through the router and scores the first line of the
    /// answer (case, surrounding spaces and punctuation aside). Appends a
    /// JSON-lines record (the score, its standard error, the samples, the
    /// slots, engine, cache variant and flags it ran on, and `valid`: no
    /// slot restarted and no request failed). With --reference and
    /// --tolerance, or --pass-mark, says pass or fail. Exits 1 on a fail
    /// or an invalid run.
    #[command(after_help = EXIT_CODES)]
    Eval(EvalArgs),
}

/// Options of `ttctl eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The model, as configured under `[models.<name>]`.
    #[arg(value_name = "MODEL")]
    pub model: String,

    /// The task: a JSON-lines file (built-in runner), or an lm-eval task
    /// name (with --lm-eval).
    #[arg(long, value_name = "TASK")]
    pub task: String,

    /// How the eval runs.
    #[command(flatten)]
    pub runner: EvalRunner,

    /// The reference score (0 to 1): with --tolerance, a score below
    /// reference - tolerance fails.
    #[arg(
        long,
        value_name = "SCORE",
        requires = "tolerance",
        conflicts_with = "pass_mark"
    )]
    pub reference: Option<f64>,

    /// How far below --reference a score may fall and pass.
    #[arg(long, value_name = "SCORE", requires = "reference")]
    pub tolerance: Option<f64>,

    /// A pass mark as N/M: at least N correct of exactly M samples.
    #[arg(long, value_name = "N/M", value_parser = parse_pass_mark)]
    pub pass_mark: Option<(u32, u32)>,

    /// Append the record here instead of the user's state directory
    /// (`$XDG_STATE_HOME/tt-serving/bench.jsonl`).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Print the record as JSON instead of the summary line.
    #[arg(long)]
    pub json: bool,
}

/// How an eval runs (`ttctl eval`, `ttctl ab --eval`): which engine of
/// the eval, and its options.
#[derive(Debug, Clone, Args)]
pub struct EvalRunner {
    /// lm-evaluation-harness's `lm_eval` program: run the task with it.
    #[arg(long = "lm-eval", value_name = "PATH")]
    pub lm_eval: Option<PathBuf>,

    /// A directory of lm-eval task YAML files (lm-eval's --include_path);
    /// their relative data files are read from it.
    #[arg(long, value_name = "DIR", requires = "lm_eval")]
    pub include_path: Option<PathBuf>,

    /// The model's Hugging Face tokenizer (a directory or a hub name), for
    /// lm-eval's log-likelihood requests, which count context tokens.
    #[arg(long, value_name = "PATH", requires = "lm_eval")]
    pub tokenizer: Option<String>,

    /// Requests lm-eval sends at once (its batch of prompts per request).
    #[arg(long, value_name = "N", default_value_t = 8, requires = "lm_eval",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub batch_size: u32,

    /// Evaluate only the first N samples.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,

    /// The metric to score by (lm-eval's name, e.g. acc, acc_norm,
    /// exact_match); default: the task's first.
    #[arg(long, value_name = "NAME", requires = "lm_eval")]
    pub metric: Option<String>,
}

fn parse_tolerance(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{text:?}: a tolerance is a score difference from 0 to 1 (e.g. 0.05)"
        )),
    }
}

fn parse_pass_mark(text: &str) -> Result<(u32, u32), String> {
    tt_serving_proto::accuracy::pass_mark(text).ok_or_else(|| {
        format!("{text:?}: a pass mark is N/M, at least N correct of M samples (e.g. 55/60)")
    })
}

/// Options of `ttctl bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// `cite`: check a document against records instead of measuring.
    #[command(subcommand)]
    pub cite: Option<BenchCommand>,

    /// The model, as configured under `[models.<name>]`.
    #[arg(value_name = "MODEL", required = true)]
    pub model: Option<String>,

    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// The workload options `ttctl bench` and `ttctl ab` share.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Concurrent requests per round, comma-separated (e.g. 1,4,8).
    #[arg(long, value_name = "B,...", value_delimiter = ',', default_value = "1",
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub batch: Vec<u32>,

    /// Prompt lengths in tokens, comma-separated (e.g. 128,4096,16384).
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_value = "128",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub prompt_tokens: Vec<u32>,

    /// Tokens each request generates (ignore_eos: exactly this many).
    #[arg(long, value_name = "N", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub output_tokens: u32,

    /// Counted rounds per rung (with `ab`: rounds of the arms, each arm
    /// measuring every rung once per round).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub repeats: u32,

    /// Uncounted rounds per rung before the counted ones.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub warmup: u32,

    /// Tokens at the start of every stream left out of the steady-state
    /// decode window (prefill of the others, ramp-up).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub steady_skip: u32,

    /// The JSON-lines file records are appended to (default:
    /// $XDG_STATE_HOME/tt-serving/bench.jsonl, else
    /// ~/.local/state/tt-serving/bench.jsonl).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Print the records (JSON lines) on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `ttctl ab`.
#[derive(Debug, Clone, Args)]
pub struct AbArgs {
    /// The model, as configured under `[models.<name>]`.
    #[arg(value_name = "MODEL")]
    pub model: String,

    /// An arm: `NAME:` (the configured flags) or `NAME:FLAG=VALUE,...`
    /// (flags set on top of them; `FLAG=` removes one). The first arm is
    /// the baseline the others are compared with. At least two.
    #[arg(long = "arm", value_name = "NAME:FLAGS", required = true, num_args = 1,
          value_parser = parse_arm)]
    pub arms: Vec<Arm>,

    /// Also evaluate every arm on this task (in the first round, through
    /// the router, as `ttctl eval` does: a JSON-lines file for the built-in
    /// runner, or an lm-eval task with --lm-eval). An arm whose score falls
    /// below the first arm's by more than the tolerance is refused for
    /// accuracy, faster or not (exit 1).
    #[arg(long = "eval", value_name = "TASK")]
    pub eval: Option<String>,

    /// How far below the first arm's score another arm's may fall
    /// (default: the tolerance of the model's `[models.X.accuracy.TASK]`
    /// gate, else two standard errors of the difference).
    #[arg(long, value_name = "SCORE", requires = "eval",
          value_parser = parse_tolerance)]
    pub eval_tolerance: Option<f64>,

    /// How the eval runs (with --eval).
    #[command(flatten)]
    pub runner: EvalRunner,

    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// One arm of `ttctl ab`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arm {
    /// Its name.
    pub name: String,
    /// Its flags, over the configured ones.
    pub flags: std::collections::BTreeMap<String, String>,
}

fn parse_arm(text: &str) -> Result<Arm, String> {
    let (name, flags) = text.split_once(':').ok_or_else(|| {
        format!(
            "{text:?}: an arm is NAME: or NAME:FLAG=VALUE,... (e.g. base: or cand:TTW_KV_F16=1)"
        )
    })?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(format!(
            "arm name {name:?}: use letters, digits, `_` and `-` (it goes into record ids)"
        ));
    }
    let mut map = std::collections::BTreeMap::new();
    for pair in flags.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} in arm {name}: a flag is FLAG=VALUE"))?;
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("{k:?} in arm {name}: not a flag name"));
        }
        if map.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!("{k} given twice in arm {name}"));
        }
    }
    Ok(Arm {
        name: name.to_string(),
        flags: map,
    })
}

/// `ttctl bench` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Check that every measured number in DOC's tables cites a record
    /// that exists in RECORDS and matches it within the number's rounding.
    ///
    /// A table claims measurements when the line before it (blank lines
    /// aside) is `<!-- measured -->`: then every number in its cells after
    /// the first column must be followed by a citation `{r:ID.FIELD}`
    /// (FIELD a dotted path into the record, e.g. `ttft_ms.p50`). A table
    /// with numbers and neither that marker nor an explicit exemption
    /// `<!-- not-cited: why -->` (for figures from before these records)
    /// is an error too, so nothing escapes by omission. Exits 1 naming each
    /// problem's line.
    #[command(after_help = EXIT_CODES)]
    Cite {
        /// The Markdown document.
        #[arg(value_name = "DOC")]
        doc: PathBuf,
        /// JSON-lines record files (ttctl bench and ttctl ab output).
        #[arg(value_name = "RECORDS", required = true)]
        records: Vec<PathBuf>,
    },
}

/// Options of `ttctl top`.
#[derive(Debug, Clone, Copy, Args)]
pub struct TopArgs {
    /// Seconds between frames.
    #[arg(long, value_name = "SECS", default_value_t = 2.0, value_parser = parse_interval)]
    pub interval: f64,

    /// Stop after N frames (0: until Ctrl-C).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub iterations: u32,
}

fn parse_interval(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        Ok(v) => Err(format!("{v} is outside 0.1..3600 seconds")),
        Err(e) => Err(format!("not a number of seconds: {e}")),
    }
}

/// Options of `ttctl reload`.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct ReloadArgs {
    /// Print the plan (which slots stay, restart, stop, start, and why)
    /// without applying it.
    #[arg(long)]
    pub dry_run: bool,

    /// Return once the plan is applied (stops done, starts begun) instead
    /// of waiting for the started slots to be Ready.
    #[arg(long)]
    pub no_wait: bool,

    /// Print the daemon's report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Options of `ttctl status`.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct StatusArgs {
    /// Print JSON instead of tables: one object, or one object per line with
    /// --watch. Field names mirror control.proto; states are the table's words.
    #[arg(long)]
    pub json: bool,

    /// Keep running and print the status again after every change (Ctrl-C
    /// stops).
    #[arg(long)]
    pub watch: bool,
}

/// `ttctl card ...`.
#[derive(Debug, Subcommand)]
pub enum CardCommand {
    /// Reset a card and wait until the daemon proves it came back.
    ///
    /// The daemon runs `tt-smi -r` and then proves the card is back (device
    /// node, sysfs, advancing heartbeat, site probe); tt-smi's own exit code
    /// is not trusted. Each step is printed as it happens. A quarantined card
    /// that passes leaves quarantine. Refused while another process holds
    /// the card's lock.
    #[command(after_help = EXIT_CODES)]
    Reset {
        /// The card: its current index (`1`) or its PCI address
        /// (`0000:01:00.0`, stable across resets).
        #[arg(value_name = "INDEX|BDF")]
        card: String,
    },
    /// Borrow cards from the daemon for an outside job (a benchmark, a
    /// firmware check): the slots on them drain and stop, the daemon
    /// releases the locks, ttctl takes them and runs COMMAND with
    /// TT_VISIBLE_DEVICES set to the cards' BDFs, then the daemon takes the
    /// cards back, resets and proves them, and restarts the slots. ttctl
    /// exits with COMMAND's exit status.
    #[command(after_help = EXIT_CODES)]
    Borrow {
        /// The cards, comma-separated indices or BDFs (`0,1`).
        #[arg(value_name = "INDEX|BDF,...", value_delimiter = ',', required = true)]
        cards: Vec<String>,
        /// The job to run while holding the cards, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

/// `ttctl slot ...`.
#[derive(Debug, Subcommand)]
pub enum SlotCommand {
    /// Restart a slot: drain and stop its worker, then start it again.
    ///
    /// Also brings back a slot that gave up after repeated failures. ttctl
    /// prints each state the slot goes through and returns once a new
    /// worker is ready (exit 0) or the restart failed (exit 1, with the
    /// daemon's reason). Ctrl-C stops following; the restart goes on.
    #[command(after_help = EXIT_CODES)]
    Restart {
        /// The slot: the model's name, or `model/N` for a replica.
        #[arg(value_name = "SLOT")]
        slot: String,

        /// Return once the daemon has queued the restart instead of
        /// following it to the end (then follow it with `ttctl status
        /// --watch`).
        #[arg(long)]
        no_wait: bool,
    },
    /// Stop a slot until `ttctl slot start`: drain its requests, stop its
    /// worker. The daemon keeps the slot's cards locked meanwhile (nothing
    /// else takes them; `ttctl card borrow` lends them to a job, `ttctl
    /// card reset` resets them). Returns once the slot is stopped.
    #[command(after_help = EXIT_CODES)]
    Stop {
        /// The slot: the model's name, or `model/N` for a replica.
        #[arg(value_name = "SLOT")]
        slot: String,
    },
    /// Start a slot that was stopped (`ttctl slot stop`) or gave up after
    /// repeated failures, and follow it until its worker is ready (exit 0)
    /// or the start failed (exit 1). A slot already starting or serving is
    /// refused: `ttctl slot restart` restarts it.
    #[command(after_help = EXIT_CODES)]
    Start {
        /// The slot: the model's name, or `model/N` for a replica.
        #[arg(value_name = "SLOT")]
        slot: String,

        /// Return once the daemon has queued the start.
        #[arg(long)]
        no_wait: bool,
    },
}

/// Options of `ttctl generate`.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// The model, as configured under `[models.<name>]`.
    #[arg(value_name = "MODEL")]
    pub model: String,

    /// The prompt: raw text continued as is, or with --chat one user
    /// message. `-` reads it from standard input (a prompt too long for a
    /// command line: `ttctl generate m - < prompt.txt`).
    #[arg(value_name = "PROMPT", required_unless_present = "prompt_file")]
    pub prompt: Option<String>,

    /// Read the prompt from this file (UTF-8) instead; `-` is standard
    /// input.
    #[arg(long, value_name = "PATH", conflicts_with = "prompt")]
    pub prompt_file: Option<std::path::PathBuf>,

    /// The most tokens to generate (0: the server's default).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_tokens: u32,

    /// Sampling temperature; 0 (the default) is greedy decoding.
    #[arg(long, value_name = "F")]
    pub temperature: Option<f32>,

    /// Nucleus sampling: keep the smallest set of tokens whose probability
    /// reaches F (0 or 1 disables it).
    #[arg(long, value_name = "F")]
    pub top_p: Option<f32>,

    /// Keep only the N most likely tokens (0 disables it).
    #[arg(long, value_name = "N")]
    pub top_k: Option<u32>,

    /// Seed of the sampler; the same seed, prompt and settings give the same
    /// text.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Stop when the text contains S (not printed). Repeat for several.
    #[arg(long, value_name = "S")]
    pub stop: Vec<String>,

    /// Send the prompt as one user message, rendered with the model's chat
    /// template, instead of as raw text.
    #[arg(long)]
    pub chat: bool,

    /// Generate through end-of-sequence tokens: exactly --max-tokens tokens
    /// (for timing). Refused when the engine cannot.
    #[arg(long)]
    pub ignore_eos: bool,

    /// No end of sequence before N tokens.
    #[arg(long, value_name = "N")]
    pub min_tokens: Option<u32>,

    /// OpenAI's presence penalty, in [-2, 2].
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,

    /// OpenAI's frequency penalty, in [-2, 2].
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,

    /// Hugging Face's repetition penalty (1: off).
    #[arg(long, value_name = "F")]
    pub repetition_penalty: Option<f32>,

    /// Stop at this token id. Repeat for several.
    #[arg(long, value_name = "ID")]
    pub stop_token_id: Vec<u32>,

    /// The request's priority while the model's queue is full: lower is
    /// served sooner (as in vLLM; may be negative). A priority more urgent
    /// than the key's `min_priority` (inference.tokens_file) is refused,
    /// never clamped; through the control socket the request has no token
    /// and counts as key `anonymous`, whose limit is 0, so only 0 or more
    /// is accepted here.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub priority: i32,
}

/// Options of `ttctl logs`.
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The slot: the model's name, or `model/N` for a replica.
    #[arg(value_name = "SLOT")]
    pub slot: String,

    /// How many recent lines to show (0: every line the daemon kept).
    #[arg(short = 'n', long = "lines", value_name = "N", default_value_t = 100)]
    pub lines: u32,

    /// Keep printing new lines as the worker writes them (Ctrl-C stops).
    #[arg(short = 'f', long)]
    pub follow: bool,
}

/// Options of `ttctl audit`.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// Only records since T: an RFC 3339 time (`2026-12-05T15:00:00Z`,
    /// `2026-12-05T16:00:00+01:00`) or a time back from now (`90s`, `15m`,
    /// `2h`, `7d`).
    #[arg(long, value_name = "T", value_parser = parse_since)]
    pub since: Option<u64>,

    /// Only the newest N records (0: all).
    #[arg(short = 'n', long = "lines", value_name = "N", default_value_t = 0)]
    pub lines: u32,

    /// One JSON object per record, one per line.
    #[arg(long)]
    pub json: bool,
}

/// Options of `ttctl usage`.
#[derive(Debug, Clone, Args)]
pub struct UsageArgs {
    /// Only usage since T: an RFC 3339 time (`2026-12-05T15:00:00Z`) or a
    /// time back from now (`90s`, `15m`, `2h`, `7d`).
    #[arg(long, value_name = "T", value_parser = parse_since)]
    pub since: Option<u64>,

    /// Only the key with this name.
    #[arg(long, value_name = "NAME")]
    pub key: Option<String>,

    /// One JSON object per key and model, one per line.
    #[arg(long)]
    pub json: bool,
}

/// `--since`: an RFC 3339 time, or a duration back from now, as Unix
/// milliseconds.
fn parse_since(text: &str) -> Result<u64, String> {
    if let Some(ms) = tt_serving_proto::time::parse_rfc3339(text) {
        return Ok(ms);
    }
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` needs a unit: s, m, h or d (e.g. 15m)"))?;
    let (number, unit) = text.split_at(unit_at);
    let scale: u64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "`{text}` is neither an RFC 3339 time (2026-12-05T15:00:00Z) nor a duration (90s, 15m, 2h, 7d)"
            ))
        }
    };
    let back = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("`{text}`: the number is missing or too large"))?;
    Ok(tt_serving_proto::time::now_unix_ms().saturating_sub(back))
}

/// `ttctl cache ...`.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// List every cache variant on disk: state, size, and which slots use it.
    ///
    /// STATE is `warm` (complete: a start uses it as is), `cold` (a build
    /// never completed) or `incomplete` (a file the build wrote is missing
    /// or changed; the reason is printed under the row).
    #[command(after_help = EXIT_CODES)]
    Ls {
        /// Print one JSON object: `{"cache_dir": ..., "variants": [...]}`.
        #[arg(long)]
        json: bool,
    },

    /// Check a model's cache: its content, and that its next start will be warm.
    ///
    /// Hashes every file of the model's complete variants against the
    /// SHA-256 recorded after their cold builds, printing progress (root or
    /// the admin group; a variant whose content changed is invalidated, so
    /// its next start builds it cold). Then prints the state of each of the
    /// model's variants on disk and exits 0 when every complete variant
    /// verified and the variant its slots use is warm, 1 otherwise (and
    /// says why).
    #[command(after_help = EXIT_CODES)]
    Verify {
        /// The model, as configured under `[models.<name>]`.
        #[arg(value_name = "MODEL")]
        model: String,
    },

    /// Remove a cache variant no running slot uses, and print what it freed.
    #[command(after_help = EXIT_CODES)]
    Rm {
        /// The variant key, as `ttctl cache ls` shows it.
        #[arg(value_name = "VARIANT")]
        variant: String,
    },

    /// Build the model's cache variant cold on its first slot's cards,
    /// without serving meanwhile, and print progress; the slot then starts
    /// again from the fresh cache (warm).
    #[command(after_help = EXIT_CODES)]
    Build {
        /// The model, as configured under `[models.<name>]`.
        #[arg(value_name = "MODEL")]
        model: String,
    },
}
