//! The runtime that carries inference: the doors' connections (OpenAI and
//! gRPC), the router's streams, and the gRPC connections to the workers.
//!
//! It is apart from the runtime of everything else (slot supervision,
//! resets, cache builds, reloads, loans, the control socket, metrics), so
//! control work that holds a thread (a walk of a cache variant, a slot's
//! cgroup that takes its time to empty) never holds a token back; and it is
//! small (`daemon.relay_threads`, default 1), so a relayed token's wake-ups
//! stay on one thread instead of being handed between runtime threads
//! (docs/PERFORMANCE.md, "CPU per relayed token").

use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

static RELAY: OnceLock<Handle> = OnceLock::new();

/// Makes `handle` the relay runtime; once, at start (a second call is
/// ignored).
pub fn install(handle: Handle) {
    let _ = RELAY.set(handle);
}

/// The relay runtime: the installed one, else the caller's own
/// (`daemon.relay_threads = 0`, or a daemon run inside a test's runtime).
pub fn handle() -> Handle {
    RELAY.get().cloned().unwrap_or_else(Handle::current)
}

/// Spawns `future` on the relay runtime: the tasks it spawns live there
/// too (tokio spawns into the runtime a task runs on).
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    handle().spawn(future)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_relay_runtime_the_callers_own_runs_the_work() {
        // No install in unit tests: the test's runtime is the relay.
        let ours = Handle::current().id();
        let theirs = spawn(async { Handle::current().id() }).await.expect("ran");
        assert_eq!(ours, theirs);
    }
}
