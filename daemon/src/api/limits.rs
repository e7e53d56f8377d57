//! Generate streams per client connection (`limits.max_streams_per_connection`).
//!
//! HTTP/2 lets one connection carry many streams; without a cap one client
//! could fill every model's queue over a single connection. HTTP/2's own
//! `SETTINGS_MAX_CONCURRENT_STREAMS` would make the client wait silently
//! instead, so the daemon counts Generate streams per connection itself and
//! answers RESOURCE_EXHAUSTED, which the client sees at once. The prompt
//! and `max_tokens` limits are request fields and are checked by the
//! router's validation.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tonic::{Request, Status};

/// One connection's open Generate streams; attached to the connection at
/// accept time and shared by its requests.
#[derive(Debug, Clone, Default)]
pub struct StreamCount(Arc<AtomicU32>);

/// Holds one stream's place until dropped (when the response stream ends or
/// the client goes away).
#[derive(Debug)]
pub struct StreamPlace(Arc<AtomicU32>);

impl Drop for StreamPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StreamCount {
    /// Take a place for one more stream, or refuse when `max` are open.
    pub fn admit(&self, max: u32) -> Result<StreamPlace, Status> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| StreamPlace(self.0.clone()))
            .map_err(|open| {
                Status::resource_exhausted(format!(
                    "this connection already has {open} Generate streams open, the daemon's limit (limits.max_streams_per_connection = {max}); wait for one to finish or open another connection"
                ))
            })
    }

    /// Streams open now.
    #[cfg(test)]
    fn open(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }
}

/// Take a stream place on the connection `request` arrived on. A request
/// without a counter (not from an accepted TCP connection) is not limited.
pub fn admit<T>(request: &Request<T>, max: u32) -> Result<Option<StreamPlace>, Status> {
    request
        .extensions()
        .get::<StreamCount>()
        .map(|count| count.admit(max))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_refused_beyond_the_limit_and_freed_on_drop() {
        let count = StreamCount::default();
        let a = count.admit(2).unwrap();
        let _b = count.admit(2).unwrap();
        let err = count.admit(2).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message()
                .contains("limits.max_streams_per_connection = 2"),
            "{}",
            err.message()
        );
        drop(a);
        assert_eq!(count.open(), 1);
        assert!(count.admit(2).is_ok());
    }

    #[test]
    fn connections_count_separately() {
        let one = StreamCount::default();
        let two = StreamCount::default();
        let _a = one.admit(1).unwrap();
        assert!(one.admit(1).is_err());
        assert!(two.admit(1).is_ok());
    }
}
