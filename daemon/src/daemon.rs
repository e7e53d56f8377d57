//! `tt-servingd run`: wiring the parts together and the daemon's life from
//! start to clean shutdown.
//!
//! Order of startup: load config, take card locks, bind both sockets (so
//! `ttctl status` works during long startup work), apply the startup reset
//! policy, then READY=1. A tick loop re-reads the hardware, retries locks held
//! by others, and feeds the systemd watchdog. SIGTERM/SIGINT stop the
//! servers, release the locks and record a clean shutdown, which the next
//! start's `if-unclean` policy reads.

use crate::api;
use crate::cards::CardManager;
use crate::config::{Config, ReadyWhen, ResetPolicy};
use crate::notify;
use crate::shutdown::{self, Shutdown};
use crate::slots::{SlotManager, SlotState, SlotView};
use crate::state::DaemonState;
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const CLEAN_SHUTDOWN: &str = "clean-shutdown";

/// Refuse, before any card is touched, a driver or a tt-smi the daemon
/// cannot prove or name resets with (the same rule `check-config` applies),
/// and say which proofs the driver allows.
async fn check_card_tools(
    config: &Config,
    hw: &crate::cards::discovery::HardwareRoot,
) -> anyhow::Result<()> {
    use crate::cards::driver::{self, DriverStatus};
    match driver::driver_status(hw) {
        DriverStatus::NotLoaded => tracing::warn!(
            sys_root = %config.hardware.sys_root.display(),
            "the tenstorrent kernel driver is not loaded (no module/tenstorrent in sys_root); no cards can be found. On NixOS set hardware.tenstorrent.enable = true"
        ),
        DriverStatus::Refused(why) => anyhow::bail!("{why}"),
        DriverStatus::Supported(d) => {
            tracing::info!(driver = %d.version, proofs = %d.proofs(), "tenstorrent driver");
            if let Some(weaker) = d.weaker_proof() {
                if config.reset.probe_command.is_empty() {
                    tracing::warn!("{weaker}");
                }
            }
        }
    }
    let tt_smi = config.hardware.tt_smi.clone();
    let version = tokio::task::spawn_blocking(move || driver::check_tt_smi(&tt_smi))
        .await
        .context("checking tt-smi's version")?
        .map_err(|why| anyhow::anyhow!("{why}"))?;
    tracing::info!(tt_smi = %config.hardware.tt_smi.display(), %version, "tt-smi");
    Ok(())
}

