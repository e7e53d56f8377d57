//! Wall-clock timestamps: the protocols' unit (`tt_serving_proto::time`).

pub use tt_serving_proto::time::{now_unix_ms, unix_ms};
