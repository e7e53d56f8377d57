//! Why a request to the slot manager was refused, as callers branch on it;
//! the API maps each to its status once (`api::status`).

/// A refused slot request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// No slot of that name.
    #[error("no slot `{name}`; slots: {known}")]
    NoSuchSlot {
        /// The name asked for (echoed safely).
        name: String,
        /// The slots there are, comma-separated.
        known: String,
    },
    /// The slot exists but its supervisor has ended (the daemon is
    /// stopping, or a reload is replacing it): retry once it is back.
    #[error("slot {0}'s supervisor has ended (the daemon is stopping or a reload is replacing the slot); try again once `ttctl status` shows it")]
    SupervisorEnded(String),
    /// A card a hand reset named is under a slot's live worker.
    #[error("card {bdf} is in use by slot {slot} ({state}); the slot resets its own cards when its worker fails. To reset by hand, wait for the slot to fail or stop it first")]
    CardInUse {
        /// The card.
        bdf: String,
        /// The slot holding it.
        slot: String,
        /// The slot's state.
        state: String,
    },
}
