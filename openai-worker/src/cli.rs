//! The command line and the environment contract, validated into
//! [`Settings`].
//!
//! Options before `--` configure the worker; everything after `--` is the
//! engine's command line, with `{port}`, `{checkpoint}`, `{tp}` and
//! `{cache_dir}` substituted. The daemon passes the contract through the
//! environment (`TT_WORKER_SOCKET`, `TT_WORKER_MODEL`, ...), exactly as it
//! does for `tt-worker`. Bad arguments exit with status 2.

use clap::{Parser, ValueEnum};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tt_serving_proto::CacheMode;
use tt_worker_contract::{names, Contract, ContractArgs};

/// The engines the worker knows the defaults of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineKind {
    /// vLLM (with the Tenstorrent plugin on a real host): health `/health`,
    /// token ids with `return_token_ids`, context from `/v1/models`
    /// `max_model_len`, load from `vllm:num_requests_running` and
    /// `vllm:num_requests_waiting`.
    Vllm,
    /// llama.cpp's `llama-server`: health `/health`, asks `return_tokens`
    /// (its OpenAI endpoints do not return ids: deltas then carry none),
    /// context from `/props` `n_ctx`, load from `llamacpp:requests_processing`
    /// and `llamacpp:requests_deferred` (start it with `--metrics`).
    LlamaServer,
    /// vLLM with the Tenstorrent plugin (tenstorrent/vllm, tt_transformers),
    /// run as tt-inference-server runs it: vLLM's HTTP behaviour, plus
    /// `HF_MODEL` set to the checkpoint (tt_transformers refuses to start
    /// without it), `--block-size 64` and `--max-num-batched-tokens` equal
    /// to `--max-model-len` unless given (the TT platform turns chunked
    /// prefill off), no `--tensor-parallel-size` above 1 (the TT backend
    /// refuses distributed execution: the mesh comes from MESH_DEVICE), and
    /// a 60 s stop grace by default (a mesh close cut short leaves the next
    /// start failing until a reset: tt-inference-server issue 4923).
    #[value(name = "vllm-tt")]
    VllmTt,
}

