//! The threads the kernels split a matmul over.
//!
//! candle's barrier pool waits by spinning without ever yielding, so on a
//! machine whose cores are shared with other work (a build, the daemon, the
//! RPC threads) a descheduled helper leaves the caller spinning for a whole
//! scheduler slice, ~120 times per token. This pool has the caller take
//! units of work from the same counter as the helpers, so a late or
//! descheduled helper only delays the units it has already taken, and every
//! wait spins briefly, then yields, and an idle helper parks.
//!
//! Threads: `CANDLE_NUM_THREADS` when set (the worker sets it to one per
//! rank at TP > 1, so each rank computes alone on its own thread), else the
//! cores available; the caller counts as one of them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Spins before a waiting thread starts yielding.
const SPINS: u32 = 2_000;
/// How long an idle helper keeps yielding before it parks.
const IDLE_BEFORE_PARK: Duration = Duration::from_millis(5);

/// The closure of one parallel call, shared with the helpers.
struct Job {
    /// `&dyn Fn(Range)` of the caller, valid until `done == n_items`.
    f: *const (dyn Fn(std::ops::Range<usize>) + Sync),
    n_items: usize,
    chunk: usize,
    cursor: AtomicUsize,
    done: AtomicUsize,
}

// SAFETY: `f` is only called for units taken from `cursor` before the caller
// has seen all units done, i.e. while the closure is alive; it is Sync.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    /// Takes and runs units until none are left.
    fn work(&self) {
        loop {
            let start = self.cursor.fetch_add(self.chunk, Ordering::AcqRel);
            if start >= self.n_items {
                return;
            }
            let end = self.n_items.min(start + self.chunk);
            // SAFETY: a unit was taken, so the caller is still waiting for
            // it and the closure is alive (see `Job`).
            unsafe { (*self.f)(start..end) };
            self.done.fetch_add(end - start, Ordering::AcqRel);
        }
    }
}

struct Shared {
    generation: AtomicUsize,
    job: Mutex<Option<Arc<Job>>>,
    stop: AtomicBool,
}

/// A set of helper threads.
pub struct Pool {
    shared: Arc<Shared>,
    helpers: Vec<std::thread::Thread>,
    /// Serialises callers (ranks sharing the pool).
    call: Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// A pool of `threads` threads in all, the caller included.
    pub fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            job: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let mut helpers = Vec::new();
        for i in 1..threads.max(1) {
            let s = shared.clone();
            match std::thread::Builder::new()
                .name(format!("tt-matmul-{i}"))
                .spawn(move || helper(&s))
            {
                Ok(h) => helpers.push(h.thread().clone()),
                // Fewer helpers only means less parallelism.
                Err(e) => tracing::warn!("cannot start matmul helper thread {i}: {e}"),
            }
        }
        Self {
            shared,
            helpers,
            call: Mutex::new(()),
        }
    }

    /// Threads working on a call, the caller included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Runs `f` over `0..n_items` in ranges, on the caller and the helpers;
    /// returns when every item is done.
    pub fn run(&self, n_items: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        if n_items == 0 {
            return;
        }
        if self.helpers.is_empty() {
            f(0..n_items);
            return;
        }
        let _call = lock(&self.call);
        // ~4 grabs per thread: a straggler holds up little.
        let chunk = n_items.div_ceil(self.threads() * 4).max(1);
        // SAFETY (lifetime erasure): the helpers call `f` only for units
        // taken before `done` reaches `n_items`, and we return only after.
        let f: *const (dyn Fn(std::ops::Range<usize>) + Sync + '_) = f;
        let f: *const (dyn Fn(std::ops::Range<usize>) + Sync) = unsafe { std::mem::transmute(f) };
        let job = Arc::new(Job {
            f,
            n_items,
            chunk,
            cursor: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
        });
        *lock(&self.shared.job) = Some(job.clone());
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        for h in &self.helpers {
            h.unpark();
        }
        job.work();
        let mut spins = 0u32;
        while job.done.load(Ordering::Acquire) < n_items {
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl Pool {
    /// Runs `f(i, piece)` for every `chunk`-sized piece `i` of `data` (the
    /// last may be shorter), on the caller and the helpers.
    pub fn for_each_chunk_mut<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let chunk = chunk.max(1);
        let len = data.len();
        let base = SharedMut(data.as_mut_ptr());
        let base = &base;
        self.run(len.div_ceil(chunk), &|pieces| {
            for i in pieces {
                let start = i * chunk;
                let end = (start + chunk).min(len);
                // SAFETY: `run` hands every index out once, so the pieces
                // are disjoint, and `data` is borrowed until it returns.
                let piece =
                    unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
                f(i, piece);
            }
        });
    }
}

/// A slice's base pointer shared by the threads of one call, each of which
/// takes disjoint pieces.
struct SharedMut<T>(*mut T);
// SAFETY: only disjoint pieces are made from it (see `for_each_chunk_mut`),
// and the elements may move between threads.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for h in &self.helpers {
            h.unpark();
        }
    }
}

fn helper(s: &Shared) {
    let mut seen = s.generation.load(Ordering::Acquire);
    let mut spins = 0u32;
    let mut idle_since = Instant::now();
    loop {
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let g = s.generation.load(Ordering::Acquire);
        if g != seen {
            seen = g;
            let job = lock(&s.job).clone();
            if let Some(job) = job {
                job.work();
            }
            spins = 0;
            idle_since = Instant::now();
            continue;
        }
        if spins < SPINS {
            spins += 1;
            std::hint::spin_loop();
        } else if idle_since.elapsed() < IDLE_BEFORE_PARK {
            std::thread::yield_now();
        } else {
            // unpark() before park() makes park return at once, so a call
            // published between the check above and here is not missed.
            std::thread::park_timeout(Duration::from_millis(100));
        }
    }
}

/// The process-wide pool.
pub fn global() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::env::var("CANDLE_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
        Pool::new(threads)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_runs_exactly_once_across_many_calls() {
        let pool = Pool::new(3);
        assert_eq!(pool.threads(), 3);
        for n in [0usize, 1, 7, 1000] {
            for _ in 0..50 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, &|r| {
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn every_piece_is_handed_out_once_with_its_index() {
        let pool = Pool::new(3);
        for (len, chunk) in [(0usize, 4usize), (1, 4), (10, 3), (1000, 7), (12, 12)] {
            let mut data = vec![usize::MAX; len];
            pool.for_each_chunk_mut(&mut data, chunk, &|i, piece| {
                assert!(piece.len() <= chunk);
                for (j, v) in piece.iter_mut().enumerate() {
                    assert_eq!(*v, usize::MAX, "written twice");
                    *v = i * chunk + j;
                }
            });
            assert_eq!(
                data,
                (0..len).collect::<Vec<_>>(),
                "len {len} chunk {chunk}"
            );
        }
    }

    #[test]
    fn parked_helpers_wake_for_the_next_call() {
        let pool = Pool::new(2);
        std::thread::sleep(IDLE_BEFORE_PARK * 3);
        let sum = AtomicUsize::new(0);
        pool.run(100, &|r| {
            sum.fetch_add(r.len(), Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 100);
    }
}
