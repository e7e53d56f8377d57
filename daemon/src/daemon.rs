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
use crate::cards::{CardManager, CardState};
use crate::config::{Config, ResetPolicy};
use crate::notify;
use crate::shutdown::{self, Shutdown};
use crate::slots::{self, SlotView};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tt_serving_proto::v1 as pb;

/// Shared state the API reads. Cards and slots each have one owner; this
/// only holds handles and the facts about the process.
pub struct DaemonState {
    config: Config,
    config_path: PathBuf,
    cards: Arc<CardManager>,
    slots: Mutex<Vec<SlotView>>,
    started: SystemTime,
    inference_address: String,
    summary: Mutex<String>,
}

impl DaemonState {
    /// The config in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The card table.
    pub fn cards(&self) -> &Arc<CardManager> {
        &self.cards
    }

    /// The slots as they are now.
    pub fn slots(&self) -> Vec<SlotView> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A receiver that changes whenever anything in status changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.cards.subscribe()
    }

    /// The one-line summary, also sent to systemd as STATUS=.
    pub fn summary(&self) -> String {
        let cards = self.cards.snapshot();
        let count = |s: CardState| cards.iter().filter(|c| c.state == s).count();
        let mut parts = vec![format!("{} card(s)", cards.len())];
        for (state, word) in [
            (CardState::Ready, "ready"),
            (CardState::Idle, "idle"),
            (CardState::Unmanaged, "unmanaged"),
            (CardState::HeldElsewhere, "held elsewhere"),
            (CardState::Resetting, "resetting"),
            (CardState::Probing, "probing"),
            (CardState::Failed, "failed"),
            (CardState::Quarantined, "quarantined"),
            (CardState::Missing, "missing"),
        ] {
            let n = count(state);
            if n > 0 {
                parts.push(format!("{n} {word}"));
            }
        }
        let slots = self.slots();
        format!("{}; {} slot(s) configured", parts.join(", "), slots.len())
    }

    /// The full status message.
    pub fn status(&self) -> pb::StatusResponse {
        let summary = self.summary();
        *self.summary.lock().unwrap_or_else(|e| e.into_inner()) = summary.clone();
        pb::StatusResponse {
            daemon: Some(pb::DaemonInfo {
                version: env!("CARGO_PKG_VERSION").to_string(),
                pid: std::process::id(),
                started_unix_ms: crate::cards::unix_ms(self.started),
                config_path: self.config_path.display().to_string(),
                summary,
                driver_version: self.cards.hardware().driver_version().unwrap_or_default(),
                inference_address: self.inference_address.clone(),
            }),
            cards: self
                .cards
                .snapshot()
                .iter()
                .map(api::convert::card)
                .collect(),
            slots: self.slots().iter().map(api::convert::slot).collect(),
        }
    }
}

const CLEAN_SHUTDOWN: &str = "clean-shutdown";