impl EngineKind {
    /// The word `--engine` takes, for logs.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::VllmTt => "vllm-tt",
            EngineKind::LlamaServer => "llama-server",
        }
    }

    /// vLLM's HTTP server, with or without the Tenstorrent plugin.
    pub fn is_vllm(self) -> bool {
        matches!(self, EngineKind::Vllm | EngineKind::VllmTt)
    }

    /// Seconds the engine gets from SIGTERM to exit before SIGKILL, unless
    /// `--stop-timeout-secs` says.
    pub fn default_stop_timeout_secs(self) -> u64 {
        match self {
            // Closing a TT mesh takes time; a 10 s `docker stop` that
            // SIGKILLed mid-teardown left the next start failing with
            // "active ethernet core" (tt-inference-server issue 4923).
            EngineKind::VllmTt => 60,
            EngineKind::Vllm | EngineKind::LlamaServer => 15,
        }
    }

    /// Counters in the engine's `/metrics` that move only while its engine
    /// loop advances (Health `engine_counters`, read by the daemon's stall
    /// watchdog): vLLM 0.32's `vllm:generation_tokens_total` (+1 a token)
    /// and `vllm:prompt_tokens_total` (a prompt, at its first token)
    /// (vllm/v1/metrics/loggers.py); llama-server's `llamacpp:tokens_predicted_total`
    /// and `llamacpp:prompt_tokens_total` (tools/server/server.cpp metrics).
    pub fn progress_counters(self) -> &'static [&'static str] {
        match self {
            EngineKind::Vllm | EngineKind::VllmTt => {
                &["vllm:generation_tokens_total", "vllm:prompt_tokens_total"]
            }
            EngineKind::LlamaServer => &[
                "llamacpp:tokens_predicted_total",
                "llamacpp:prompt_tokens_total",
            ],
        }
    }

    /// The path that answers 200 once the engine can serve.
    pub fn default_health_path(self) -> &'static str {
        "/health"
    }

    /// The request field that asks the engine for token ids.
    pub fn default_token_ids_field(self) -> &'static str {
        match self {
            EngineKind::Vllm | EngineKind::VllmTt => "return_token_ids",
            EngineKind::LlamaServer => "return_tokens",
        }
    }

    /// The optional `GenerateRequest` parameters this engine takes, passed
    /// through in its request body under the same names (Info lists them;
    /// the daemon refuses the others by name). vLLM takes them as extra
    /// sampling fields; llama-server takes the OpenAI penalties and
    /// `ignore_eos` (its repetition penalty is `repeat_penalty` over a
    /// window, not the same rule, so it is not claimed). Both take a
    /// prompt as token ids (`prompt_tokens`): vLLM's CompletionRequest
    /// `prompt` is a string, token ids or lists of either
    /// (`vllm/entrypoints/openai/protocol.py`), llama-server's a string or
    /// an array of tokens (llama.cpp `tools/server/README.md`, "prompt").
    /// vLLM also gives log-probabilities, of the generated tokens
    /// (`logprobs`) and, with `echo`, of the prompt's (`prompt_logprobs`):
    /// relayed (`openai::plan`). llama-server's completions have no echo
    /// and its OpenAI logprobs are not relayed: neither is claimed.
    pub fn supported_parameters(self) -> &'static [&'static str] {
        use tt_serving_proto::parameters::*;
        const VLLM: [&str; 9] = [
            PRESENCE_PENALTY,
            FREQUENCY_PENALTY,
            REPETITION_PENALTY,
            MIN_TOKENS,
            IGNORE_EOS,
            STOP_TOKEN_IDS,
            LOGPROBS,
            PROMPT_TOKENS,
            PROMPT_LOGPROBS,
        ];
        match self {
            EngineKind::Vllm => &VLLM,
            // All but the last: the TT platform refuses prompt_logprobs
            // ("Not yet supporting prompt_logprobs on tt": vllm-tt-plugin
            // platform.py:1171-1183 at e3fc849), so completions' echo with
            // logprobs too.
            EngineKind::VllmTt => VLLM.split_last().map_or(&[], |(_, rest)| rest),
            EngineKind::LlamaServer => &[
                PRESENCE_PENALTY,
                FREQUENCY_PENALTY,
                IGNORE_EOS,
                PROMPT_TOKENS,
            ],
        }
    }

    /// Files the engine writes into the tensor cache at every start that
    /// are not weights (Info `runtime_cache_files`: globs relative to
    /// TT_CACHE_DIR; the weights go to `weights/`, TT_CACHE_PATH). The
    /// daemon's warm-start guard lets these pass and still refuses any
    /// other new file.
    pub fn runtime_cache_files(self) -> &'static [&'static str] {
        match self {
            // tt_transformers allocates vLLM's paged KV cache as tensors
            // cached in <TT_CACHE_PATH>/<device>/, beside the weights'
            // tensor_cache_* dir, named
            // `empty_{k,v}cache_paged_attention(<blocks>, <kv heads>,
            // <block size>, <head dim>)_dtype_..._layout_TILE.tensorbin`,
            // blocks from --max-num-seqs and --block-size (tt-metal
            // models/tt_transformers/tt/generator_vllm.py at 0015d62,
            // allocate_vllm_kv_cache; tenstorrent/vllm 22be241
            // tt_model_runner.py): a tuned scheduler writes new ones on a
            // warm start of unchanged weights.
            EngineKind::VllmTt => &["weights/*empty_*cache_paged_attention*"],
            EngineKind::Vllm | EngineKind::LlamaServer => &[],
        }
    }

    /// The Prometheus gauges of running and waiting requests.
    pub fn load_gauges(self) -> (&'static str, &'static str) {
        match self {
            EngineKind::Vllm | EngineKind::VllmTt => {
                ("vllm:num_requests_running", "vllm:num_requests_waiting")
            }
            EngineKind::LlamaServer => {
                ("llamacpp:requests_processing", "llamacpp:requests_deferred")
            }
        }
    }
}

