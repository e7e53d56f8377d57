//! The KV block pool and the prefix cache.
//!
//! Keys and values live in fixed-size blocks of [`BLOCK_TOKENS`] positions,
//! all from one pool sized by the worker's KV budget. A sequence holds a
//! table of blocks (position `p` is in block `table[p / BLOCK_TOKENS]`), so
//! memory follows the tokens actually cached, and a block can belong to
//! several sequences at once.
//!
//! That sharing is the prefix cache: every block a sequence fills is
//! indexed by its tokens and the block before it, so a later request whose
//! tokens start the same way reuses those blocks instead of computing them
//! again. Full blocks are shared as they are: a full block is never written
//! again. The block a sequence leaves part-filled (its last) is indexed too
//! when the sequence ends, and any indexed block can match a request's next
//! tokens only in part (the request diverges inside it): then the request
//! gets a block of its own that starts as a copy of the positions that
//! match ([`Prefix::copy`]), so a repeated prompt recomputes its last token
//! only, not the tail after its last full block. Two sequences that
//! computed the same block at once keep one copy: the second is handed the
//! indexed one. A block nobody uses any more stays indexed until the pool
//! needs it, least recently used first.
//!
//! This is bookkeeping only: the ranks own the memory, indexed by the
//! block ids handed out here (the same ids on every rank).

use std::collections::{BTreeSet, HashMap};

/// Positions per block: the unit of allocation and of reuse.
pub const BLOCK_TOKENS: usize = 16;

/// The block before an indexed one, with the generation it had (so a
/// recycled parent never matches); `None` for a sequence's first block.
type ParentKey = Option<(u32, u32)>;

/// What identifies an indexed block's contents: the block before it and
/// its first `len` tokens (all [`BLOCK_TOKENS`] for a full block).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    parent: ParentKey,
    tokens: [u32; BLOCK_TOKENS],
    len: usize,
}

impl Key {
    fn tokens(&self) -> &[u32] {
        &self.tokens[..self.len]
    }
}

/// A request's cached prefix: whole blocks it shares, and maybe the start
/// of its next block to copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefix {
    /// Blocks shared as they are, each referenced for the caller.
    pub blocks: Vec<u32>,
    /// An indexed block whose first positions hold the request's next
    /// tokens, referenced for the caller until the copy is made.
    pub copy: Option<Copy>,
}

impl Prefix {
    /// Prompt positions the prefix supplies.
    pub fn positions(&self) -> usize {
        self.blocks.len() * BLOCK_TOKENS + self.copy.map_or(0, |c| c.positions)
    }
}

/// Positions `0..positions` of block `from` to copy into the caller's next
/// block (copy-on-write: `from` stays as it is for others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copy {
    pub from: u32,
    pub positions: usize,
}

#[derive(Debug, Default, Clone)]
struct Block {
    /// Sequences using it.
    refs: u32,
    /// Bumped at every allocation: keys naming this block as parent with
    /// an older generation describe contents it no longer holds.
    generation: u32,
    /// Set while the block is in the index.
    key: Option<Key>,
    /// When it was last released (the LRU order of unused cached blocks).
    released_at: u64,
}

/// Block counts, for `Health` and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks held by at least one sequence.
    pub in_use: u32,
    /// Blocks held only by the prefix cache (reusable, evictable).
    pub cached: u32,
    /// Blocks in the pool.
    pub total: u32,
}

/// The blocks of one model's KV memory.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    /// Released blocks with no cached contents, most recent last (its pages
    /// are the warmest; reusing it first keeps the resident set small).
    free: Vec<u32>,
    /// Blocks `fresh..` have never been used (their pages never touched).
    fresh: u32,
    /// Unused cached blocks by `(released_at, id)`: the first is evicted
    /// first.
    lru: BTreeSet<(u64, u32)>,
    /// Full blocks by their contents.
    index: HashMap<Key, u32>,
    /// Every indexed block (full or not) by the block before it: where a
    /// match inside a block is looked for.
    children: HashMap<ParentKey, Vec<u32>>,
    prefix_cache: bool,
    clock: u64,
    in_use: u32,
}

