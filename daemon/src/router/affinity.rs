//! Prefix affinity: with several Ready replicas of a model, send a request
//! to the replica most likely to hold its prompt's prefix in its engine's
//! KV cache, so that a chat's next turn, a shared system prompt or an agent
//! loop reuses what that replica already computed (issue #16: a cached
//! ~600-token prefix answers in ~22 ms where a cold prefill takes ~2.3 s).
//! Nothing here knows the engine: any engine with a prefix cache (tt-worker,
//! vLLM, llama-server) gains from it, and one without loses nothing.
//!
//! Three parts, each pure:
//!
//! - [`Key::of`]: what "the same prefix" means for a request. A chat is
//!   keyed by its leading messages (every message up to and including the
//!   first `user` one), which a conversation resends unchanged on every
//!   turn while its history grows behind them. A plain prompt is keyed by
//!   its first [`PROMPT_KEY_BYTES`] bytes.
//! - [`Ring`]: consistent hashing. Each replica owns [`POINTS_PER_SLOT`]
//!   points on a 64-bit ring, placed by hashing its slot name; a key
//!   belongs to the first replica clockwise from it. A replica that joins
//!   or leaves (a restart, a reload that adds one) takes or gives back only
//!   its own share of the keys; the others keep theirs, and so their
//!   caches.
//! - [`choose`]: consistent hashing with bounded loads (Mirrokni, Thorup and
//!   Zadimoghaddam, 2018). A replica is eligible only while its requests in
//!   flight are below `ceil((1 + ε) · average)` (the average counting this
//!   request; [`LOAD_EPSILON`] = 0.25) and below `max_in_flight`; the walk
//!   goes clockwise to the first eligible one. So a hot prefix (one system
//!   prompt behind every request) fills its home replica up to 25% above
//!   the average and then spills to the next one on the ring, never
//!   starving the others; and a conversation returns to its replica
//!   whenever that replica is not overloaded.

use crate::slots::Candidate;
use sha2::{Digest, Sha256};
use tt_serving_proto::v1 as pb;

/// Bytes of a plain prompt that make its key. About 500 tokens of English
/// text (~4 bytes a token): long enough to take in a typical system prompt
/// or template plus the start of what follows it, so that requests that
/// merely share a template still spread over the replicas by what they go
/// on to say; short enough that a prompt which grows turn by turn (a
/// transcript resent with each new exchange appended) keeps its key once
/// it is longer than this. A prompt shorter than this is keyed whole, so
/// a growing prompt changes key until it reaches this length: chat
/// requests, keyed by their leading messages, have no such gap.
pub const PROMPT_KEY_BYTES: usize = 2048;

/// How far above the average load a replica may go before requests for
/// its keys spill to the next replica on the ring (the ε of bounded-load
/// consistent hashing). Smaller spreads a hot key sooner and breaks more
/// conversations' affinity under load; larger keeps affinity longer and
/// lets a hot key pile up. 0.25 is the paper's and Vimeo's choice.
pub const LOAD_EPSILON: (u64, u64) = (1, 4);

/// Points each replica owns on the ring: with n replicas each one's share
/// of the keys is within a few percent of 1/n (the spread shrinks with the
/// square root of the points). 160 is ketama's number, which nginx's
/// `hash ... consistent` also uses.
pub const POINTS_PER_SLOT: u32 = 160;

/// A request's affinity key: requests with the same key are sent to the
/// same replica while it is eligible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key(u64);

impl Key {
    /// The key of a request: for a chat, its leading messages (every
    /// message up to and including the first `user` one, all of them when
    /// there is none); for a prompt, its first [`PROMPT_KEY_BYTES`] bytes.
    /// None for a request without input (refused by validation anyway).
    pub fn of(request: &pb::GenerateRequest) -> Option<Key> {
        use pb::generate_request::Input;
        let mut hash = Sha256::new();
        match request.input.as_ref()? {
            Input::Prompt(prompt) => {
                let bytes = prompt.as_bytes();
                hash.update(b"prompt\0");
                hash.update(&bytes[..bytes.len().min(PROMPT_KEY_BYTES)]);
            }
            Input::PromptTokens(tokens) => {
                hash.update(b"tokens\0");
                for id in tokens.ids.iter().take(PROMPT_KEY_BYTES / 4) {
                    hash.update(id.to_le_bytes());
                }
            }
            Input::Chat(chat) => {
                hash.update(b"chat\0");
                for message in &chat.messages {
                    // Length-prefixed, so that no two different message
                    // lists hash the same bytes.
                    for field in [&message.role, &message.content] {
                        hash.update((field.len() as u64).to_le_bytes());
                        hash.update(field.as_bytes());
                    }
                    if message.role == "user" {
                        break;
                    }
                }
            }
        }
        Some(Key(first_u64(&hash.finalize())))
    }
}

