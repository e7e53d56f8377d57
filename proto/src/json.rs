//! How the Control messages read as JSON, for `ttctl status --json`,
//! `ttctl reload --json` and the variants of `ttctl cache ls --json`.
//!
//! The JSON is a contract scripts parse, and it is the messages themselves:
//! `build.rs` derives `serde::Serialize` on them, so a field added to
//! control.proto cannot be forgotten in a hand-kept copy. Field names are
//! the proto's. Three rules make it read as it always has:
//!
//! - An enum is a word, the one ttctl's tables print ([`Word`]): `ready`,
//!   `held-elsewhere`, `dry-run`, and `unknown` for a value this build does
//!   not know.
//! - A card's `telemetry` and the status's `daemon` are always objects (of
//!   nulls and zeroes when the daemon sent none), so scripts can index into
//!   them without checking.
//! - Fields added to the messages after the JSON was fixed (`lock_dir`,
//!   `starts`, `queues`, `accuracy`) are left out: putting them in is a change of the
//!   contract, to be made on purpose and pinned by ttctl's JSON test.

use serde::{Serialize, Serializer};

use crate::v1::{CardState, FinishReason, ReloadOutcome, SlotState};

/// A protocol enum that ttctl shows as a word, in its tables and its JSON
/// alike.
pub trait Word: TryFrom<i32> {
    /// What every value's proto name starts with (`CARD_STATE_`).
    const PREFIX: &'static str;

    /// The value's proto name (`CARD_STATE_HELD_ELSEWHERE`).
    fn proto_name(&self) -> &'static str;

    /// The word for a value as it came over the wire: its proto name
    /// without the prefix, in lower case with `-` for `_`
    /// (`held-elsewhere`); `unknown` for the unspecified value and for
    /// values from a newer daemon that this build does not know.
    fn word(value: i32) -> String {
        let name = Self::try_from(value).map(|known| known.proto_name());
        match name.map(|name| name.strip_prefix(Self::PREFIX)) {
            Ok(Some(rest)) if rest != "UNSPECIFIED" => rest.to_ascii_lowercase().replace('_', "-"),
            _ => "unknown".to_string(),
        }
    }
}

macro_rules! words {
    ($($enum:ident: $prefix:literal),* $(,)?) => {$(
        impl Word for $enum {
            const PREFIX: &'static str = $prefix;
            fn proto_name(&self) -> &'static str {
                self.as_str_name()
            }
        }
    )*};
}

words! {
    CardState: "CARD_STATE_",
    SlotState: "SLOT_STATE_",
    ReloadOutcome: "RELOAD_OUTCOME_",
    FinishReason: "FINISH_REASON_",
}

/// An enum field (an `i32` in prost) as its [`Word`].
pub(crate) fn word<E: Word, S: Serializer>(value: &i32, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&E::word(*value))
}

/// An optional sub-message as itself, or as its defaults when absent.
pub(crate) fn or_default<T: Serialize + Default, S: Serializer>(
    value: &Option<T>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => value.serialize(serializer),
        None => T::default().serialize(serializer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<E: Word>(values: std::ops::RangeInclusive<i32>) -> Vec<String> {
        values.map(E::word).collect()
    }

    #[test]
    fn every_state_has_the_word_ttctl_always_printed() {
        assert_eq!(
            words::<CardState>(0..=10),
            [
                "unknown",
                "ready",
                "idle",
                "held-elsewhere",
                "resetting",
                "probing",
                "quarantined",
                "missing",
                "failed",
                "unmanaged",
                "unknown",
            ]
        );
        assert_eq!(
            words::<SlotState>(0..=13),
            [
                "unknown",
                "pending",
                "locking",
                "resetting",
                "probing",
                "starting",
                "loading",
                "verifying",
                "ready",
                "draining",
                "stopped",
                "failed",
                "quarantined",
                "unknown",
            ]
        );
        assert_eq!(
            words::<ReloadOutcome>(0..=5),
            [
                "unknown",
                "applied",
                "refused",
                "unchanged",
                "dry-run",
                "unknown"
            ]
        );
        assert_eq!(
            words::<FinishReason>(0..=5),
            [
                "unknown",
                "stop",
                "length",
                "cancelled",
                "tool-calls",
                "unknown"
            ]
        );
    }

    #[test]
    fn values_from_a_newer_daemon_are_unknown_not_a_panic() {
        assert_eq!(CardState::word(-1), "unknown");
        assert_eq!(SlotState::word(i32::MAX), "unknown");
    }
}