/// A reference to the block before the next one of a sequence (`None` for
/// the first block).
pub type Parent = Option<u32>;

impl BlockPool {
    /// A pool of `total` blocks; `prefix_cache` keeps released full blocks
    /// for reuse.
    pub fn new(total: u32, prefix_cache: bool) -> Self {
        Self {
            blocks: vec![Block::default(); total as usize],
            free: Vec::new(),
            fresh: 0,
            lru: BTreeSet::new(),
            index: HashMap::new(),
            children: HashMap::new(),
            prefix_cache,
            clock: 0,
            in_use: 0,
        }
    }

    /// Whether released blocks are kept for reuse.
    pub fn prefix_cache(&self) -> bool {
        self.prefix_cache
    }

    /// Block counts.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            in_use: self.in_use,
            cached: self.lru.len() as u32,
            total: self.blocks.len() as u32,
        }
    }

    /// Blocks that [`Self::allocate`] can still hand out (free, never used,
    /// or evictable).
    pub fn available(&self) -> usize {
        self.free.len() + (self.blocks.len() - self.fresh as usize) + self.lru.len()
    }

    fn parent_key(&self, parent: Parent) -> Option<ParentKey> {
        match parent {
            Some(p) => Some(Some((p, self.blocks.get(p as usize)?.generation))),
            None => Some(None),
        }
    }

    fn key(&self, parent: Parent, tokens: &[u32]) -> Option<Key> {
        if tokens.is_empty() || tokens.len() > BLOCK_TOKENS {
            return None;
        }
        let mut key = Key {
            parent: self.parent_key(parent)?,
            tokens: [0; BLOCK_TOKENS],
            len: tokens.len(),
        };
        key.tokens[..tokens.len()].copy_from_slice(tokens);
        Some(key)
    }

    /// Indexes block `id` under `key` (the caller checked it is not yet).
    fn insert(&mut self, id: u32, key: Key) {
        if key.len == BLOCK_TOKENS {
            self.index.insert(key.clone(), id);
        }
        self.children.entry(key.parent).or_default().push(id);
        self.blocks[id as usize].key = Some(key);
    }

    /// Forgets what block `id` holds.
    fn forget(&mut self, id: u32) {
        let Some(key) = self.blocks[id as usize].key.take() else {
            return;
        };
        if key.len == BLOCK_TOKENS {
            self.index.remove(&key);
        }
        if let Some(ids) = self.children.get_mut(&key.parent) {
            ids.retain(|&c| c != id);
            if ids.is_empty() {
                self.children.remove(&key.parent);
            }
        }
    }

    /// Takes a reference on `id`.
    fn retain(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        if b.refs == 0 {
            self.lru.remove(&(b.released_at, id));
            self.in_use += 1;
        }
        b.refs += 1;
    }

    /// The longest cached prefix of `tokens`: the run of full blocks it
    /// starts with, then the indexed block after them that holds the most
    /// of its next tokens (at least one), to copy. Every block returned is
    /// referenced for the caller.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> Prefix {
        let mut prefix = Prefix::default();
        if !self.prefix_cache {
            return prefix;
        }
        let mut parent = None;
        for chunk in tokens.chunks_exact(BLOCK_TOKENS) {
            let Some(&id) = self.key(parent, chunk).and_then(|k| self.index.get(&k)) else {
                break;
            };
            self.retain(id);
            prefix.blocks.push(id);
            parent = Some(id);
        }
        let next = &tokens[prefix.blocks.len() * BLOCK_TOKENS..];
        let next = &next[..next.len().min(BLOCK_TOKENS)];
        let best = self
            .parent_key(parent)
            .and_then(|p| self.children.get(&p))
            .into_iter()
            .flatten()
            .filter_map(|&id| {
                let key = self.blocks[id as usize].key.as_ref()?;
                let same = key
                    .tokens()
                    .iter()
                    .zip(next)
                    .take_while(|(a, b)| a == b)
                    .count();
                Some((same, id))
            })
            .max();
        if let Some((positions, from)) = best.filter(|&(n, _)| n > 0) {
            self.retain(from);
            prefix.copy = Some(Copy { from, positions });
        }
        prefix
    }

    /// A block for new contents, referenced once by the caller: a free one,
    /// else one never used, else the least recently used cached one
    /// (forgotten by the index). `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<u32> {
        let id = if let Some(id) = self.free.pop() {
            id
        } else if (self.fresh as usize) < self.blocks.len() {
            self.fresh += 1;
            self.fresh - 1
        } else {
            let (at, id) = self.lru.pop_first()?;
            debug_assert_eq!(self.blocks[id as usize].released_at, at);
            self.forget(id);
            id
        };
        let b = &mut self.blocks[id as usize];
        b.generation = b.generation.wrapping_add(1);
        b.refs = 1;
        self.in_use += 1;
        Some(id)
    }

    /// Indexes the full block `id` (holding `tokens`, after `parent`) for
    /// reuse, and returns the block the caller should hold for these
    /// contents: `id`, or, when the same contents are already indexed under
    /// another block (two sequences computed the same prefix at once), that
    /// block, referenced for the caller, with `id` given back. Keeping one
    /// copy keeps the caller's later blocks indexable: a private copy would
    /// make everything after it private too. `None` with the cache off.
    pub fn register(&mut self, parent: Parent, id: u32, tokens: &[u32]) -> Option<u32> {
        if !self.prefix_cache {
            return None;
        }
        if self.blocks[id as usize].key.is_some() {
            return Some(id);
        }
        let key = self.key(parent, tokens).filter(|k| k.len == BLOCK_TOKENS)?;
        if let Some(&canonical) = self.index.get(&key) {
            self.retain(canonical);
            self.release(&[id]);
            return Some(canonical);
        }
        self.insert(id, key);
        Some(id)
    }

    /// Indexes the part-filled block `id` (holding `tokens`, fewer than a
    /// block's worth, after `parent`) that its sequence is about to
    /// release: it is never written again, and a later request with the
    /// same tokens copies them instead of computing them. Nothing happens
    /// with the cache off, or when the same contents are indexed already.
    pub fn register_tail(&mut self, parent: Parent, id: u32, tokens: &[u32]) {
        if !self.prefix_cache || tokens.len() >= BLOCK_TOKENS {
            return;
        }
        let Some(key) = self.key(parent, tokens) else {
            return;
        };
        if self.blocks[id as usize].key.is_some() {
            return;
        }
        let known = self.children.get(&key.parent).is_some_and(|ids| {
            ids.iter()
                .any(|&c| self.blocks[c as usize].key.as_ref() == Some(&key))
        });
        if !known {
            self.insert(id, key);
        }
    }

    /// Drops the caller's reference to each block of `table`, last block
    /// first, so that a sequence's tail is evicted before its head.
    pub fn release(&mut self, table: &[u32]) {
        for &id in table.iter().rev() {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.refs > 0, "block {id} released more often than taken");
            b.refs = b.refs.saturating_sub(1);
            if b.refs > 0 {
                continue;
            }
            self.in_use -= 1;
            if b.key.is_some() {
                self.clock += 1;
                b.released_at = self.clock;
                self.lru.insert((self.clock, id));
            } else {
                self.free.push(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(start: u32, n: usize) -> Vec<u32> {
        (start..start + n as u32).collect()
    }

    /// Fills a sequence of `tokens` the way the scheduler does: allocate,
    /// then register each full block.
    fn fill(pool: &mut BlockPool, tokens: &[u32]) -> Vec<u32> {
        let prefix = pool.match_prefix(tokens);
        if let Some(copy) = prefix.copy {
            pool.release(&[copy.from]);
        }
        let mut table = prefix.blocks;
        let mut parent = table.last().copied();
        for chunk in tokens.chunks(BLOCK_TOKENS).skip(table.len()) {
            let id = pool.allocate().expect("a block");
            let id = if chunk.len() == BLOCK_TOKENS {
                pool.register(parent, id, chunk).unwrap_or(id)
            } else {
                id
            };
            table.push(id);
            parent = Some(id);
        }
        table
    }

    #[test]
    fn a_released_sequence_is_reused_block_by_block() {
        let mut pool = BlockPool::new(8, true);
        let a = toks(0, 40); // two full blocks and a partial one
        let ta = fill(&mut pool, &a);
        assert_eq!(pool.stats().in_use, 3);
        pool.release(&ta);
        // The partial block is free; the two full ones are cached.
        assert_eq!(
            pool.stats(),
            PoolStats {
                in_use: 0,
                cached: 2,
                total: 8
            }
        );
        let mut b = toks(0, 32);
        b.extend([7, 7, 7]);
        let tb = pool.match_prefix(&b).blocks;
        assert_eq!(tb, ta[..2].to_vec());
        assert_eq!(pool.stats().in_use, 2);
        assert_eq!(pool.stats().cached, 0);
        // A different first block shares nothing, even with the same second.
        let mut c = toks(100, 16);
        c.extend(toks(16, 16));
        assert!(pool.match_prefix(&c).blocks.is_empty());
    }

    #[test]
    fn running_sequences_share_blocks_and_keep_them_from_eviction() {
        let mut pool = BlockPool::new(3, true);
        let t1 = fill(&mut pool, &toks(0, 32));
        let t2 = pool.match_prefix(&toks(0, 32)).blocks;
        assert_eq!(t1, t2);
        assert_eq!(pool.stats().in_use, 2);
        pool.release(&t1);
        assert_eq!(pool.stats().in_use, 2, "still held by the second");
        // One fresh block left, and nothing evictable.
        assert!(pool.allocate().is_some());
        assert_eq!(pool.allocate(), None);
    }

    #[test]
    fn eviction_is_least_recently_released_and_forgets_the_contents() {
        let mut pool = BlockPool::new(2, true);
        let a = fill(&mut pool, &toks(0, 16));
        let b = fill(&mut pool, &toks(50, 16));
        pool.release(&a);
        pool.release(&b);
        assert_eq!(pool.available(), 2);
        let id = pool.allocate().expect("evicts one");
        assert_eq!(id, a[0], "the first released goes first");
        assert!(pool.match_prefix(&toks(0, 16)).blocks.is_empty());
        assert_eq!(pool.match_prefix(&toks(50, 16)).blocks, b);
    }

    #[test]
    fn a_recycled_parent_does_not_match_its_old_children() {
        let mut pool = BlockPool::new(4, true);
        // A child indexed under a parent that itself was never indexed.
        let p = pool.allocate().expect("block");
        let c = pool.allocate().expect("block");
        assert_eq!(pool.register(Some(p), c, &toks(16, 16)), Some(c));
        pool.release(&[p, c]);
        // The parent's block is reused for the first 16 tokens.
        assert_eq!(pool.allocate(), Some(p));
        assert_eq!(pool.register(None, p, &toks(0, 16)), Some(p));
        pool.release(&[p]);
        // The child's key named the parent's previous generation: it
        // describes contents that are gone, and must not match.
        assert_eq!(pool.match_prefix(&toks(0, 32)).blocks, vec![p]);
    }

    #[test]
    fn without_the_prefix_cache_nothing_is_kept() {
        let mut pool = BlockPool::new(4, false);
        let t = fill(&mut pool, &toks(0, 32));
        pool.release(&t);
        assert_eq!(pool.stats().cached, 0);
        assert!(pool.match_prefix(&toks(0, 32)).blocks.is_empty());
        assert_eq!(pool.available(), 4);
    }

    #[test]
    fn a_duplicate_is_folded_into_the_indexed_copy() {
        let mut pool = BlockPool::new(4, true);
        let a = pool.allocate().expect("block");
        let b = pool.allocate().expect("block");
        assert_eq!(pool.register(None, a, &toks(0, 16)), Some(a));
        // The second sequence computed the same block: it is handed `a`,
        // and `b` goes back to the free list.
        assert_eq!(pool.register(None, b, &toks(0, 16)), Some(a));
        assert_eq!(pool.stats().in_use, 1, "one copy, held twice");
        assert_eq!(pool.allocate(), Some(b), "the warmest free block first");
        // Its next block is indexed after the shared one, so a third
        // sequence finds both.
        let c = pool.allocate().expect("block");
        let mut longer = toks(0, 16);
        longer.extend(toks(100, 16));
        assert_eq!(pool.register(Some(a), c, &longer[16..]), Some(c));
        pool.release(&[a, c]);
        pool.release(&[a]);
        assert_eq!(pool.match_prefix(&longer).blocks, vec![a, c]);
    }

    /// Fills `tokens` and releases them as a finished sequence does: the
    /// part-filled last block offered to the cache first.
    fn finish(pool: &mut BlockPool, tokens: &[u32]) -> Vec<u32> {
        let table = fill(pool, tokens);
        let full = tokens.len() / BLOCK_TOKENS;
        if !tokens.len().is_multiple_of(BLOCK_TOKENS) {
            let parent = full.checked_sub(1).map(|p| table[p]);
            pool.register_tail(parent, table[full], &tokens[full * BLOCK_TOKENS..]);
        }
        pool.release(&table);
        table
    }

    #[test]
    fn a_repeat_copies_the_tail_a_finished_sequence_left() {
        let mut pool = BlockPool::new(8, true);
        let a = toks(0, 40);
        let ta = finish(&mut pool, &a);
        assert_eq!(pool.stats().cached, 3, "two full blocks and the tail");
        // The same prompt again, all but its last token from the cache:
        // two shared blocks, then 7 positions copied from the tail.
        let p = pool.match_prefix(&a[..39]);
        assert_eq!(p.blocks, ta[..2].to_vec());
        assert_eq!(
            p.copy,
            Some(Copy {
                from: ta[2],
                positions: 7
            })
        );
        assert_eq!(p.positions(), 39);
        // The copy's source is held until the caller lets it go.
        assert_eq!(pool.stats().in_use, 3);
        pool.release(&[ta[2]]);
        pool.release(&p.blocks);
        // A prompt that diverges inside a full block copies the part
        // before the divergence.
        let mut b = toks(0, 21);
        b.extend([99, 98, 97]);
        let p = pool.match_prefix(&b);
        assert_eq!(p.blocks, ta[..1].to_vec());
        assert_eq!(
            p.copy,
            Some(Copy {
                from: ta[1],
                positions: 5
            })
        );
        pool.release(&[ta[1]]);
        pool.release(&p.blocks);
        // Nothing in common after the shared blocks: no copy.
        let mut c = toks(0, 32);
        c.extend([500, 501]);
        assert_eq!(pool.match_prefix(&c).copy, None);
    }

    #[test]
    fn a_tail_is_indexed_once_and_evicted_like_any_block() {
        let mut pool = BlockPool::new(3, true);
        finish(&mut pool, &toks(0, 20));
        // The same tail again is not a second entry: its block goes free.
        finish(&mut pool, &toks(0, 20));
        assert_eq!(pool.stats().cached, 2);
        // Filling the pool evicts the least recently released.
        let t = fill(&mut pool, &toks(100, 48));
        assert_eq!(t.len(), 3);
        assert_eq!(pool.match_prefix(&toks(0, 19)), Prefix::default());
    }
}
