//! A model's queue (#45): who goes next when the model's slots are
//! saturated.
//!
//! Order: the lowest `priority` first (vLLM's meaning: lower is sooner);
//! within one priority, the API keys take turns (round-robin), so one key's
//! burst cannot starve another key's single request; within one key, first
//! come, first served. Only the request at the head may take a slot (a
//! request that cannot take one means none can: they all want the same
//! model's slots), so the order is the order of service.
//!
//! The queue also bounds how many wait (`models.<m>.max_queue`): a request
//! past it is refused at once. A [`Ticket`] is a request's place; dropping
//! it (routed, refused, cancelled) leaves the queue and wakes the others,
//! since the head may have changed.

use crate::usage::KeyName;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// One model's queue.
#[derive(Debug)]
pub struct Queue {
    /// The waiting requests, in order.
    state: Mutex<State>,
    /// Woken whenever a request leaves (the head may have changed).
    pub moved: Notify,
    /// How long a request of the model held its place lately, in µs (an
    /// exponential average; 0: none has ended yet): what the expected wait
    /// of a newcomer is reckoned from.
    hold_us: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// `max_queue`: how many may wait.
    capacity: u32,
    /// How many wait.
    len: u32,
    /// The next ticket's number.
    next: u64,
    /// The waiting requests by priority, lowest (served first) first.
    levels: BTreeMap<i32, Level>,
}

/// The requests of one priority.
#[derive(Debug, Default)]
struct Level {
    /// The keys with requests waiting, in turn order: the front key's
    /// first request is this priority's next.
    turns: VecDeque<KeyName>,
    /// Each key's requests, oldest first.
    waiting: BTreeMap<KeyName, VecDeque<u64>>,
}

/// The queue is full: `max_queue` requests wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    /// The `max_queue` in force.
    pub capacity: u32,
}

impl Queue {
    /// An empty queue of `capacity` places.
    pub fn new(capacity: u32) -> Arc<Queue> {
        Arc::new(Queue {
            state: Mutex::new(State {
                capacity,
                ..State::default()
            }),
            moved: Notify::new(),
            hold_us: AtomicU64::new(0),
        })
    }

