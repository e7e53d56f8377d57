//! Tensor parallelism: one thread per rank and the all-reduce between them.
//!
//! Every rank holds the full residual stream. After the attention output and
//! MLP down projections each rank has a partial sum; [`AllReduce`] adds the
//! partials in rank order, so every rank ends with bit-identical values and
//! the ranks never drift apart.
//!
//! The ranks meet twice per block, sixty times per token for a 30-layer
//! model, so the barrier spins before it yields: parking a thread costs more
//! than the wait it would save when both ranks do equal work.

use crate::model::{sum_parts, Collective, ModelError, Rank, StepSeq};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Spins this many times before yielding the CPU in a barrier wait.
const SPINS_BEFORE_YIELD: u32 = 2_000;

/// A reusable barrier for `n` threads that can be poisoned when a rank fails,
/// so the others stop waiting instead of hanging.
struct SpinBarrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    poisoned: AtomicBool,
}

impl SpinBarrier {
    fn new(n: usize) -> Self {
        Self {
            n,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Waits for every thread; false if the barrier was poisoned.
    fn wait(&self) -> bool {
        let gen = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Release);
            self.generation.fetch_add(1, Ordering::AcqRel);
            return !self.poisoned.load(Ordering::Acquire);
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == gen {
            if self.poisoned.load(Ordering::Acquire) {
                return false;
            }
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        !self.poisoned.load(Ordering::Acquire)
    }
}

/// The shared state of one all-reduce group.
pub struct AllReduce {
    slots: Vec<Mutex<Vec<Vec<f32>>>>,
    barrier: SpinBarrier,
}

impl AllReduce {
    /// A group of `n` ranks.
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            barrier: SpinBarrier::new(n),
        })
    }

    /// Marks the group failed: waiting ranks return instead of hanging.
    fn poison(&self) {
        self.barrier.poisoned.store(true, Ordering::Release);
    }
}

/// One rank's end of an [`AllReduce`] group.
pub struct RankComm {
    rank: usize,
    group: Arc<AllReduce>,
}

impl RankComm {
    /// Rank `rank` of `group`.
    pub fn new(rank: usize, group: Arc<AllReduce>) -> Self {
        Self { rank, group }
    }
}

fn lock(m: &Mutex<Vec<Vec<f32>>>) -> std::sync::MutexGuard<'_, Vec<Vec<f32>>> {
    // A rank that panicked while holding its slot poisons the group anyway;
    // the data is only ever overwritten, so the guard is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Collective for RankComm {
    fn all_reduce(&self, parts: Vec<Vec<f32>>, len: usize) -> Vec<f32> {
        *lock(&self.group.slots[self.rank]) = parts;
        if !self.group.barrier.wait() {
            return vec![0.0; len];
        }
        // Sum in global part order on every rank: identical bits everywhere,
        // and the same bits as one rank summing all the parts.
        let guards: Vec<_> = self.group.slots.iter().map(lock).collect();
        let out = sum_parts(guards.iter().flat_map(|g| g.iter()), len);
        drop(guards);
        // Nobody may overwrite a slot before everyone has read it.
        self.group.barrier.wait();
        out
    }
}

type Job = Arc<Vec<StepSeq>>;
type Reply = (usize, Result<Vec<f32>, ModelError>);

/// The ranks of one model, driven one step at a time.
pub enum Ranks {
    /// TP=1: the rank runs on the caller's thread.
    Solo(Box<Rank>),
    /// TP>1: one thread per rank.
    Threads {
        /// Job queue of each rank.
        jobs: Vec<mpsc::Sender<Job>>,
        /// Results from all ranks.
        replies: mpsc::Receiver<Reply>,
        /// Vocabulary rows of each rank.
        vocab: Vec<Range<usize>>,
        /// The rank threads (they exit when `jobs` is dropped).
        threads: Vec<JoinHandle<()>>,
    },
}