/// Run the daemon until SIGTERM or SIGINT.
pub async fn run(config: Config, config_path: &Path) -> anyhow::Result<()> {
    let started = SystemTime::now();
    // SIGHUP's default action ends the process; catch it from the start.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot install the SIGHUP handler")?;
    // SIGTERM and SIGINT too: installed only once the daemon serves, a stop
    // sent in between (systemd stopping a unit that just started, a test's
    // quick SIGTERM) took the default action, death without the clean
    // shutdown (seen as `terminate()` returning no exit code under load).
    let terms = (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot install the SIGTERM handler")?,
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .context("cannot install the SIGINT handler")?,
    );
    // Secrets and groups first: a tokens file every user can read, a bad
    // certificate or a missing admin group stops the daemon before it
    // touches a card.
    let public_port = api::PublicPort::load(&config)?;
    let admin_rule = api::AdminRule::resolve(config.daemon.control_admin_group.as_deref())?;
    // Traces: the exporter connects lazily, so a collector that starts
    // later (or restarts) loses nothing but the spans made meanwhile.
    let traces = match config.tracing.otlp_endpoint.as_str() {
        "" => None,
        endpoint => Some(
            tt_serving_telemetry::start(endpoint, "tt-servingd", Vec::new())
                .context("cannot start the OpenTelemetry exporter (tracing.otlp_endpoint)")?,
        ),
    };
    notify::status("starting: checking directories");
    crate::hostfs::ensure_daemon_dirs(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Before anything touches a card: a live daemon on the control socket
    // means this one must not start at all.
    let mode = u32::from_str_radix(
        config.daemon.control_socket_mode.trim_start_matches("0o"),
        8,
    )
    .context("daemon.control_socket_mode is not octal")?;
    let control_listener = api::bind_control_socket(
        &config.daemon.control_socket,
        mode,
        config.daemon.control_socket_group.as_deref(),
    )?;
    // Before the daemon starts any process: its own cgroup may need it to
    // move into a leaf first (cgroup v2's no-internal-processes rule).
    let containment = crate::worker::containment::init(
        config.daemon.containment,
        &config.daemon.worker_socket_dir(),
    )
    .map_err(|why| anyhow::anyhow!("{why}"))?;
    notify::status("starting: checking the driver and tt-smi");
    let hw = crate::cards::discovery::HardwareRoot::from(&config.hardware);
    check_card_tools(&config, &hw).await?;
    notify::status("starting: discovering cards");
    let cards = CardManager::new(&config, crate::bus::StatusBus::new()).with_context(|| {
        format!(
            "cannot read cards under {}",
            config.hardware.sys_root.display()
        )
    })?;
    // A crash leaves no record, so the next start knows the cards may be
    // wedged (an engine killed mid-run leaves them failing to initialise).
    let clean_record = config.daemon.state_dir.join(CLEAN_SHUTDOWN);
    let previous_was_clean = crate::hostfs::is_plain_file(&clean_record);
    crate::hostfs::remove_file(&clean_record)
        .with_context(|| format!("cannot remove {}", clean_record.display()))?;
    let public_listener = crate::listen::bind(&config.daemon.listen, crate::listen::BACKLOG)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (daemon.listen); is another server using the port?",
                config.daemon.listen
            )
        })?;
    let metrics_listener = if config.metrics.listen.is_empty() {
        None
    } else {
        Some(
            crate::listen::bind(&config.metrics.listen, crate::listen::BACKLOG)
                .await
                .with_context(|| {
                    format!(
                        "cannot listen on {} (metrics.listen); is another exporter using the port? Set another address, or \"\" to turn metrics off",
                        config.metrics.listen
                    )
                })?,
        )
    };
    // The OpenAI front door: the same tokens and TLS files as the gRPC port.
    let openai_listener = if config.openai.listen.is_empty() {
        None
    } else {
        Some(crate::listen::bind(&config.openai.listen, crate::listen::BACKLOG).await.with_context(|| {
            format!(
                "cannot listen on {} (openai.listen); is another server (a standalone vLLM?) using the port? Set another address, or \"\" to turn the front door off",
                config.openai.listen
            )
        })?)
    };
    let openai_tls = match (&config.inference.tls_cert, &config.inference.tls_key) {
        (Some(cert), Some(key)) if openai_listener.is_some() => {
            Some(api::openai::HttpTls::load(cert, key)?)
        }
        _ => None,
    };
    let openai_address = openai_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .unwrap_or_default();
    let metrics_address = metrics_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .unwrap_or_default();
    let inference_address = public_listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| config.daemon.listen.clone());

    let (reporter, health) = tonic_health::server::health_reporter();
    let slots = SlotManager::new(&config, cards.clone());
    let (trigger, shutdown) = shutdown::channel();
    let state = Arc::new(DaemonState::new(
        crate::state::Process {
            config_path: config_path.to_path_buf(),
            started,
            inference_address: inference_address.clone(),
            metrics_address: metrics_address.clone(),
            openai_address: openai_address.clone(),
        },
        cards,
        slots,
        shutdown.clone(),
    ));
    // A reload asked for while starting waits for startup to finish.
    let startup_turn = state.reloads().turn().await;
    let hangups = tokio::spawn(reload_on_sighup(state.clone(), hangups));

    api::init_health(&reporter, &state).await;
    let control_task = tokio::spawn(api::serve_control(
        control_listener,
        state.clone(),
        admin_rule,
        health.clone(),
        shutdown.clone(),
    ));
    let tls = public_port.tls();
    let tokens_required = public_port.tokens_required();
    // The doors run on the relay runtime, and so does every connection they
    // accept and every stream they relay.
    let openai_task = openai_listener.map(|listener| {
        crate::relay_runtime::spawn(api::openai::serve(
            listener,
            state.clone(),
            public_port.token_check(),
            openai_tls,
            shutdown.clone(),
        ))
    });
    let public_task = crate::relay_runtime::spawn(api::serve_public(
        public_listener,
        state.clone(),
        public_port,
        health,
        shutdown.clone(),
    ));
    if let Some(listener) = metrics_listener {
        tokio::spawn(api::metrics::serve(
            listener,
            state.clone(),
            shutdown.clone(),
        ));
    }
    tracing::info!(
        control_socket = %state.config().daemon.control_socket.display(),
        inference = %inference_address,
        metrics = %metrics_address,
        openai = %openai_address,
        tls,
        tokens_required,
        "listening"
    );

    let signals = tokio::spawn(wait_for_signal(trigger.clone(), terms));
    let starting = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let ticker = tokio::spawn(tick_loop(state.clone(), starting.clone(), shutdown.clone()));
    let ledger = Arc::new(crate::usage::Ledger::new(&state.config().daemon.state_dir));
    let flusher = tokio::spawn(crate::usage::flush_every(ledger.clone()));

    startup_resets(&state, previous_was_clean, &shutdown).await;
    state.slot_manager().start_all();
    wait_until_ready(&state, &shutdown).await;
    starting.store(false, std::sync::atomic::Ordering::Relaxed);
    let summary = state.summary();
    notify::ready(&summary);
    tracing::info!(%summary, "ready");
    drop(startup_turn);

    shutdown.clone().wait().await;
    notify::stopping("stopping: draining slots, stopping workers, releasing card locks");
    tracing::info!("shutting down");
    // New connections are refused from here; in-flight streams finish while
    // the workers drain (each worker finishes or cancels its sequences
    // within its model's drain timeout), then the workers stop cleanly.
    let limit = state.config().stop_limit();
    // systemd's stop timeout is a floor: ask for what the config needs.
    notify::extend_timeout(limit + Duration::from_secs(10));
    state.slot_manager().stop_all(limit).await;
    for task in [control_task, public_task].into_iter().chain(openai_task) {
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "server ended with an error"),
            Ok(Err(e)) => tracing::error!(error = %e, "server task failed"),
            Err(_) => tracing::warn!("a server did not finish within 10s of the drain; closing it"),
            Ok(Ok(Ok(()))) => {}
        }
    }
    signals.abort();
    hangups.abort();
    ticker.abort();
    // Every stream has ended: the last window goes to the ledger.
    flusher.abort();
    ledger.flush();
    containment.close();
    state.cards().release_all();
    api::remove_control_socket(&state.config().daemon.control_socket);
    crate::hostfs::write_atomic(
        &clean_record,
        format!("{}\n", tt_serving_proto::time::unix_ms(SystemTime::now())).as_bytes(),
        0o644,
    )
    .with_context(|| {
        format!(
            "cannot record the clean shutdown in {}",
            clean_record.display()
        )
    })?;
    // The last spans (the drained requests', the slots' stops).
    if let Some(traces) = traces {
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Wait until `daemon.ready_when` holds: every slot (or any slot) Ready, or
/// given up on (Failed without a retry, Quarantined), so that systemd learns
/// the outcome instead of timing out.
async fn wait_until_ready(state: &Arc<DaemonState>, shutdown: &Shutdown) {
    let mut changes = state.subscribe();
    loop {
        let slots = state.slots();
        let settled = |s: &SlotView| {
            s.state == SlotState::Ready
                || s.state == SlotState::Quarantined
                || (s.state == SlotState::Failed && s.retry_at.is_none())
        };
        let ready = slots.is_empty()
            || match state.config().daemon.ready_when {
                ReadyWhen::All => slots.iter().all(settled),
                ReadyWhen::Any => {
                    slots.iter().any(|s| s.state == SlotState::Ready) || slots.iter().all(settled)
                }
            };
        if ready || shutdown.is_triggered() {
            return;
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = shutdown.clone().wait() => return,
        }
    }
}

async fn wait_for_signal(
    trigger: shutdown::ShutdownTrigger,
    (mut term, mut int): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
) {
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    trigger.trigger();
}

/// SIGHUP (by hand; `systemctl reload` runs `ttctl reload` instead)
/// reloads the config. Signals that arrive during a reload are merged into
/// one more reload after it, which reads the file as it is then.
async fn reload_on_sighup(state: Arc<DaemonState>, mut hangups: tokio::signal::unix::Signal) {
    while hangups.recv().await.is_some() {
        tracing::info!("SIGHUP received");
        let options = crate::reload::Options {
            dry_run: false,
            wait: true,
            show_values: true,
        };
        crate::reload::reload(&state, "SIGHUP", options).await;
    }
}

/// Reset managed cards at startup as the policy says. Groups (a slot's cards)
/// reset concurrently; a TP=2 slot's cards share one tt-smi call.
async fn startup_resets(state: &Arc<DaemonState>, previous_was_clean: bool, shutdown: &Shutdown) {
    let policy = state.config().reset.policy;
    let reset = match policy {
        ResetPolicy::Always => true,
        ResetPolicy::IfUnclean => !previous_was_clean,
        ResetPolicy::Never => false,
    };
    // Cards a worker left dirty (it did not stop cleanly) are reset
    // whatever the policy: an engine killed mid-run wedges its cards.
    let dirty = state.cards().dirty_cards();
    let groups: Vec<Vec<String>> = state
        .cards()
        .reset_groups()
        .into_iter()
        .filter(|group| reset || group.iter().any(|bdf| dirty.contains(bdf)))
        .collect();
    if groups.is_empty() {
        tracing::info!(?policy, previous_was_clean, "no startup reset");
        return;
    }
    tracing::info!(
        ?policy,
        previous_was_clean,
        dirty = %dirty.join(","),
        "resetting managed cards before use"
    );
    notify::status(&format!(
        "starting: resetting {} card group(s)",
        groups.len()
    ));
    let mut tasks = tokio::task::JoinSet::new();
    for group in groups {
        let cards = state.cards().clone();
        tasks.spawn(async move {
            let mut ignore = |_| {};
            if let Err(e) = cards.reset(&group, false, &mut ignore).await {
                tracing::error!(cards = %group.join(","), error = %e, "startup reset failed");
            }
        });
    }
    let drain = async { while tasks.join_next().await.is_some() {} };
    tokio::select! {
        _ = drain => {}
        _ = shutdown.clone().wait() => tracing::info!("shutdown during startup resets"),
    }
}

/// Every tick: re-read the hardware, retry foreign-held locks, refresh
/// STATUS=, feed the watchdog, and extend the start timeout while starting.
async fn tick_loop(
    state: Arc<DaemonState>,
    starting: Arc<std::sync::atomic::AtomicBool>,
    shutdown: Shutdown,
) {
    let tick = Duration::from_millis(state.config().daemon.tick_ms);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_summary = String::new();
    while !shutdown.is_triggered() {
        interval.tick().await;
        let cards = state.cards().clone();
        // Discovery reads many small files; keep it off the async workers.
        if tokio::task::spawn_blocking(move || cards.refresh())
            .await
            .is_err()
        {
            tracing::error!("card refresh panicked");
        }
        if starting.load(std::sync::atomic::Ordering::Relaxed) {
            notify::extend_timeout(tick * 3 + Duration::from_secs(10));
        }
        let summary = state.summary();
        if summary != last_summary {
            notify::status(&summary);
            last_summary = summary;
        }
        notify::watchdog();
    }
}