/// Run the daemon until SIGTERM or SIGINT.
pub async fn run(config: Config, config_path: &Path) -> anyhow::Result<()> {
    let started = SystemTime::now();
    notify::status("starting: discovering cards");
    for (key, dir) in [
        ("daemon.state_dir", &config.daemon.state_dir),
        ("daemon.lock_dir", &config.daemon.lock_dir),
    ] {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create {key} {}", dir.display()))?;
    }
    let hw = crate::cards::discovery::HardwareRoot::from(&config.hardware);
    if !hw.driver_loaded() {
        tracing::warn!(
            sys_root = %config.hardware.sys_root.display(),
            "the tenstorrent kernel driver is not loaded (no module/tenstorrent in sys_root); no cards can be found. On NixOS set hardware.tenstorrent.enable = true"
        );
    }
    let cards = CardManager::new(&config).with_context(|| {
        format!(
            "cannot read cards under {}",
            config.hardware.sys_root.display()
        )
    })?;
    // A crash leaves no record, so the next start knows the cards may be
    // wedged (an engine killed mid-run leaves them failing to initialise).
    let clean_record = config.daemon.state_dir.join(CLEAN_SHUTDOWN);
    let previous_was_clean = clean_record.exists();
    if previous_was_clean {
        std::fs::remove_file(&clean_record)
            .with_context(|| format!("cannot remove {}", clean_record.display()))?;
    }

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
    let public_listener = TcpListener::bind(&config.daemon.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (daemon.listen); is another server using the port?",
                config.daemon.listen
            )
        })?;
    let inference_address = public_listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| config.daemon.listen.clone());

    let state = Arc::new(DaemonState {
        slots: Mutex::new(slots::configured(&config, &cards, started)),
        config,
        config_path: config_path.to_path_buf(),
        cards,
        started,
        inference_address: inference_address.clone(),
        summary: Mutex::new(String::new()),
    });

    let (trigger, shutdown) = shutdown::channel();
    let (reporter, health) = tonic_health::server::health_reporter();
    api::init_health(&reporter, &state).await;
    let control_task = tokio::spawn(api::serve_control(
        control_listener,
        state.clone(),
        health.clone(),
        shutdown.clone(),
    ));
    let public_task = tokio::spawn(api::serve_public(
        public_listener,
        state.clone(),
        health,
        shutdown.clone(),
    ));
    tracing::info!(
        control_socket = %state.config.daemon.control_socket.display(),
        inference = %inference_address,
        "listening"
    );

    let signals = tokio::spawn(wait_for_signal(trigger.clone()));
    let starting = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let ticker = tokio::spawn(tick_loop(state.clone(), starting.clone(), shutdown.clone()));

    startup_resets(&state, previous_was_clean, &shutdown).await;
    starting.store(false, std::sync::atomic::Ordering::Relaxed);
    let summary = state.summary();
    notify::ready(&summary);
    tracing::info!(%summary, "ready");

    shutdown.clone().wait().await;
    notify::stopping("stopping: closing sockets and releasing card locks");
    tracing::info!("shutting down");
    for task in [control_task, public_task] {
        match task.await {
            Ok(Err(e)) => tracing::error!(error = %e, "server ended with an error"),
            Err(e) => tracing::error!(error = %e, "server task failed"),
            Ok(Ok(())) => {}
        }
    }
    signals.abort();
    ticker.abort();
    state.cards.release_all();
    let _ = std::fs::remove_file(&state.config.daemon.control_socket);
    std::fs::write(
        &clean_record,
        format!("{}\n", crate::cards::unix_ms(SystemTime::now())),
    )
    .with_context(|| {
        format!(
            "cannot record the clean shutdown in {}",
            clean_record.display()
        )
    })?;
    tracing::info!("stopped cleanly");
    Ok(())
}

async fn wait_for_signal(trigger: shutdown::ShutdownTrigger) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop the daemon with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    trigger.trigger();
}

/// Reset managed cards at startup as the policy says. Groups (a slot's cards)
/// reset concurrently; a TP=2 slot's cards share one tt-smi call.
async fn startup_resets(state: &Arc<DaemonState>, previous_was_clean: bool, shutdown: &Shutdown) {
    let policy = state.config.reset.policy;
    let reset = match policy {
        ResetPolicy::Always => true,
        ResetPolicy::IfUnclean => !previous_was_clean,
        ResetPolicy::Never => false,
    };
    if !reset {
        tracing::info!(?policy, previous_was_clean, "no startup reset");
        return;
    }
    tracing::info!(
        ?policy,
        previous_was_clean,
        "resetting managed cards before use"
    );
    let groups = state.cards.reset_groups();
    notify::status(&format!(
        "starting: resetting {} card group(s)",
        groups.len()
    ));
    let mut tasks = tokio::task::JoinSet::new();
    for group in groups {
        let cards = state.cards.clone();
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
    let tick = Duration::from_millis(state.config.daemon.tick_ms);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_summary = String::new();
    while !shutdown.is_triggered() {
        interval.tick().await;
        let cards = state.cards.clone();
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