impl Ranks {
    /// Starts the ranks; with more than one, each gets its own thread.
    pub fn start(mut ranks: Vec<Rank>) -> Result<Self, ModelError> {
        if ranks.len() == 1 {
            if let Some(r) = ranks.pop() {
                return Ok(Ranks::Solo(Box::new(r)));
            }
        }
        let group = AllReduce::new(ranks.len());
        let (reply_tx, replies) = mpsc::channel();
        let mut jobs = Vec::new();
        let mut threads = Vec::new();
        let vocab = ranks.iter().map(Rank::vocab).collect();
        for (i, mut rank) in ranks.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Job>();
            let reply_tx = reply_tx.clone();
            let comm = RankComm::new(i, group.clone());
            let handle = std::thread::Builder::new()
                .name(format!("tt-rank-{i}"))
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            rank.step(&job, &comm)
                        }))
                        .unwrap_or_else(|_| Err(ModelError::Compute(format!("rank {i} panicked"))));
                        if result.is_err() {
                            comm.group.poison();
                        }
                        if reply_tx.send((i, result)).is_err() {
                            return;
                        }
                    }
                })
                .map_err(|e| ModelError::Compute(format!("cannot start rank thread {i}: {e}")))?;
            jobs.push(tx);
            threads.push(handle);
        }
        Ok(Ranks::Threads {
            jobs,
            replies,
            vocab,
            threads,
        })
    }

    /// Runs one step on every rank. Returns the full-vocabulary logits of
    /// each sequence's [`StepSeq::logit_rows`] rows, in order.
    pub fn step(&mut self, seqs: Vec<StepSeq>) -> Result<Vec<Vec<f32>>, ModelError> {
        match self {
            Ranks::Solo(rank) => {
                let n = rank.vocab().len();
                let flat = rank.step(&seqs, &crate::model::Solo)?;
                Ok(flat.chunks_exact(n.max(1)).map(<[f32]>::to_vec).collect())
            }
            Ranks::Threads {
                jobs,
                replies,
                vocab,
                ..
            } => {
                let job = Arc::new(seqs);
                for tx in jobs.iter() {
                    tx.send(job.clone())
                        .map_err(|_| ModelError::Compute("a rank thread has exited".into()))?;
                }
                let mut parts: Vec<Option<Vec<f32>>> = vec![None; jobs.len()];
                let mut first_err = None;
                for _ in 0..jobs.len() {
                    let (i, r) = replies
                        .recv()
                        .map_err(|_| ModelError::Compute("a rank thread has exited".into()))?;
                    match r {
                        Ok(v) => parts[i] = Some(v),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                if let Some(e) = first_err {
                    return Err(e);
                }
                let n_out: usize = job.iter().map(StepSeq::logit_rows).sum();
                let total: usize = vocab.iter().map(|v| v.len()).sum();
                let mut out = vec![Vec::with_capacity(total); n_out];
                for (part, range) in parts.iter().zip(vocab.iter()) {
                    let part = part.as_deref().unwrap_or(&[]);
                    for (row, o) in out.iter_mut().enumerate() {
                        o.extend_from_slice(&part[row * range.len()..(row + 1) * range.len()]);
                    }
                }
                Ok(out)
            }
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        if let Ranks::Threads { jobs, threads, .. } = self {
            jobs.clear();
            for t in threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_sums_in_rank_order_on_every_rank() {
        let group = AllReduce::new(3);
        let handles: Vec<_> = (0..3)
            .map(|r| {
                let comm = RankComm::new(r, group.clone());
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for round in 0..50 {
                        let buf = vec![r as f32 + round as f32, 1.0, -(r as f32)];
                        out.push(comm.all_reduce(vec![buf], 3));
                    }
                    out
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for round in 0..50 {
            let expect = vec![3.0 + 3.0 * round as f32, 3.0, -3.0];
            for r in &results {
                assert_eq!(r[round], expect);
            }
        }
    }

    #[test]
    fn poisoned_group_releases_waiters() {
        let group = AllReduce::new(2);
        let comm = RankComm::new(0, group.clone());
        let waiter = std::thread::spawn(move || comm.all_reduce(vec![vec![1.0]], 1));
        std::thread::sleep(std::time::Duration::from_millis(20));
        group.poison();
        assert_eq!(waiter.join().unwrap(), vec![0.0]);
    }
}
