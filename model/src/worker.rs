//! The worker's life: bind the socket, load, serve, drain, exit.

use crate::banners::Banners;
use crate::cache::{self, CacheMode};
use crate::chat_template::ChatTemplate;
use crate::cli::ServeArgs;
use crate::faults::{self, Faults};
use crate::gguf::Checkpoint;
use crate::kv::{self, BlockPool};
use crate::model::{self, KvDtype, Rank, Rope};
use crate::scheduler::{self, Engaged, SchedulerConfig};
use crate::server::{Ready, TtWorker};
use crate::state::{KvInfo, LoadedInfo, Status};
use crate::tokenizer::Tokenizer;
use crate::tp::Ranks;
use crate::weights::{self, DtypePolicy};
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tt_worker_contract::{process, Backend, Server, StopRequest};

/// Drain time granted to in-flight sequences on SIGTERM.
const SIGTERM_DRAIN: Duration = Duration::from_secs(5);

/// The matmul pools (ours, [`crate::pool`], and candle's for the dtypes our
/// kernels do not take) span every core. With several ranks that pool would
/// run one rank's matmul at a time; giving each rank its share of the cores
/// instead lets the ranks compute side by side, as they would on their own
/// cards. Must run before the first matmul (candle reads it once).
fn share_cores_between_ranks(tp: usize) {
    if tp > 1 && std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let per_rank = (cores / tp).max(1);
        std::env::set_var("CANDLE_NUM_THREADS", per_rank.to_string());
    }
}

/// Everything the load produced.
struct Loaded {
    ranks: Vec<Rank>,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    context: usize,
    info: LoadedInfo,
}

fn load(args: &ServeArgs, status: &Status, faults: &Faults) -> anyhow::Result<Loaded> {
    let started = Instant::now();
    status.set_progress(0, 0, format!("reading {}", args.model.display()));
    // A warm start reads the header the cold start cached, never the
    // checkpoint (whose header alone is ~50k tokenizer strings to parse).
    let ckpt = match args.cache_mode {
        CacheMode::Cold => Checkpoint::open(&args.model)?,
        CacheMode::Warm => {
            let (file, json) = cache::read_meta(&args.cache_dir)?;
            Checkpoint::from_meta(&args.model, &json)
                .map_err(|problem| cache::CacheError::BadHeader { file, problem })?
        }
    };
    let t_header = started.elapsed();
    let cfg = ckpt.config.clone();
    let tokenizer = Tokenizer::from_spec(&ckpt.tokenizer)?;
    let t_tokenizer = started.elapsed();
    let tok_text = |id: Option<u32>| {
        id.and_then(|i| ckpt.tokenizer.tokens.get(i as usize).cloned())
            .unwrap_or_default()
    };
    let template = ChatTemplate::new(
        ckpt.tokenizer.chat_template.as_deref(),
        tok_text(ckpt.tokenizer.bos),
        tok_text(ckpt.tokenizer.eos),
    )?;
    let policy = DtypePolicy {
        mlp_down_q8: args.mlp_down_q8,
    };
    let t_template = started.elapsed();
    let planned = weights::plan(&ckpt, args.tp, policy)?;
    let steps = planned.specs.iter().map(Vec::len).sum::<usize>().max(1) as u64;
    let pause = Duration::from_millis(faults.slow_load_ms / steps);
    let progress = |done: u32, total: u32, msg: String| status.set_progress(done, total, msg);
    let loaded = weights::load(
        &ckpt,
        args.tp,
        policy,
        &args.cache_dir,
        args.cache_mode,
        &progress,
        &|| {
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
            while faults.held() {
                std::thread::sleep(Duration::from_millis(10));
            }
        },
        faults.cache_write_error,
    )?;
    let t_tensors = started.elapsed();
    let mut files_written = loaded.files_written;
    let mut files_read = loaded.files_read;
    if args.cache_mode == CacheMode::Warm {
        files_read.insert(0, cache::META_FILE.to_string());
    }
    if args.cache_mode == CacheMode::Warm && faults.warm_extra_file {
        write_stray_file(&args.cache_dir)?;
        files_written.push(faults::STRAY_FILE.to_string());
    }

    let kv = if args.kv_f16 {
        KvDtype::F16
    } else {
        KvDtype::F32
    };
    let (context, kv_info) = kv_pool(args, &cfg, &loaded.partitions, kv)?;
    let rope = Arc::new(Rope::new(cfg.head_dim, context, cfg.rope_theta));
    let mut ranks = Vec::with_capacity(args.tp);
    for (tensors, part) in loaded.ranks.into_iter().zip(loaded.partitions) {
        ranks.push(Rank::new(
            &cfg,
            part,
            tensors,
            kv_info.blocks as usize,
            context,
            kv,
            rope.clone(),
        )?);
    }
    if faults.early_exit {
        let kept = ranks.iter_mut().map(Rank::exit_early).min().unwrap_or(0);
        tracing::warn!(
            layers = kept,
            of = cfg.n_layers,
            "test fault {}: running only the first layers; answers will be wrong",
            faults::EARLY_EXIT
        );
    }
    if args.kv_prefault {
        let bytes: usize = ranks.iter_mut().map(Rank::prefault_kv).sum();
        tracing::info!(
            mib = bytes >> 20,
            "KV pool prefaulted (TTW_KV_PREFAULT): resident now"
        );
    }
    let t_ranks = started.elapsed();
    tracing::debug!(
        ?t_header,
        ?t_tokenizer,
        ?t_template,
        ?t_tensors,
        ?t_ranks,
        "load phases (cumulative)"
    );
    let info = LoadedInfo {
        model_name: cfg.name.clone(),
        architecture: cfg.architecture.clone(),
        parameter_count: ckpt.parameter_count(),
        context_length: context as u32,
        cache_files_read: files_read,
        cache_files_written: files_written,
        load_time_ms: started.elapsed().as_millis() as u64,
        kv: kv_info,
    };
    Ok(Loaded {
        ranks,
        tokenizer,
        template,
        context,
        info,
    })
}