fn first_u64(digest: &[u8]) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The point `index` of the replica named `slot`.
fn point(slot: &str, index: u32) -> u64 {
    let mut hash = Sha256::new();
    hash.update(slot.as_bytes());
    hash.update(b"#");
    hash.update(index.to_le_bytes());
    first_u64(&hash.finalize())
}

/// A consistent-hash ring over slot names.
///
/// The ring only ever gains names (the router adds each Ready replica it
/// meets); a name whose slot is not Ready, or was removed, is skipped by
/// the walk, which gives exactly the mapping of a ring without it. So the
/// mapping depends only on the set of Ready replicas, and the points are
/// hashed once per name, not once per request.
#[derive(Debug, Default, Clone)]
pub struct Ring {
    /// (point, index into `names`), sorted.
    points: Vec<(u64, usize)>,
    /// The names with points on the ring.
    names: Vec<String>,
}

impl Ring {
    /// Add the names not on the ring yet.
    pub fn add<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        let mut added = false;
        for name in names {
            if self.names.iter().any(|n| n == name) {
                continue;
            }
            let index = self.names.len();
            self.names.push(name.to_string());
            self.points
                .extend((0..POINTS_PER_SLOT).map(|i| (point(name, i), index)));
            added = true;
        }
        if added {
            self.points.sort_unstable();
        }
    }

    /// The names in the order a key's walk meets them: the owner of the
    /// first point at or after the key, then clockwise, each name once.
    pub fn walk(&self, key: Key) -> Vec<&str> {
        let start = self.points.partition_point(|(p, _)| *p < key.0);
        let mut seen = vec![false; self.names.len()];
        let mut order = Vec::with_capacity(self.names.len());
        for (_, index) in self.points[start..].iter().chain(&self.points[..start]) {
            if !seen[*index] {
                seen[*index] = true;
                order.push(self.names[*index].as_str());
                if order.len() == self.names.len() {
                    break;
                }
            }
        }
        order
    }
}

/// Where a request with an affinity key went, when the choice was made
/// among two or more Ready replicas (`tt_serving_affinity_routed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// To its key's replica: the first Ready one on the ring.
    Affine,
    /// Elsewhere: its replica was over the load bound or full
    /// (`max_in_flight`).
    Fallback,
}

impl Placement {
    /// The metric label.
    pub fn word(self) -> &'static str {
        match self {
            Placement::Affine => "affine",
            Placement::Fallback => "fallback",
        }
    }
}