/// tt-worker-openai: serves engine.proto on the daemon's unix socket and runs
/// an OpenAI-compatible engine (vLLM, llama-server) as its child.
///
/// Examples (a model's `worker` in the daemon's config):
///
///   ["tt-worker-openai", "--", "vllm", "serve", "{checkpoint}", "--port", "{port}", "--max-model-len", "34816"]
///
///   ["tt-worker-openai", "--engine", "llama-server", "--", "llama-server", "-m", "{checkpoint}", "--port", "{port}", "--metrics"]
///
/// In the engine's arguments `{port}` becomes a free loopback port the worker
/// picked, `{checkpoint}` the model's checkpoint (TT_WORKER_MODEL), `{tp}`
/// its tensor parallelism (TT_WORKER_TP) and `{cache_dir}` the cache
/// variant's directory (TT_CACHE_DIR); an argument that is exactly
/// `{devices}` becomes `--device <node>` for each of the slot's cards
/// (TT_WORKER_DEVICES), for `docker run`/`podman run`. With traces on
/// (TT_WORKER_OTLP_ENDPOINT), a vLLM command without
/// `--otlp-traces-endpoint` gets it, so vLLM's spans join the request's
/// trace (each request carries `traceparent`). The engine gets the worker's
/// environment plus TT_CACHE_PATH={cache_dir}/weights (the tensor cache),
/// TT_METAL_CACHE=<model cache dir>/kernels-<variant> (compiled kernels,
/// outside the variant; an existing TT_METAL_CACHE is kept) and, on a cold
/// start, TT_TRANSFORMERS_FORCE_MODEL_LOAD=1. Its output is the worker's
/// (the daemon reads `<FLAG> engaged` banners there). The engine runs in
/// its own process group; stopping the worker stops the whole group.
///
/// Health reads the engine's /metrics (at most twice a second, while the
/// daemon polls); vLLM logs every request it serves unless started with
/// `--disable-uvicorn-access-log`.
#[derive(Debug, Parser)]
#[command(name = "tt-worker-openai", version, verbatim_doc_comment)]
pub struct Cli {
    /// Which engine runs behind the worker; sets the defaults of the options
    /// below.
    #[arg(long, value_enum, default_value_t = EngineKind::Vllm)]
    pub engine: EngineKind,
    /// The engine's path that answers 200 once it can serve
    /// [default: /health].
    #[arg(long, value_name = "PATH")]
    pub health_path: Option<String>,
    /// The request field set to `true` to ask for token ids
    /// [default: vllm `return_token_ids`, llama-server `return_tokens`];
    /// `none` asks for nothing. When the engine returns no ids the deltas
    /// carry text only (the daemon then counts one token per delta).
    #[arg(long, value_name = "FIELD")]
    pub token_ids_field: Option<String>,
    /// Seconds the engine may take from start to ready (health 200 and a
    /// model listed); past it the worker stops the engine and exits 1. The
    /// daemon's own readiness deadline usually ends a start first.
    #[arg(long, value_name = "SECS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub ready_timeout_secs: u64,
    /// Seconds the engine may take to exit after SIGTERM before its process
    /// group gets SIGKILL (the worker then exits 1: its cards need a reset)
    /// [default: 15; vllm-tt 60]. Keep it below the model's
    /// `restart.stop_timeout_secs`.
    #[arg(long, value_name = "SECS")]
    pub stop_timeout_secs: Option<u64>,
    /// Seconds in-flight requests may finish after SIGTERM before they are
    /// cancelled (a Shutdown call brings its own drain timeout).
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub sigterm_drain_secs: u64,
    /// `max_tokens` sent for requests that leave it 0; by default the field
    /// is left out and the engine's own default applies (vLLM's completions
    /// default is 16 tokens).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub default_max_tokens: Option<u32>,
    /// The container the engine command runs (`docker run --name NAME
    /// --rm ...`): a stale one of that name is removed before the start, and
    /// the worker runs `<runtime> stop` beside SIGTERM and `<runtime> rm -f`
    /// after every end, since signals to the `docker run` client do not
    /// reliably reach the container.
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    /// The container runtime's command.
    #[arg(long, value_name = "PROGRAM", default_value = "docker")]
    pub container_runtime: String,
    /// The contract the daemon passes every worker (socket, checkpoint,
    /// tp, cache dir and mode, cards, device nodes).
    #[command(flatten)]
    pub contract: ContractArgs,
    /// The engine's command line (after `--`).
    #[arg(last = true, required = true, num_args = 1.., value_name = "ENGINE")]
    pub engine_argv: Vec<String>,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The engine kind.
    pub kind: EngineKind,
    /// Health path, starting with `/`.
    pub health_path: String,
    /// Field asking for token ids; `None` asks for nothing.
    pub token_ids_field: Option<String>,
    /// Deadline from spawn to ready.
    pub ready_timeout: Duration,
    /// SIGTERM to SIGKILL.
    pub stop_timeout: Duration,
    /// Drain after SIGTERM.
    pub sigterm_drain: Duration,
    /// `max_tokens` for requests leaving it 0.
    pub default_max_tokens: Option<u32>,
    /// Container name and runtime.
    pub container: Option<Container>,
    /// The contract as validated.
    pub contract: Contract,
    /// The socket to serve on.
    pub socket: PathBuf,
    /// The checkpoint.
    pub checkpoint: String,
    /// TP degree.
    pub tp: u32,
    /// The cache variant's directory.
    pub cache_dir: PathBuf,
    /// Warm or cold.
    pub cache_mode: CacheMode,
    /// BDF per rank.
    pub bdfs: Vec<String>,
    /// Device node per rank (`{devices}`).
    pub devices: Vec<String>,
    /// The engine's command line before substitution.
    pub engine_argv: Vec<String>,
    /// The `vllm-tt` preset's additions (None for other engines).
    pub tt: Option<crate::tt::Preset>,
}