/// Sizes the KV pool from the budget, and the context it can serve: the
/// model's, capped by `--max-seq-len`, and by the pool (one sequence must
/// always fit, or a lone sequence could run out of blocks).
fn kv_pool(
    args: &ServeArgs,
    cfg: &crate::gguf::ModelConfig,
    partitions: &[crate::weights::Partition],
    dtype: KvDtype,
) -> anyhow::Result<(usize, KvInfo)> {
    // Every rank's heads: replicated heads cost memory on each rank.
    let heads: usize = partitions.iter().map(|p| p.kv_heads.len()).sum();
    let block = model::block_bytes(cfg.n_layers, heads, cfg.head_dim, dtype).max(1);
    let budget = args.kv_budget_mib.saturating_mul(1 << 20);
    let blocks = (budget / block).min(u32::MAX as usize);
    let per_token = block / kv::BLOCK_TOKENS;
    if blocks * kv::BLOCK_TOKENS < 2 {
        anyhow::bail!(
            "TTW_KV_BUDGET_MIB={} holds no KV block of this model ({} KiB per block of {} tokens); give at least {} MiB",
            args.kv_budget_mib,
            block / 1024,
            kv::BLOCK_TOKENS,
            block.div_ceil(1 << 20)
        );
    }
    let wanted = args
        .max_seq_len
        .map_or(cfg.context_length, |n| n.min(cfg.context_length));
    let context = wanted.min(blocks * kv::BLOCK_TOKENS);
    if context < wanted {
        tracing::warn!(
            "the KV budget of {} MiB holds {} tokens ({} bytes each): serving a context of {context} instead of {wanted}; raise TTW_KV_BUDGET_MIB to {} for the full context",
            args.kv_budget_mib,
            blocks * kv::BLOCK_TOKENS,
            per_token,
            (wanted * per_token).div_ceil(1 << 20)
        );
    }
    Ok((
        context,
        KvInfo {
            budget_bytes: (blocks * block) as u64,
            blocks: blocks as u32,
            prefix_cache: args.prefix_cache,
        },
    ))
}

/// Test fault: a warm start that leaves a file the marker does not list,
/// which the daemon's cache guard must catch.
fn write_stray_file(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join(faults::STRAY_FILE);
    std::fs::write(&path, b"placeholder written by TTW_FAULT_WARM_EXTRA_FILE")
        .with_context(|| format!("test fault: cannot write {}", path.display()))
}

/// Runs the worker until it is shut down; `Ok` means exit status 0.
pub fn serve(args: ServeArgs, faults: Faults) -> anyhow::Result<()> {
    // Dies with the parent: a daemon that crashed must not leave a worker
    // holding its cards. SIGKILL, as the daemon itself sets before exec
    // (this covers other parents): with the parent gone there is no client
    // left to drain for, and a drain can be held up by a step that never
    // ends. `main` also watches for being reparented.
    process::set_parent_death_signal(libc::SIGKILL);
    if let Some(code) = faults.exit_at_start {
        eprintln!("tt-worker: test fault TTW_FAULT_EXIT_AT_START: exiting with status {code}");
        std::process::exit(code);
    }
    share_cores_between_ranks(args.tp);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve_async(args, faults))
}

