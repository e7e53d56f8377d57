//! A key's cap on requests admitted at once (`max_in_flight=<N>` on its
//! line of the tokens file), so one key cannot take every place of a
//! model: a request over it is refused at once, naming the key and the
//! cap, never queued behind the key's own.

use super::RouteError;
use crate::usage::{InFlightCap, KeyName};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One admitted request's place among its key's; freed when dropped (the
/// request ended, or its engine finished it into the client's buffer).
#[derive(Debug)]
pub struct KeyPlace(Arc<InFlightCap>);

impl Drop for KeyPlace {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A place for one more request of `key`: None for a key without a cap,
/// or the refusal when it has as many as its cap.
pub fn take(key: &KeyName) -> Result<Option<KeyPlace>, RouteError> {
    let Some(cap) = key.cap() else {
        return Ok(None);
    };
    let admitted = cap
        .now
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cap.max).then_some(n + 1)
        });
    match admitted {
        Ok(_) => Ok(Some(KeyPlace(cap.clone()))),
        Err(n) => Err(RouteError::KeyLimit(format!(
            "key `{key}` has {n} requests in flight, its cap (max_in_flight={} in the daemon's inference.tokens_file); wait for one to finish, or ask the operator to raise the key's max_in_flight",
            cap.max
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn a_key_takes_up_to_its_cap_and_a_freed_place_is_taken_again() {
        let cap = Arc::new(InFlightCap {
            max: 2,
            now: AtomicU32::new(0),
        });
        let key = KeyName::new("batch").unwrap().with_cap(Some(cap.clone()));
        let a = take(&key).unwrap();
        let _b = take(&key.clone()).unwrap();
        let refused = take(&key).unwrap_err();
        assert_eq!(refused.outcome(), super::super::Outcome::KeyLimit);
        assert!(refused.message().contains("key `batch`"), "{refused}");
        assert!(refused.message().contains("max_in_flight=2"), "{refused}");
        drop(a);
        assert!(take(&key).unwrap().is_some());
        assert!(take(&KeyName::new("free").unwrap()).unwrap().is_none());
    }
}