/// A container the engine runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// `--container`.
    pub name: String,
    /// `--container-runtime`.
    pub runtime: String,
}

pub use tt_worker_contract::UsageError;

impl Cli {
    /// Checks the arguments and the contract's environment.
    pub fn settings(self) -> Result<Settings, UsageError> {
        let health_path = self
            .health_path
            .unwrap_or_else(|| self.engine.default_health_path().to_string());
        if !health_path.starts_with('/') {
            return Err(UsageError(format!(
                "--health-path {health_path:?} must start with `/`"
            )));
        }
        let token_ids_field = match self.token_ids_field {
            Some(f) if f == "none" => None,
            Some(f) if f.is_empty() => {
                return Err(UsageError(
                    "--token-ids-field is empty; give a field name or `none`".into(),
                ))
            }
            Some(f) => Some(f),
            None => Some(self.engine.default_token_ids_field().to_string()),
        };
        let contract = self.contract.validate()?;
        if self.engine_argv.iter().any(|a| a == DEVICES)
            && contract.devices.len() != contract.bdfs.len()
        {
            return Err(UsageError(format!(
                "the engine command has `{DEVICES}` but {} lists {} device node(s) for {} card(s); the daemon sets it (tt-servingd 0.1 with the device-node contract), or export it to run by hand",
                names::DEVICES,
                contract.devices.len(),
                contract.bdfs.len()
            )));
        }
        let container = match self.container {
            Some(name) if name.is_empty() => {
                return Err(UsageError(
                    "--container is empty; give the container's name or leave the option out"
                        .into(),
                ))
            }
            Some(name) => Some(Container {
                name,
                runtime: self.container_runtime,
            }),
            None => None,
        };
        if self.engine_argv.first().is_none_or(|p| p.is_empty()) {
            return Err(UsageError(
                "no engine command after `--`; e.g. `tt-worker-openai -- vllm serve {checkpoint} --port {port}`".into(),
            ));
        }
        if !self.engine_argv.iter().any(|a| a.contains("{port}")) {
            return Err(UsageError(format!(
                "the engine command {:?} has no `{{port}}`: the worker picks the port and must tell the engine (e.g. `--port {{port}}`)",
                self.engine_argv
            )));
        }
        let table = std::env::var(names::TT_CONFIG).ok();
        let (engine_argv, tt) = if self.engine == EngineKind::VllmTt {
            let preset = crate::tt::preset(self.engine_argv, contract.tp, table.as_deref(), |n| {
                std::env::var(n).ok()
            })?;
            (preset.argv.clone(), Some(preset))
        } else if table.is_some() {
            // Fail closed: the model's TT settings would be dropped.
            return Err(UsageError(format!(
                "{} is set (the model has a [models.<name>.tt] table) but --engine is {}: only --engine vllm-tt passes TT settings; remove the table or use vllm-tt",
                names::TT_CONFIG,
                self.engine.name()
            )));
        } else {
            (self.engine_argv, None)
        };
        Ok(Settings {
            kind: self.engine,
            health_path,
            token_ids_field,
            ready_timeout: Duration::from_secs(self.ready_timeout_secs),
            stop_timeout: Duration::from_secs(
                self.stop_timeout_secs
                    .unwrap_or_else(|| self.engine.default_stop_timeout_secs()),
            ),
            sigterm_drain: Duration::from_secs(self.sigterm_drain_secs),
            default_max_tokens: self.default_max_tokens,
            container,
            socket: contract.socket.clone(),
            checkpoint: contract.model.clone(),
            tp: contract.tp,
            cache_dir: contract.cache_dir.clone(),
            cache_mode: contract.cache_mode,
            bdfs: contract.bdfs.clone(),
            devices: contract.devices.clone(),
            contract,
            engine_argv,
            tt,
        })
    }
}