/// The optional parameters tt-worker honours: every one but the guided
/// decoding and tool calling of `response_format` and `tools`, which it
/// does not have (so the daemon refuses them by name). `seed` is honoured:
/// each sequence samples from its own generator seeded by the request,
/// over logits that are the same bits alone or in a batch (the
/// batch-invariant kernels of docs/ARCHITECTURE.md), so the same seed,
/// prompt and settings give the same text.
const HONOURED_PARAMETERS: [&str; 10] = {
    use tt_serving_proto::parameters::*;
    [
        PRESENCE_PENALTY,
        FREQUENCY_PENALTY,
        REPETITION_PENALTY,
        MIN_TOKENS,
        IGNORE_EOS,
        STOP_TOKEN_IDS,
        LOGPROBS,
        SEED,
        PROMPT_TOKENS,
        PROMPT_LOGPROBS,
    ]
};

async fn serve_async(args: ServeArgs, faults: Faults) -> anyhow::Result<()> {
    let status = Arc::new(Status::default());
    let banners = Arc::new(Banners::new(faults.skip_banner.clone()));
    let backend = Arc::new(TtWorker::new(
        HONOURED_PARAMETERS
            .iter()
            .filter(|p| !faults.withhold_parameters.iter().any(|w| w == *p))
            .map(|p| p.to_string())
            .collect(),
        status.clone(),
        banners.clone(),
    ));
    let mut server = Server::start(&args.contract, backend.clone())?;
    tracing::info!(socket = %args.socket.display(), kernels = crate::kernels::isa().name(), "serving engine.proto; loading {}", args.model.display());

    let load_args = args.clone();
    let load_status = status.clone();
    let load_faults = faults.clone();
    let loading = tokio::task::spawn_blocking(move || load(&load_args, &load_status, &load_faults));
    let loaded = tokio::select! {
        r = loading => match r.context("the load task panicked") {
            Ok(Ok(loaded)) => loaded,
            Ok(Err(e)) | Err(e) => {
                server.close().await;
                return Err(e);
            }
        },
        why = server.stop_requested() => {
            tracing::info!(?why, "asked to stop while loading; exiting");
            server.close().await;
            return Ok(());
        }
    };
    let mut flags = Vec::new();
    if args.mlp_down_q8 {
        flags.push("TTW_MLP_DOWN_Q8");
    }
    if args.kv_f16 {
        flags.push("TTW_KV_F16");
    }
    if args.prefix_cache {
        flags.push("TTW_PREFIX_CACHE");
    }
    if args.kernels_isa.is_some() {
        // The first step computes with the chosen instruction set.
        flags.push("TTW_KERNELS_ISA");
    }
    if faults.early_exit {
        flags.push(faults::EARLY_EXIT);
    }
    faults.start_leak();
    let pool = BlockPool::new(loaded.info.kv.blocks, args.prefix_cache);
    let tokenizer = Arc::new(loaded.tokenizer);
    let engine = scheduler::spawn(
        Ranks::start(loaded.ranks)?,
        tokenizer.clone(),
        SchedulerConfig {
            max_batch: args.max_batch,
            max_queue: args.max_queue,
            prefill_chunk: args.prefill_chunk,
            prefill_chunk_idle: args.prefill_chunk.max(512),
            context: loaded.context,
        },
        pool,
        status.clone(),
        banners,
        Engaged { flags },
        faults,
    )?;
    tracing::info!(
        model = %loaded.info.model_name,
        load_ms = loaded.info.load_time_ms,
        cache_mode = args.cache_mode.as_str(),
        "ready"
    );
    status.set_loaded(loaded.info);
    backend.set_ready(Ready {
        engine,
        tokenizer,
        template: loaded.template,
        context: loaded.context,
        default_max_tokens: args.default_max_tokens,
    });

    // Serve until a Shutdown call has drained us, or a signal arrives.
    if let StopRequest::Signal(why) = server.stop_requested().await {
        tracing::info!("{why}: draining for up to {}s", SIGTERM_DRAIN.as_secs());
        backend.drain(SIGTERM_DRAIN).await;
    }
    // The Shutdown call's own response is in flight; the close gives the
    // server a moment to send it, but never waits on a stuck client.
    server.close().await;
    if status
        .engine_stuck
        .load(std::sync::atomic::Ordering::Acquire)
    {
        anyhow::bail!(
            "the engine was stuck in a step and did not drain; exiting without it (its cards need a reset)"
        );
    }
    tracing::info!("drained; exiting");
    Ok(())
}
