//! tt-worker
