//! Fake hardware root.
