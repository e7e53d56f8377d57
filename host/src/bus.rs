//! The status bus: one counter that moves whenever a card or a slot
//! changes. Owners of state (`CardManager`, `SlotManager`) bump it after
//! each change; readers (`WatchStatus`, gRPC health, the startup wait, a
//! supervisor waiting for its cards) re-read the tables when it moves. It
//! lives below both owners so that neither has to carry the other's news.

use std::sync::Arc;
use tokio::sync::watch;

/// A cheap handle to the bus; clones share it.
#[derive(Clone)]
pub struct StatusBus {
    tx: Arc<watch::Sender<u64>>,
}

impl Default for StatusBus {
    fn default() -> Self {
        StatusBus {
            tx: Arc::new(watch::channel(0).0),
        }
    }
}

impl StatusBus {
    /// A new bus.
    pub fn new() -> StatusBus {
        StatusBus::default()
    }

    /// Something changed: wake every subscriber.
    pub fn notify(&self) {
        self.tx.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A receiver that changes whenever anything is notified. Changes
    /// coalesce: a reader sees the latest state, not every step.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}
