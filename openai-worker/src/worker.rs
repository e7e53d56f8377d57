//! The worker's life: bind the socket, start the engine, wait until it is
//! ready, serve, and stop it (or report how it died), as phases composed in
//! [`life`].

use crate::cli::{self, Settings};
use crate::engine::{Engine, Stopped};
use crate::ready::Probe;
use crate::server::{Identity, OpenAiBackend};
use crate::status::Status;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tt_serving_proto::CacheMode;
use tt_worker_contract::{names, Server, StopRequest};
/// How often readiness is probed.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// After vLLM said its EngineCore died, how long its API server gets to
/// exit by itself before the worker stops it.
const CORE_DEATH_GRACE: Duration = Duration::from_secs(15);

/// How the worker ends when it fails: the status and the sentence naming
/// the cause.
#[derive(Debug)]
pub struct Failure {
    /// Exit status.
    pub code: i32,
    /// What happened and what to do.
    pub message: String,
}

impl Failure {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// The parent-death signal: the engine's group gets SIGKILL, then the
/// worker exits (a container is left to the parent watch, which removes it
/// within its poll). Only async-signal-safe calls.
extern "C" fn on_parent_death(_signal: libc::c_int) {
    if crate::engine::kill_group_from_signal_handler() {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(1) }
    }
}

/// Runs the worker until it stops; `Ok` means exit status 0.
pub fn run(settings: Settings) -> Result<(), Failure> {
    // SAFETY: sigaction installs a handler that makes only
    // async-signal-safe calls; prctl only sets process attributes.
    unsafe {
        // Dies with the daemon, as tt-worker does (docs/ARCHITECTURE.md,
        // "Worker lifetime"), but takes its engine's whole group first: a
        // SIGKILL here would leave vLLM's EngineCore, which has no
        // parent-death signal, running on the cards under init. SIGUSR2's
        // default action ends a process too, so a worker without this
        // handler still dies. `main` also watches for being reparented.
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_parent_death as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut());
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGUSR2 as libc::c_ulong,
            0,
            0,
            0,
        );
        // Orphans of the engine's group come to us, to be reaped and
        // accounted for (engine.rs).
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
    // One thread: relaying a token is a few microseconds of work, and a
    // second runtime thread only added cross-thread wake-ups (futex calls,
    // context switches) to every token: bench-cpu measured 4.4 context
    // switches per token with two threads, 2 with one (docs/PERFORMANCE.md,
    // "CPU per relayed token").
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::new(1, format!("cannot start the async runtime: {e}")))?;
    // `block_on` runs `life` on this thread, the process's main thread, so
    // the engine's parent-death signal (tied to the forking thread) fires
    // only when the worker itself dies.
    runtime.block_on(life(settings))
}

/// The engine's environment on top of the worker's own.
fn engine_env(s: &Settings) -> Result<Vec<(String, String)>, Failure> {
    let weights = s.cache_dir.join("weights");
    let kernels = match std::env::var_os("TT_METAL_CACHE") {
        // The operator's choice (a model's `env`) stands.
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => cli::kernel_cache_dir(&s.cache_dir).map_err(|e| Failure::new(2, e.0))?,
    };
    for dir in [&weights, &kernels] {
        std::fs::create_dir_all(dir).map_err(|e| {
            Failure::new(
                1,
                format!(
                    "cannot create {}: {e}; the daemon's cache_dir must be writable by the worker",
                    dir.display()
                ),
            )
        })?;
    }
    let mut env = vec![
        // tt_transformers' tensor cache: inside the variant, where the
        // daemon's marker and warm-start guard see every file.
        ("TT_CACHE_PATH".to_string(), weights.display().to_string()),
        // Compiled kernels: outside the variant (cli::kernel_cache_dir says
        // why).
        ("TT_METAL_CACHE".to_string(), kernels.display().to_string()),
    ];
    if let Some(tt) = &s.tt {
        env.extend(tt.env.iter().cloned());
        if std::env::var_os("HF_MODEL").is_none() {
            env.push(("HF_MODEL".to_string(), hf_model(s)?));
        }
    }
    if s.cache_mode == CacheMode::Cold {
        // A cold start rebuilds the tensor cache from the checkpoint instead
        // of trusting whatever files are there.
        env.push(("TT_TRANSFORMERS_FORCE_MODEL_LOAD".into(), "1".into()));
    }
    Ok(env)
}

