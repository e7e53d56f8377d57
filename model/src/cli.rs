//! tt-worker's command line: the worker contract's options (flattened from
//! tt-worker-contract) and the engine's own, each also read from the
//! environment, which is how the daemon passes them. Bad arguments print a
//! clear error and exit with status 2.

use crate::cache::CacheMode;
use crate::kernels::{self, Isa};
use clap::builder::BoolishValueParser;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tt_worker_contract::{names, Contract, ContractArgs};

/// tt-worker: serves one GGUF Llama model over engine.proto on a unix socket.
#[derive(Debug, Parser)]
#[command(name = "tt-worker", version)]
pub struct Cli {
    /// The contract the daemon passes every worker (socket, checkpoint,
    /// tp, cache dir and mode, cards).
    #[command(flatten)]
    pub contract: ContractArgs,
    /// Sequences decoded together.
    #[arg(long, env = "TT_WORKER_MAX_BATCH", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_batch: u32,
    /// Sequences allowed to wait for a batch place before RESOURCE_EXHAUSTED.
    #[arg(long, env = "TT_WORKER_MAX_QUEUE", default_value_t = 32)]
    pub max_queue: u32,
    /// Tokens per sequence (prompt plus output); default and maximum: the
    /// model's context length.
    #[arg(long, env = "TT_WORKER_MAX_SEQ_LEN", value_parser = clap::value_parser!(u32).range(2..))]
    pub max_seq_len: Option<u32>,
    /// `max_tokens` for requests that leave it 0.
    #[arg(long, env = "TT_WORKER_DEFAULT_MAX_TOKENS", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub default_max_tokens: u32,
    /// Prompt tokens prefilled per step while other sequences decode.
    #[arg(long, env = "TT_WORKER_PREFILL_CHUNK", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefill_chunk: u32,
    /// Store the MLP down projection as Q8_0 (changes the cache files).
    #[arg(long, env = "TTW_MLP_DOWN_Q8", value_parser = BoolishValueParser::new(), num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub mlp_down_q8: bool,
    /// Keep the KV cache in f16 (halves its memory; no cache file changes).
    #[arg(long, env = "TTW_KV_F16", value_parser = BoolishValueParser::new(), num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub kv_f16: bool,
    /// Keep finished sequences' KV blocks and reuse them for requests that
    /// start with the same tokens (`0` turns it off).
    #[arg(long, env = "TTW_PREFIX_CACHE", value_parser = BoolishValueParser::new(), num_args = 0..=1, default_value = "true", default_missing_value = "true")]
    pub prefix_cache: bool,
    /// Memory for keys and values, all sequences and ranks together, in MiB:
    /// running sequences and the prefix cache share it. A budget smaller than
    /// one sequence of the full context shortens the context served.
    #[arg(long, env = "TTW_KV_BUDGET_MIB", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_budget_mib: u32,
    /// Make the whole KV budget resident at load, before the worker reports
    /// itself ready: the memory is claimed (and charged to the slot's
    /// memory cgroup) up front, so a `memory_max_mib` too small for the
    /// budget fails the start with an OOM kill instead of killing the worker
    /// under its first long request.
    #[arg(long, env = "TTW_KV_PREFAULT", value_parser = BoolishValueParser::new(), num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub kv_prefault: bool,
    /// The kernels' instruction set: `auto` (the best this CPU has) or a
    /// narrower one, to compare kernels side by side; every set computes
    /// the same bits, so answers do not change.
    #[arg(long, env = "TTW_KERNELS_ISA", default_value = "auto", value_parser = ["auto", "vnni", "avx2", "scalar"])]
    pub kernels_isa: String,
    /// Tools that are not part of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Hidden helper commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write the tiny deterministic Llama GGUF used by tests.
    #[command(hide = true)]
    MakeTestModel {
        /// Where to write it.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Validated serving arguments.
#[derive(Debug, Clone)]
pub struct ServeArgs {
    /// The contract as validated (what the engine.proto service reports).
    pub contract: Contract,
    /// Socket path.
    pub socket: PathBuf,
    /// Checkpoint.
    pub model: PathBuf,
    /// TP degree.
    pub tp: usize,
    /// Cache directory.
    pub cache_dir: PathBuf,
    /// Cache mode.
    pub cache_mode: CacheMode,
    /// BDF per rank.
    pub bdfs: Vec<String>,
    /// Batch size.
    pub max_batch: usize,
    /// Queue size.
    pub max_queue: usize,
    /// Requested context cap.
    pub max_seq_len: Option<usize>,
    /// Default output length.
    pub default_max_tokens: usize,
    /// Prefill chunk while decoding.
    pub prefill_chunk: usize,
    /// `TTW_MLP_DOWN_Q8`.
    pub mlp_down_q8: bool,
    /// `TTW_KV_F16`.
    pub kv_f16: bool,
    /// `TTW_PREFIX_CACHE`.
    pub prefix_cache: bool,
    /// `TTW_KV_BUDGET_MIB`.
    pub kv_budget_mib: usize,
    /// `TTW_KV_PREFAULT`.
    pub kv_prefault: bool,
    /// `TTW_KERNELS_ISA` when not `auto` (the kernels were told to use it).
    pub kernels_isa: Option<Isa>,
}

pub use tt_worker_contract::UsageError;

impl Cli {
    /// Checks the serving arguments against each other and the filesystem.
    pub fn serve_args(self) -> Result<ServeArgs, UsageError> {
        let contract = self.contract.validate()?;
        if std::env::var_os(names::TT_CONFIG).is_some() {
            // Fail closed: the model's vLLM-TT settings mean nothing here.
            return Err(UsageError(format!(
                "{} is set (the model has a [models.<name>.tt] table), but tt-worker is not vLLM-TT and cannot honour it; remove the table or run tt-worker-openai --engine vllm-tt",
                names::TT_CONFIG
            )));
        }
        let model = PathBuf::from(&contract.model);
        if !model.is_file() {
            return Err(UsageError(format!(
                "--model / {} {}: no such file (for the test model run scripts/fetch-smollm2.sh)",
                names::MODEL,
                model.display()
            )));
        }
        // clap allows only the names below and `auto` (None).
        let isa = Isa::from_name(&self.kernels_isa);
        if let Some(isa) = isa {
            kernels::choose_isa(isa).map_err(UsageError)?;
        }
        Ok(ServeArgs {
            socket: contract.socket.clone(),
            model,
            tp: contract.tp as usize,
            cache_dir: contract.cache_dir.clone(),
            cache_mode: contract.cache_mode,
            bdfs: contract.bdfs.clone(),
            contract,
            max_batch: self.max_batch as usize,
            max_queue: self.max_queue as usize,
            max_seq_len: self.max_seq_len.map(|n| n as usize),
            default_max_tokens: self.default_max_tokens as usize,
            prefill_chunk: self.prefill_chunk as usize,
            mlp_down_q8: self.mlp_down_q8,
            kv_f16: self.kv_f16,
            prefix_cache: self.prefix_cache,
            kv_budget_mib: self.kv_budget_mib as usize,
            kv_prefault: self.kv_prefault,
            kernels_isa: isa,
        })
    }
}