/// The engine argument that becomes `--device <node>` per card.
pub const DEVICES: &str = "{devices}";

impl Settings {
    /// The engine's command line with the placeholders filled in. Other
    /// text in braces (JSON in an engine option, say) is left alone.
    pub fn engine_command(&self, port: u16) -> Vec<String> {
        let cache_dir = self.cache_dir.display().to_string();
        let mut argv = Vec::with_capacity(self.engine_argv.len());
        for a in &self.engine_argv {
            // One `--device` per slot card, never the whole /dev/tenstorrent:
            // a container given every card can open another slot's.
            if a == DEVICES {
                for node in &self.devices {
                    argv.push("--device".to_string());
                    argv.push(node.clone());
                }
                continue;
            }
            argv.push(
                a.replace("{port}", &port.to_string())
                    .replace("{checkpoint}", &self.checkpoint)
                    .replace("{tp}", &self.tp.to_string())
                    .replace("{cache_dir}", &cache_dir),
            );
        }
        // Traces on: vLLM exports its own request spans to the same
        // collector, children of this worker's (it reads the traceparent
        // header the worker sends; vllm/entrypoints/openai/... takes
        // `--otlp-traces-endpoint`, vllm/config/observability.py in 0.32).
        // A command that names the flag itself keeps its own value.
        if let Some(endpoint) = &self.contract.otlp_endpoint {
            if self.kind.is_vllm() && !argv.iter().any(|a| a.starts_with(VLLM_OTLP_FLAG)) {
                argv.push(VLLM_OTLP_FLAG.to_string());
                argv.push(endpoint.clone());
            }
        }
        argv
    }
}

/// vLLM's option that turns its OpenTelemetry export on.
pub const VLLM_OTLP_FLAG: &str = "--otlp-traces-endpoint";

