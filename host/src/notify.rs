//! Telling systemd what the daemon is doing (`Type=notify`).
//!
//! Startup is long and lumpy (resets, later cold cache builds), so besides
//! READY=1 the daemon keeps systemd informed: STATUS= with a one-line summary,
//! EXTEND_TIMEOUT_USEC= while long work runs, WATCHDOG=1 while healthy,
//! RELOADING=1 then READY=1 around a reload, and STOPPING=1 at shutdown.
//! Outside systemd (no NOTIFY_SOCKET) every call is a no-op.

use sd_notify::NotifyState;
use std::time::Duration;

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// READY=1 with a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// RELOADING=1 with the monotonic time (`systemctl status` shows the unit
/// reloading until the next READY=1; the reload's outcome reaches
/// `systemctl reload` through the unit's `ExecReload=ttctl reload`).
pub fn reloading(status: &str) {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now, NotifyState::Status(status)]),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the monotonic clock for RELOADING=1");
            send(&[NotifyState::Reloading, NotifyState::Status(status)]);
        }
    }
}

/// STATUS=<line>.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// WATCHDOG=1.
pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// EXTEND_TIMEOUT_USEC=: give the current phase (start or stop) this much
/// more time from now.
pub fn extend_timeout(by: Duration) {
    let usec = u32::try_from(by.as_micros()).unwrap_or(u32::MAX);
    send(&[NotifyState::ExtendTimeoutUsec(usec)]);
}

/// STOPPING=1 with a status line.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}