    /// A request held its place this long.
    pub fn held(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        // Weight 1/4 to the newest: a few requests move it, one odd one
        // does not.
        let _ = self
            .hold_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 { us } else { old - old / 4 + us / 4 })
            });
    }

    /// How long a request holds its place, lately; None before any ended.
    pub fn hold(&self) -> Option<Duration> {
        match self.hold_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// How many wait that a request at `priority` would wait behind (those
    /// of its priority or more urgent; within a priority keys take turns,
    /// so this can be more than are served first, never fewer).
    pub fn ahead_of(&self, priority: i32) -> u32 {
        self.state()
            .levels
            .range(..=priority)
            .map(|(_, level)| level.waiting.values().map(VecDeque::len).sum::<usize>())
            .sum::<usize>()
            .try_into()
            .unwrap_or(u32::MAX)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Change how many may wait (a reload): those waiting keep their places,
    /// even past a smaller capacity; new ones wait for room.
    pub fn set_capacity(&self, capacity: u32) {
        self.state().capacity = capacity;
    }

    /// Take a place at `priority` for `key`, or [`Full`].
    pub fn enter(self: &Arc<Self>, priority: i32, key: &KeyName) -> Result<Ticket, Full> {
        let mut state = self.state();
        if state.len >= state.capacity {
            return Err(Full {
                capacity: state.capacity,
            });
        }
        let id = state.next;
        state.next += 1;
        state.len += 1;
        let level = state.levels.entry(priority).or_default();
        let mine = level.waiting.entry(key.clone()).or_default();
        if mine.is_empty() {
            level.turns.push_back(key.clone());
        }
        mine.push_back(id);
        Ok(Ticket {
            queue: self.clone(),
            priority,
            key: key.clone(),
            id,
        })
    }

    /// How many wait, by priority (lowest first).
    pub fn waiting(&self) -> Vec<(i32, u32)> {
        self.state()
            .levels
            .iter()
            .map(|(p, level)| {
                let n: usize = level.waiting.values().map(VecDeque::len).sum();
                (*p, u32::try_from(n).unwrap_or(u32::MAX))
            })
            .collect()
    }

    /// How many wait.
    pub fn len(&self) -> u32 {
        self.state().len
    }

    /// The ticket number served next.
    fn head(&self) -> Option<u64> {
        let state = self.state();
        let level = state.levels.values().next()?;
        let key = level.turns.front()?;
        level.waiting.get(key)?.front().copied()
    }

    fn leave(&self, priority: i32, key: &KeyName, id: u64) {
        let mut state = self.state();
        let Some(level) = state.levels.get_mut(&priority) else {
            return;
        };
        let Some(mine) = level.waiting.get_mut(key) else {
            return;
        };
        let Some(at) = mine.iter().position(|t| *t == id) else {
            return;
        };
        mine.remove(at);
        let emptied = mine.is_empty();
        // The key whose turn it was had its turn: behind the others now.
        if level.turns.front() == Some(key) {
            level.turns.pop_front();
            if !emptied {
                level.turns.push_back(key.clone());
            }
        } else if emptied {
            level.turns.retain(|k| k != key);
        }
        if emptied {
            level.waiting.remove(key);
        }
        if level.waiting.is_empty() {
            state.levels.remove(&priority);
        }
        state.len = state.len.saturating_sub(1);
    }
}

/// A request's place in its model's queue; dropped, it leaves.
#[derive(Debug)]
pub struct Ticket {
    queue: Arc<Queue>,
    priority: i32,
    key: KeyName,
    id: u64,
}

impl Ticket {
    /// Whether this request is the one served next.
    pub fn is_next(&self) -> bool {
        self.queue.head() == Some(self.id)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.queue.leave(self.priority, &self.key, self.id);
        self.queue.moved.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> KeyName {
        KeyName::new(name).unwrap()
    }

    /// Serve the queue to the end: the order the tickets are served in,
    /// by their labels.
    fn served(queue: &Arc<Queue>, mut tickets: Vec<(&'static str, Ticket)>) -> Vec<&'static str> {
        let mut order = Vec::new();
        while !tickets.is_empty() {
            let at = tickets
                .iter()
                .position(|(_, t)| t.is_next())
                .expect("one ticket is next");
            let (label, ticket) = tickets.remove(at);
            assert_eq!(
                tickets.iter().filter(|(_, t)| t.is_next()).count(),
                0,
                "only one is next"
            );
            drop(ticket);
            order.push(label);
        }
        assert_eq!(queue.len(), 0);
        order
    }

    #[test]
    fn a_more_urgent_request_is_served_before_a_waiting_burst() {
        let q = Queue::new(16);
        let (a, b) = (key("a"), key("b"));
        let tickets = vec![
            ("a1", q.enter(0, &a).unwrap()),
            ("a2", q.enter(0, &a).unwrap()),
            ("a3", q.enter(0, &a).unwrap()),
            ("b-urgent", q.enter(-5, &b).unwrap()),
            ("a-lax", q.enter(3, &a).unwrap()),
        ];
        assert_eq!(q.waiting(), vec![(-5, 1), (0, 3), (3, 1)]);
        assert_eq!(served(&q, tickets), ["b-urgent", "a1", "a2", "a3", "a-lax"]);
    }

    #[test]
    fn keys_at_one_priority_take_turns_and_each_key_is_first_come_first_served() {
        let q = Queue::new(16);
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let tickets = vec![
            ("a1", q.enter(0, &a).unwrap()),
            ("a2", q.enter(0, &a).unwrap()),
            ("a3", q.enter(0, &a).unwrap()),
            ("a4", q.enter(0, &a).unwrap()),
            ("b1", q.enter(0, &b).unwrap()),
            ("b2", q.enter(0, &b).unwrap()),
            ("c1", q.enter(0, &c).unwrap()),
        ];
        assert_eq!(
            served(&q, tickets),
            ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]
        );
    }

    #[test]
    fn a_request_that_leaves_early_keeps_the_turns_of_the_others() {
        let q = Queue::new(16);
        let (a, b) = (key("a"), key("b"));
        let a1 = q.enter(0, &a).unwrap();
        let a2 = q.enter(0, &a).unwrap();
        let b1 = q.enter(0, &b).unwrap();
        // b's only request is cancelled before its turn: b leaves the turns.
        drop(b1);
        assert!(a1.is_next());
        let b2 = q.enter(0, &b).unwrap();
        drop(a1);
        assert!(b2.is_next(), "b's turn after a's first");
        drop(b2);
        assert!(a2.is_next());
    }

    #[test]
    fn a_full_queue_refuses_and_names_its_capacity_until_one_leaves() {
        let q = Queue::new(2);
        let a = key("a");
        let first = q.enter(0, &a).unwrap();
        let _second = q.enter(9, &a).unwrap();
        assert_eq!(q.enter(-9, &a).unwrap_err(), Full { capacity: 2 });
        drop(first);
        assert!(q.enter(-9, &a).is_ok());
        // A smaller capacity (a reload) keeps those waiting.
        q.set_capacity(1);
        assert_eq!(q.len(), 1);
        assert_eq!(q.enter(0, &a).unwrap_err(), Full { capacity: 1 });
    }
}