/// Where compiled kernels go (`TT_METAL_CACHE`): beside the variant dir, in
/// the model's cache dir, as `kernels-<variant>`.
///
/// Never inside the variant dir: after a warm start the daemon's cache
/// guard deletes every file the variant's marker does not list and refuses
/// the start (the field's NaN-placeholder trap), and tt-metal compiles
/// kernels on the first request of each new shape, long after the marker
/// was written. Kernels also follow the engine build, not the weights, so
/// they have no place in the weights' completeness marker.
pub fn kernel_cache_dir(cache_dir: &Path) -> Result<PathBuf, UsageError> {
    match (cache_dir.parent(), cache_dir.file_name()) {
        (Some(parent), Some(variant)) if !parent.as_os_str().is_empty() => {
            let mut name = std::ffi::OsString::from("kernels-");
            name.push(variant);
            Ok(parent.join(name))
        }
        _ => Err(UsageError(format!(
            "TT_CACHE_DIR {} has no parent directory to put the kernel cache beside it; give an absolute variant path (<cache_dir>/<model>/<variant>) or set TT_METAL_CACHE",
            cache_dir.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Result<Settings, String> {
        let mut argv = vec!["tt-worker-openai"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        cli.settings().map_err(|e| e.to_string())
    }

    const CONTRACT: &[&str] = &[
        "--socket",
        "/run/w.sock",
        "--model",
        "/models/qwen",
        "--tp",
        "2",
        "--cache-dir",
        "/var/cache/tt/qwen/abc123",
        "--cache-mode",
        "cold",
        "--visible-devices",
        "0000:01:00.0,0000:02:00.0",
    ];

    #[test]
    fn vllm_tt_refuses_tensor_parallelism_and_adds_the_tt_scheduler_settings() {
        let tt = |extra: &[&'static str]| {
            let mut args = vec!["--engine", "vllm-tt"];
            args.extend(with_contract(&[
                "--", "python", "-m", "api", "--port", "{port}",
            ]));
            args.extend_from_slice(extra);
            cli(&args)
        };
        // The contract's TP is 2: `{tp}` would ask vLLM for 2.
        for bad in [
            &["--tensor-parallel-size", "{tp}"][..],
            &["-tp", "2"],
            &["--tensor-parallel-size=2"],
        ] {
            let e = tt(bad).unwrap_err();
            assert!(e.contains("MESH_DEVICE") && e.contains("vllm-tt"), "{e}");
        }
        let s = tt(&["--max-model-len", "32768"]).unwrap();
        let argv = s.engine_command(8000);
        assert_eq!(
            &argv[argv.len() - 4..],
            ["--block-size", "64", "--max-num-batched-tokens", "32768"]
        );
        assert_eq!(s.stop_timeout, Duration::from_secs(60));
        // The operator's own choices stand.
        let s = tt(&["--block-size", "32", "--max-num-batched-tokens=4096"]).unwrap();
        assert!(!s.engine_command(1).iter().any(|a| a == "64"));
        let s = tt(&["--tensor-parallel-size", "1"]).unwrap();
        assert_eq!(s.kind, EngineKind::VllmTt);
    }

    #[test]
    fn with_traces_on_vllm_is_given_the_collector_unless_its_command_names_one() {
        let run = |engine: &'static str, traced: bool, tail: &[&'static str]| {
            let mut args = vec!["--engine", engine];
            if traced {
                args.extend(["--otlp-endpoint", "http://127.0.0.1:4317"]);
            }
            args.extend(with_contract(&["--", "serve", "--port", "{port}"]));
            args.extend_from_slice(tail);
            cli(&args).unwrap().engine_command(9)
        };
        let argv = run("vllm", true, &[]);
        assert_eq!(
            &argv[argv.len() - 2..],
            ["--otlp-traces-endpoint", "http://127.0.0.1:4317"]
        );
        assert!(!run("vllm", false, &[]).iter().any(|a| a.contains("otlp")));
        // llama-server has no such flag: it is never given one.
        assert!(!run("llama-server", true, &[])
            .iter()
            .any(|a| a.contains("otlp")));
        // The operator's own value stands.
        let own = run(
            "vllm",
            true,
            &["--otlp-traces-endpoint=http://10.0.0.1:4317"],
        );
        assert_eq!(
            own.iter().filter(|a| a.contains("otlp")).count(),
            1,
            "{own:?}"
        );
        // An endpoint the exporter cannot use is refused before anything runs.
        let mut args = vec!["--otlp-endpoint", "https://x:4317"];
        args.extend(with_contract(&["--", "serve"]));
        let e = cli(&args).unwrap_err();
        assert!(
            e.contains("TT_WORKER_OTLP_ENDPOINT") && e.contains("https"),
            "{e}"
        );
    }

    fn with_contract(extra: &[&'static str]) -> Vec<&'static str> {
        let mut v = CONTRACT.to_vec();
        v.extend_from_slice(extra);
        v
    }

    #[test]
    fn placeholders_are_substituted_and_other_braces_kept() {
        let s = cli(&with_contract(&[
            "--",
            "vllm",
            "serve",
            "{checkpoint}",
            "--port",
            "{port}",
            "--tensor-parallel-size",
            "{tp}",
            "--download-dir",
            "{cache_dir}/hf",
            "--override-generation-config",
            "{\"temperature\": 0}",
        ]))
        .unwrap();
        assert_eq!(
            s.engine_command(41234),
            [
                "vllm",
                "serve",
                "/models/qwen",
                "--port",
                "41234",
                "--tensor-parallel-size",
                "2",
                "--download-dir",
                "/var/cache/tt/qwen/abc123/hf",
                "--override-generation-config",
                "{\"temperature\": 0}",
            ]
        );
    }

    #[test]
    fn defaults_follow_the_engine_kind() {
        let v = cli(&with_contract(&["--", "vllm", "--port", "{port}"])).unwrap();
        assert_eq!(v.token_ids_field.as_deref(), Some("return_token_ids"));
        assert_eq!(v.health_path, "/health");
        let l = cli(&with_contract(&[
            "--engine",
            "llama-server",
            "--token-ids-field",
            "none",
            "--",
            "llama-server",
            "--port",
            "{port}",
        ]))
        .unwrap();
        assert_eq!(l.kind, EngineKind::LlamaServer);
        assert_eq!(l.token_ids_field, None);
    }

    #[test]
    fn an_engine_command_without_a_port_is_refused() {
        let e = cli(&with_contract(&["--", "vllm", "serve", "m"])).unwrap_err();
        assert!(e.contains("{port}"), "{e}");
    }

    #[test]
    fn a_card_count_other_than_tp_is_refused() {
        let mut args = CONTRACT.to_vec();
        args[5] = "1";
        args.extend_from_slice(&["--", "vllm", "--port", "{port}"]);
        let e = cli(&args).unwrap_err();
        assert!(e.contains("one BDF per rank"), "{e}");
    }

    #[test]
    fn kernels_live_beside_the_variant_not_in_it() {
        let k = kernel_cache_dir(Path::new("/var/cache/tt/qwen/abc123")).unwrap();
        assert_eq!(k, Path::new("/var/cache/tt/qwen/kernels-abc123"));
        assert!(!k.starts_with("/var/cache/tt/qwen/abc123"));
        assert!(kernel_cache_dir(Path::new("/")).is_err());
    }

    #[test]
    fn devices_become_one_device_option_per_card_and_need_the_daemons_list() {
        let mut args = vec!["--devices", "/dev/tenstorrent/3,/dev/tenstorrent/1"];
        args.extend(with_contract(&[
            "--",
            "podman",
            "run",
            "{devices}",
            "img",
            "--port",
            "{port}",
        ]));
        let s = cli(&args).unwrap();
        assert_eq!(
            s.engine_command(9),
            [
                "podman",
                "run",
                "--device",
                "/dev/tenstorrent/3",
                "--device",
                "/dev/tenstorrent/1",
                "img",
                "--port",
                "9"
            ]
        );
        // Without the daemon's list the placeholder cannot be filled: refused.
        let e = cli(&with_contract(&[
            "--",
            "podman",
            "run",
            "{devices}",
            "--port",
            "{port}",
        ]))
        .unwrap_err();
        assert!(
            e.contains("TT_WORKER_DEVICES") && e.contains("{devices}"),
            "{e}"
        );
    }
}
