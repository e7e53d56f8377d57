//! The one error type of the library.
//!
//! Callers (the integration harness, the `tt-fakehw` binary) mostly print
//! these, but a few branch on the cause — "is this root not a fake root at
//! all?" versus "that card is mid-reset" — so the causes are variants rather
//! than strings. Every message names the path or card and the way out.

use std::io;
use std::path::PathBuf;

/// What went wrong while laying out, changing or reading a fake hardware root.
#[derive(Debug, thiserror::Error)]
pub enum FakeHwError {
    /// A filesystem operation failed on `path`.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we were doing, e.g. "writing" or "removing".
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// `create` was pointed at a directory that already holds files.
    #[error(
        "{0} is not empty; pick an empty or missing directory, or pass --force to replace \
         an existing fake root there"
    )]
    RootNotEmpty(PathBuf),

    /// `open` (or any command) was pointed at a directory that `create` did not lay out.
    #[error(
        "{0} is not a fake hardware root (no fakehw/cards.json); create one with \
         `tt-fakehw create --root {0} --cards N`"
    )]
    NotAFakeRoot(PathBuf),

    /// A state file of the fake exists but does not parse.
    #[error("{path} is corrupt ({source}); delete the root and create it again")]
    CorruptState {
        /// The state file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },

    /// No card of this root matches a BDF or index given by the caller.
    #[error("no card {0} in this fake root; `tt-fakehw status --root ROOT` lists the cards")]
    UnknownCard(String),

    /// The card exists but is gone right now (mid-reset, or a `never-returns` fault).
    #[error(
        "card {0} is not present right now (mid-reset, or it never came back); wait for \
         the firmware to bring it back (`tt-fakehw status --root ROOT` shows pending resets)"
    )]
    CardGone(String),

    /// A caller-supplied value is out of range.
    #[error("{0}")]
    Invalid(String),
}

impl FakeHwError {
    /// Wraps an [`io::Error`] with the action and path it concerns.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        FakeHwError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// True when the error is a missing file or directory — what readers see
    /// while a card is mid-reset or after the whole root was removed.
    pub fn is_not_found(&self) -> bool {
        matches!(self, FakeHwError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = FakeHwError> = std::result::Result<T, E>;
