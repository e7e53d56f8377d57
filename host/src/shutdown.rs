//! One shutdown signal handed to every task, instead of flags sprinkled
//! through the code.

use tokio::sync::watch;

/// The sending half: `trigger` starts a graceful shutdown.
#[derive(Debug, Clone)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// The receiving half; cheap to clone.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// A connected trigger and receiver.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(tx), Shutdown(rx))
}

impl ShutdownTrigger {
    /// Ask every holder of a [`Shutdown`] to stop.
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// Whether shutdown has begun.
    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once shutdown begins (at once if it already has).
    pub async fn wait(mut self) {
        // An error means the trigger is gone, which also means shut down.
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}