/// `HF_MODEL` for vLLM-TT: tt_transformers refuses to start without it
/// and keys its model-specific settings by its last path component
/// (`tt::model_name`). A Hugging Face snapshot is named by a link after
/// its repository, as tt-inference-server names its weights
/// (`run_vllm_api_server.py:403-418`); any other checkpoint is its own
/// name.
fn hf_model(s: &Settings) -> Result<String, Failure> {
    let Some(name) = crate::tt::model_name(&s.checkpoint) else {
        return Ok(s.checkpoint.clone());
    };
    let link = crate::tt::hf_model_link(&s.cache_dir, &name).ok_or_else(|| {
        Failure::new(
            2,
            format!("the cache dir {} has no parent", s.cache_dir.display()),
        )
    })?;
    crate::tt::place_link(&link, Path::new(&s.checkpoint))
        .map_err(|e| Failure::new(1, format!("HF_MODEL: {e}")))?;
    tracing::info!(link = %link.display(), checkpoint = %s.checkpoint, model_name = %name, "HF_MODEL names the snapshot by its repository (tt_transformers keys its settings by the name)");
    Ok(link.display().to_string())
}

/// Whether the TT platform's model runner started in the engine: its line
/// comes long before `/health` answers (warm-up runs in between), but the
/// output is read on its own task, so a line still in the pipe gets a
/// moment.
async fn tt_platform_ran(engine: &Engine) -> bool {
    for _ in 0..20 {
        if engine.output.tt_runner_started() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A free loopback port for the engine. The port is released again before
/// the engine binds it; another process taking it in between makes the
/// engine fail to bind, and the worker exits naming the engine's exit.
fn free_port() -> Result<u16, Failure> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Failure::new(1, format!("cannot find a free loopback port: {e}")))
}

/// Why serving ended.
enum End {
    /// Shutdown call or signal: stop the engine.
    Stop,
    /// The engine died.
    Died(Failure),
}

async fn life(s: Settings) -> Result<(), Failure> {
    let env = engine_env(&s)?;
    let bound = Server::bind(&s.contract)
        .map_err(|e| Failure::new(names::EXIT_FAILURE.into(), e.to_string()))?;
    let port = free_port()?;
    let argv = s.engine_command(port);
    tracing::info!(socket = %s.socket.display(), engine = s.kind.name(), port, ?argv, "starting the engine");
    let started = Instant::now();
    let engine = match Engine::spawn(&argv, &env, s.container.clone()) {
        Ok(engine) => engine,
        Err(e) => {
            bound.abandon();
            return Err(Failure::new(names::EXIT_FAILURE.into(), e.to_string()));
        }
    };
    let status = Arc::new(Status::new(engine.output.clone()));
    let backend = Arc::new(OpenAiBackend::new(
        Identity {
            kind: s.kind,
            port,
            token_ids_field: s.token_ids_field.clone(),
            default_max_tokens: s.default_max_tokens,
            supported_parameters: crate::openai::supported_parameters(s.kind, &s.engine_argv),
            host_sampling_parameters: s
                .tt
                .as_ref()
                .map(|tt| tt.host_sampling_parameters())
                .unwrap_or_default(),
        },
        status.clone(),
    ));
    let mut server = bound.serve(&s.contract, backend);

    let end = match wait_ready(&s, &engine, &status, &mut server, port, started).await {
        Ok(()) => serve(&s, &engine, &status, &mut server).await,
        Err(end) => end,
    };
    let result = match end {
        End::Stop => stop_engine(&s, &engine).await,
        End::Died(failure) => Err(failure),
    };
    server.close().await;
    result
}