/// The least-loaded candidate below `limit` requests in flight (the first
/// of equals): the router's choice without affinity.
pub fn least_loaded(candidates: &[Candidate<'_>], limit: u32) -> Option<usize> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.in_flight < limit)
        .min_by_key(|(_, c)| c.in_flight)
        .map(|(i, _)| i)
}

/// The load a replica must stay below to take another request of its keys:
/// `ceil((1 + ε) · (total + 1) / n)`, the average counting the new request.
pub fn load_bound(candidates: &[Candidate<'_>]) -> u64 {
    let n = candidates.len().max(1) as u64;
    let total: u64 = candidates.iter().map(|c| u64::from(c.in_flight)).sum();
    let (num, den) = LOAD_EPSILON;
    ((den + num) * (total + 1)).div_ceil(den * n)
}

/// Pick a candidate for a request with `key`: the first one on the ring's
/// walk whose load is below both the bound and `limit`, else the
/// least-loaded one below `limit`. `ring` must hold every candidate's name
/// (names it holds that are not candidates are skipped). The placement is
/// None when there was no choice to make (fewer than two candidates).
pub fn choose(
    ring: &Ring,
    key: Key,
    candidates: &[Candidate<'_>],
    limit: u32,
) -> Option<(usize, Option<Placement>)> {
    if candidates.len() < 2 {
        return least_loaded(candidates, limit).map(|i| (i, None));
    }
    let bound = load_bound(candidates);
    let mut walk = ring
        .walk(key)
        .into_iter()
        .filter_map(|name| candidates.iter().position(|c| c.slot == name));
    let eligible = |i: &usize| {
        let load = candidates[*i].in_flight;
        load < limit && u64::from(load) < bound
    };
    let home = walk.next();
    if let Some(home) = home.filter(eligible) {
        return Some((home, Some(Placement::Affine)));
    }
    walk.find(eligible)
        .or_else(|| least_loaded(candidates, limit))
        .map(|i| (i, Some(Placement::Fallback)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn ring_of<'a>(names: impl IntoIterator<Item = &'a str>) -> Ring {
        let mut ring = Ring::default();
        ring.add(names);
        ring
    }

    fn key(i: u32) -> Key {
        Key::of(&prompt(&format!("conversation {i}"))).unwrap()
    }

    fn prompt(text: &str) -> pb::GenerateRequest {
        pb::GenerateRequest {
            model: "m".into(),
            input: Some(pb::generate_request::Input::Prompt(text.into())),
            ..Default::default()
        }
    }

    fn chat(messages: &[(&str, &str)]) -> pb::GenerateRequest {
        pb::GenerateRequest {
            model: "m".into(),
            input: Some(pb::generate_request::Input::Chat(pb::ChatMessages {
                messages: messages
                    .iter()
                    .map(|(role, content)| pb::ChatMessage {
                        role: role.to_string(),
                        content: content.to_string(),
                    })
                    .collect(),
            })),
            ..Default::default()
        }
    }

    fn owner<'a>(ring: &'a Ring, key: Key, ready: &[&str]) -> &'a str {
        ring.walk(key)
            .into_iter()
            .find(|name| ready.contains(name))
            .unwrap()
    }

    #[test]
    fn a_conversation_keeps_its_key_as_its_history_grows() {
        let system = ("system", "You are terse.");
        let turn1 = chat(&[system, ("user", "Name a prime.")]);
        let turn2 = chat(&[
            system,
            ("user", "Name a prime."),
            ("assistant", "7"),
            ("user", "Another."),
        ]);
        assert_eq!(Key::of(&turn1), Key::of(&turn2));
        // Another first question, or another system prompt, is another
        // conversation.
        assert_ne!(
            Key::of(&turn1),
            Key::of(&chat(&[system, ("user", "Name a colour.")]))
        );
        assert_ne!(
            Key::of(&turn1),
            Key::of(&chat(&[
                ("system", "Be verbose."),
                ("user", "Name a prime.")
            ]))
        );
        // Messages are length-delimited: moving text between them matters.
        assert_ne!(
            Key::of(&chat(&[("system", "ab"), ("user", "c")])),
            Key::of(&chat(&[("system", "a"), ("user", "bc")]))
        );
        // A prompt and a chat with the same text are different requests.
        assert_ne!(
            Key::of(&prompt("Name a prime.")),
            Key::of(&chat(&[("user", "Name a prime.")]))
        );
    }

    #[test]
    fn a_prompt_is_keyed_by_its_first_bytes() {
        let head = "x".repeat(PROMPT_KEY_BYTES);
        assert_eq!(
            Key::of(&prompt(&format!("{head} turn one"))),
            Key::of(&prompt(&format!("{head} turn one, turn two")))
        );
        assert_ne!(Key::of(&prompt("short one")), Key::of(&prompt("short two")));
        // A cut inside a multi-byte character is fine: bytes are hashed.
        let wide = "é".repeat(PROMPT_KEY_BYTES);
        assert!(Key::of(&prompt(&wide)).is_some());
        assert_eq!(Key::of(&pb::GenerateRequest::default()), None);
    }

    #[test]
    fn the_mapping_is_stable_and_independent_of_the_order_names_arrive() {
        let a = ring_of(["m/0", "m/1", "m/2"]);
        let mut b = ring_of(["m/2"]);
        b.add(["m/1", "m/0", "m/2"]);
        for i in 0..1000 {
            assert_eq!(a.walk(key(i)), b.walk(key(i)));
            assert_eq!(a.walk(key(i)).len(), 3);
        }
    }

    #[test]
    fn keys_spread_evenly_over_the_replicas() {
        let ring = ring_of(["m/0", "m/1", "m/2", "m/3"]);
        let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
        for i in 0..8000 {
            *counts.entry(ring.walk(key(i))[0]).or_default() += 1;
        }
        for (name, n) in &counts {
            assert!((1500..=2500).contains(n), "{name}: {n} of 8000: {counts:?}");
        }
    }

    #[test]
    fn a_replica_leaving_or_joining_moves_only_its_own_keys() {
        let ring = ring_of(["m/0", "m/1", "m/2"]);
        let all = ["m/0", "m/1", "m/2"];
        let without = ["m/0", "m/2"];
        let mut moved = 0;
        for i in 0..3000 {
            let before = owner(&ring, key(i), &all);
            let after = owner(&ring, key(i), &without);
            if before == "m/1" {
                moved += 1;
                assert_ne!(after, "m/1");
            } else {
                // Keys of the replicas that stayed stay with them.
                assert_eq!(before, after, "key {i}");
            }
        }
        assert!((700..=1300).contains(&moved), "m/1 owned {moved} of 3000");
        // A new replica takes keys only for itself; the ring that met it
        // later gives the same answers as one built with it.
        let mut grown = ring_of(["m/0", "m/1"]);
        grown.add(["m/2"]);
        for i in 0..3000 {
            let two = owner(&grown, key(i), &["m/0", "m/1"]);
            let three = owner(&grown, key(i), &all);
            assert!(three == two || three == "m/2", "key {i}: {two} → {three}");
            assert_eq!(three, owner(&ring, key(i), &all));
        }
    }

    fn candidates<'a>(loads: &[(&'a str, u32)]) -> Vec<Candidate<'a>> {
        loads
            .iter()
            .map(|(slot, in_flight)| Candidate {
                slot,
                in_flight: *in_flight,
            })
            .collect()
    }

    #[test]
    fn the_load_bound_is_a_quarter_above_the_average_counting_the_new_request() {
        assert_eq!(load_bound(&candidates(&[("a", 0), ("b", 0)])), 1);
        assert_eq!(load_bound(&candidates(&[("a", 1), ("b", 0)])), 2);
        assert_eq!(load_bound(&candidates(&[("a", 2), ("b", 0)])), 2);
        assert_eq!(load_bound(&candidates(&[("a", 4), ("b", 3)])), 5);
        assert_eq!(load_bound(&candidates(&[("a", 7), ("b", 7), ("c", 7)])), 10);
    }

    #[test]
    fn a_hot_key_fills_its_replica_to_the_bound_then_spills_to_the_next() {
        let ring = ring_of(["m/0", "m/1"]);
        let hot = key(7);
        let walk = ring.walk(hot);
        let (home, next) = (walk[0], walk[1]);
        let mut loads: BTreeMap<&str, u32> = [(home, 0), (next, 0)].into();
        let mut placements = Vec::new();
        // Sixteen requests of one key arrive while none has finished.
        for _ in 0..16 {
            let c: Vec<Candidate> = loads
                .iter()
                .map(|(slot, in_flight)| Candidate {
                    slot,
                    in_flight: *in_flight,
                })
                .collect();
            let (i, placement) = choose(&ring, hot, &c, 64).unwrap();
            let slot = c[i].slot;
            *loads.get_mut(slot).unwrap() += 1;
            placements.push(placement.unwrap());
        }
        // The home stays within a quarter above the average (8).
        assert_eq!(loads[home], 10, "{loads:?}");
        assert_eq!(loads[next], 6, "{loads:?}");
        assert_eq!(placements[0], Placement::Affine);
        assert_eq!(
            placements
                .iter()
                .filter(|p| **p == Placement::Fallback)
                .count(),
            6
        );
    }

    #[test]
    fn a_full_or_missing_home_falls_back_and_one_candidate_is_no_choice() {
        let ring = ring_of(["m/0", "m/1", "m/2"]);
        let k = key(3);
        let walk = ring.walk(k);
        // Home at max_in_flight (2): the next on the walk, though busier
        // than the third.
        let c = candidates(&[(walk[0], 2), (walk[1], 1), (walk[2], 0)]);
        assert_eq!(
            choose(&ring, k, &c, 2),
            Some((1, Some(Placement::Fallback)))
        );
        // Home not Ready: the first Ready one on the walk is the key's
        // replica now.
        let c = candidates(&[(walk[1], 0), (walk[2], 0)]);
        assert_eq!(choose(&ring, k, &c, 8), Some((0, Some(Placement::Affine))));
        // Everything full: no place.
        let c = candidates(&[(walk[0], 2), (walk[1], 2)]);
        assert_eq!(choose(&ring, k, &c, 2), None);
        // One Ready replica: it, with no placement to count.
        let c = candidates(&[(walk[2], 5)]);
        assert_eq!(choose(&ring, k, &c, 8), Some((0, None)));
        assert_eq!(choose(&ring, k, &c, 5), None);
    }

    #[test]
    fn least_loaded_takes_the_first_of_equals_below_the_limit() {
        let c = candidates(&[("a", 3), ("b", 1), ("c", 1)]);
        assert_eq!(least_loaded(&c, 8), Some(1));
        assert_eq!(least_loaded(&c, 1), None);
        assert_eq!(least_loaded(&[], 8), None);
    }
}