/// Loading: probes until ready, watching for the engine's death, a stop
/// request and the readiness deadline.
async fn wait_ready(
    s: &Settings,
    engine: &Engine,
    status: &Status,
    server: &mut Server,
    port: u16,
    started: Instant,
) -> Result<(), End> {
    let probe = Probe {
        kind: s.kind,
        port,
        health_path: s.health_path.clone(),
        started,
    };
    let deadline = tokio::time::sleep(s.ready_timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            exit = engine.wait() => return Err(End::Died(died(engine, exit).await)),
            gone = engine.output.subprocess_died() => return Err(End::Died(core_died(s, engine, gone).await)),
            why = server.stop_requested() => {
                if let StopRequest::Signal(why) = why {
                    tracing::info!("{why} while the engine was loading; stopping it");
                }
                return Err(End::Stop);
            }
            _ = &mut deadline => {
                // The last line before the stop says where the load hung.
                let last = engine.output.last_line();
                let stopped = engine.stop(s.stop_timeout).await;
                let mut message = format!(
                    "the engine was not ready within {}s (--ready-timeout-secs): its health path {} did not answer 200 with a model listed in /v1/models; last engine line: {last:?}",
                    s.ready_timeout.as_secs(),
                    s.health_path,
                );
                if stopped == Stopped::Killed {
                    message.push_str("; it ignored SIGTERM and was killed");
                }
                return Err(End::Died(Failure::new(1, message)));
            }
            loaded = async { tokio::time::sleep(PROBE_EVERY).await; probe.once().await } => {
                if let Some(loaded) = loaded {
                    if s.kind == cli::EngineKind::VllmTt && !tt_platform_ran(engine).await {
                        let stopped = engine.stop(s.stop_timeout).await;
                        let mut message = format!(
                            "vLLM answered {} but vllm-tt-plugin's model runner never started (no `{}` line): vLLM runs on another platform, because ttnn does not import in the engine's Python (the plugin's platform is active only then) or VLLM_PLUGINS leaves out `tt`; check `python -c 'import ttnn'` in that environment (a VLLM_LOGGING_LEVEL above INFO hides the line too)",
                            s.health_path,
                            crate::output::TT_RUNNER_LINE
                        );
                        if stopped == Stopped::Killed {
                            message.push_str("; it ignored SIGTERM and was killed");
                        }
                        return Err(End::Died(Failure::new(1, message)));
                    }
                    tracing::info!(
                        model = %loaded.model,
                        context_length = loaded.context_length,
                        load_ms = loaded.load_time.as_millis() as u64,
                        cache_mode = s.cache_mode.as_str(),
                        "the engine is ready"
                    );
                    if s.kind == cli::EngineKind::LlamaServer
                        && crate::openai::supported_parameters(s.kind, &s.engine_argv)
                            .contains(&tt_serving_proto::parameters::TOOLS)
                        && loaded.template_calls_tools != Some(true)
                    {
                        tracing::warn!(
                            "llama-server runs with --jinja, but the model's chat template cannot call tools (/props chat_template_caps.supports_tool_calls is not true): requests with tools are refused"
                        );
                    }
                    status.set_ready(loaded);
                    return Ok(());
                }
            }
        }
    }
}

/// Ready: serves until a Shutdown call (which drained already), a signal
/// (drain here) or the engine's death.
async fn serve(s: &Settings, engine: &Engine, status: &Status, server: &mut Server) -> End {
    tokio::select! {
        why = server.stop_requested() => {
            if let StopRequest::Signal(why) = why {
                tracing::info!("{why}: draining for up to {}s", s.sigterm_drain.as_secs());
                let report = status.drain(s.sigterm_drain).await;
                tracing::info!(finished = report.finished, cancelled = report.cancelled, "drained");
            }
            End::Stop
        }
        exit = engine.wait() => End::Died(died(engine, exit).await),
        gone = engine.output.subprocess_died() => End::Died(core_died(s, engine, gone).await),
    }
}

/// A requested stop: SIGTERM to the engine's group, bounded, then SIGKILL.
async fn stop_engine(s: &Settings, engine: &Engine) -> Result<(), Failure> {
    match engine.stop(s.stop_timeout).await {
        Stopped::Clean => {
            tracing::info!("stopped; exiting");
            Ok(())
        }
        Stopped::Killed => Err(Failure::new(
            1,
            format!(
                "the engine did not exit within {}s of SIGTERM (--stop-timeout-secs); its process group got SIGKILL, so its cards need a reset",
                s.stop_timeout.as_secs()
            ),
        )),
    }
}

/// The engine exited unasked: clear what is left of its group, let its
/// last output arrive, and name the cause.
async fn died(engine: &Engine, exit: std::process::ExitStatus) -> Failure {
    engine.reap_stragglers().await;
    // Its last lines (vLLM's core-death line among them) may still be in
    // the pipes.
    let _ = tokio::time::timeout(Duration::from_secs(2), engine.output.closed()).await;
    let (code, message) = engine.death(exit);
    Failure::new(code, message)
}

/// vLLM said its engine core is gone: the API server cannot serve any
/// more. It usually exits by itself (vLLM 0.32: about 7 s later, with status
/// 0); if not, it is stopped.
async fn core_died(s: &Settings, engine: &Engine, gone: crate::output::CoreGone) -> Failure {
    tracing::error!("vLLM's engine core is gone ({:?})", gone.line);
    match tokio::time::timeout(CORE_DEATH_GRACE, engine.wait()).await {
        Ok(exit) => died(engine, exit).await,
        Err(_) => {
            engine.stop(s.stop_timeout).await;
            let _ = tokio::time::timeout(Duration::from_secs(2), engine.output.closed()).await;
            Failure::new(
                1,
                format!(
                    "{}; the API server (pid {}) kept running without it and was stopped",
                    engine.core_gone_reason(&gone),
                    engine.pid()
                ),
            )
        }
    }
}
