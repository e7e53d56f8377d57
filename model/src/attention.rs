//! Causal attention over the paged KV cache.
//!
//! The work of a step is cut into units of (sequence, tile of up to
//! [`QUERY_TILE`] new tokens, KV head, span of up to [`KEY_SPAN`] keys) and
//! spread over the matmul pool. A unit reads each key and value of its span
//! once for all the queries of its tile (every token, every query head of
//! the KV head's group); a tile over a long history is several spans whose
//! partial softmaxes are merged, so a single new token over thousands of
//! cached ones keeps every core busy.
//!
//! A query's arithmetic depends only on its own position (its spans are
//! fixed by it, their order is key order), never on the batch, the tiles or
//! the threads: a batch never changes a token.

use crate::kv::BLOCK_TOKENS;
use crate::lanes::{self, KvElem, Lanes};
use crate::model::{KvCache, KvStore, StepSeq};

/// A rank's attention heads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub head_dim: usize,
    /// Query heads.
    pub n_q: usize,
    /// Key/value heads (each serves `n_q / n_kv` query heads).
    pub n_kv: usize,
}

/// Causal attention of every sequence's new tokens over its cached
/// history (`qkv` and `out` hold all rows of the step). One unit of work
/// per (sequence, tile of up to [`QUERY_TILE`] new tokens, KV head, span
/// of up to [`KEY_SPAN`] keys), spread over the matmul pool: a unit reads
/// each key and value of its span once for every query head of its
/// group and every token of its tile. A tile whose keys need several
/// spans has their partial softmaxes merged afterwards (one unit per
/// tile and KV head). Each query is computed the same way whatever the
/// split (its spans are fixed by its position), so results do not depend
/// on the batch, the tiles or the threads.
pub(crate) fn attend(
    heads: Heads,
    kv: &KvCache,
    seqs: &[StepSeq],
    layer: usize,
    qkv: &[f32],
    stride: usize,
    out: &mut [f32],
) {
    attend_on(heads, kv, seqs, layer, qkv, stride, out, false)
}

/// [`attend`], on the portable loops whatever the CPU when `portable` (the
/// tests' reference for the dispatched ones).
#[allow(clippy::too_many_arguments)]
fn attend_on(
    heads: Heads,
    kv: &KvCache,
    seqs: &[StepSeq],
    layer: usize,
    qkv: &[f32],
    stride: usize,
    out: &mut [f32],
    portable: bool,
) {
    let hd = heads.head_dim;
    let q_w = heads.n_q * hd;
    debug_assert!(out.len() >= seqs.iter().map(|s| s.tokens.len()).sum::<usize>() * q_w);
    let n_kv = heads.n_kv.max(1);
    let group = heads.n_q / n_kv;
    // Smaller tiles while there are too few units to keep the pool busy
    // (a short prompt tail over a short history is a few units).
    let mut tile_len = QUERY_TILE;
    let units_for = |t: usize| {
        seqs.iter()
            .map(|s| {
                (0..s.tokens.len())
                    .step_by(t)
                    .map(|first| (s.start_pos + (first + t).min(s.tokens.len())).div_ceil(KEY_SPAN))
                    .sum::<usize>()
            })
            .sum::<usize>()
            * n_kv
    };
    while tile_len > 1 && units_for(tile_len) < 4 * crate::pool::global().threads() {
        tile_len /= 2;
    }
    // Every (tile, KV head, span), and where a split tile's partials go.
    let mut units = Vec::new();
    let mut merges = Vec::new();
    let mut partial_len = 0;
    let mut rows = 0;
    let mut work = 0;
    for (si, s) in seqs.iter().enumerate() {
        for first in (0..s.tokens.len()).step_by(tile_len) {
            let end = (first + tile_len).min(s.tokens.len());
            let spans = (s.start_pos + end).div_ceil(KEY_SPAN);
            let queries = (end - first) * group;
            for kv_head in 0..n_kv {
                let tile = Tile {
                    layer,
                    kv_head,
                    first,
                    end,
                    stride,
                    row: rows,
                };
                if spans == 1 {
                    units.push((si, tile, 0, None));
                    continue;
                }
                merges.push((si, tile, partial_len, spans));
                for span in 0..spans {
                    units.push((si, tile, span, Some(partial_len)));
                    partial_len += queries * (hd + 2);
                }
            }
        }
        rows += s.tokens.len();
        work += s.tokens.len() * (s.start_pos + s.tokens.len());
    }
    let out_ptr = AttnOut(out.as_mut_ptr());
    let mut partials = vec![0.0f32; partial_len];
    let partials_ptr = AttnOut(partials.as_mut_ptr());
    let run = |range: std::ops::Range<usize>| {
        for &(si, tile, span, at) in &units[range] {
            let s = &seqs[si];
            let qkv = &qkv[tile.row * stride..];
            let to = match at {
                // SAFETY: `at` and the partial's length were counted
                // into `partial_len` above.
                Some(at) => SpanOut::Partial(unsafe { partials_ptr.at(at) }),
                None => SpanOut::Rows(out_ptr),
            };
            match (&kv.store, portable) {
                (KvStore::F32 { k, v }, false) => {
                    attend_span(heads, kv, s, tile, span, qkv, to, k, v)
                }
                (KvStore::F16 { k, v }, false) => {
                    attend_span(heads, kv, s, tile, span, qkv, to, k, v)
                }
                (KvStore::F32 { k, v }, true) => {
                    attend_span_body::<lanes::Portable, _>(heads, kv, s, tile, span, qkv, to, k, v)
                }
                (KvStore::F16 { k, v }, true) => {
                    attend_span_body::<lanes::Portable, _>(heads, kv, s, tile, span, qkv, to, k, v)
                }
            }
        }
    };
    // Short histories are not worth waking the pool for.
    let serial = work * heads.n_q * hd < 32 * 1024;
    let spread = |n: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)| {
        if serial {
            f(0..n)
        } else {
            crate::pool::global().run(n, f)
        }
    };
    spread(units.len(), &run);
    // Every span unit has finished: the partials are only read now.
    let partials = &partials;
    spread(merges.len(), &|range| {
        for &(si, tile, at, spans) in &merges[range] {
            if portable {
                merge_spans_body::<lanes::Portable>(
                    heads,
                    &seqs[si],
                    tile,
                    spans,
                    &partials[at..],
                    out_ptr,
                );
            } else {
                merge_spans(heads, &seqs[si], tile, spans, &partials[at..], out_ptr);
            }
        }
    });
}

/// The blocks holding positions `0..len` of `s`, each with how many of its
/// positions are in that range.
fn spans(s: &StepSeq, len: usize) -> impl Iterator<Item = (u32, usize)> + '_ {
    s.blocks
        .iter()
        .enumerate()
        .take(len.div_ceil(BLOCK_TOKENS))
        .map(move |(i, &b)| (b, (len - i * BLOCK_TOKENS).min(BLOCK_TOKENS)))
}

/// New tokens of one sequence whose queries one attention unit computes (at
/// most: fewer when the step has few units).
const QUERY_TILE: usize = 16;

/// Keys one attention unit reads at most: a longer history is split into
/// spans of this many keys (a whole number of KV blocks) whose partial
/// softmaxes are merged, so one token over a long history is several units
/// and a tile of new tokens reads each key once. 256 keys of one head are
/// 128 KiB of f32 keys and values: a core's L2.
const KEY_SPAN: usize = 16 * BLOCK_TOKENS;

/// One attention tile: tokens `first..end` of a sequence (its rows start at
/// `row` of the step), the query heads of KV head `kv_head`, in `layer`.
#[derive(Clone, Copy)]
struct Tile {
    layer: usize,
    kv_head: usize,
    first: usize,
    end: usize,
    stride: usize,
    row: usize,
}

impl Tile {
    /// Queries of the tile: token `first + qi / group`, head
    /// `kv_head * group + qi % group` for `qi` below this.
    fn queries(&self, group: usize) -> usize {
        (self.end - self.first) * group
    }
}

/// Where one span's results go: straight to the attention output (the
/// tile's only span) or, as `[max, sum, weighted values; head_dim]` per
/// query, to the partials its merge reads.
#[derive(Clone, Copy)]
enum SpanOut {
    Rows(AttnOut),
    Partial(AttnOut),
}

lanes::dispatch! {
    /// Attention of one [`Tile`] over span `span` of its keys: scores,
    /// their softmax and the weighted sum of values for every query of the
    /// tile.
    fn attend_span<E: KvElem>(heads: Heads, kv: &KvCache, s: &StepSeq, tile: Tile, span: usize, qkv: &[f32],
        to: SpanOut, k: &[E], v: &[E]) => attend_span_body
}

/// Each query's scores are computed in key order, and its span's softmax
/// (`exp(score - the span's max)`, their sum, the values weighted by them)
/// run in key order, exactly as one query at a time would: the tile only
/// changes how often a key block is read (once per unit; f16 widened to f32
/// once, f32 read in place) and that is exact. A query's output is the
/// weighted values times the inverse of the sum, after [`merge_spans`]
/// when its keys span several units (with one span it is that exactly).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_span_body<L: Lanes, E: KvElem>(
    heads: Heads,
    kv: &KvCache,
    s: &StepSeq,
    tile: Tile,
    span: usize,
    qkv: &[f32],
    to: SpanOut,
    k: &[E],
    v: &[E],
) {
    let hd = heads.head_dim;
    let group = heads.n_q / heads.n_kv.max(1);
    let scale = 1.0 / (hd as f32).sqrt();
    let q_w = heads.n_q * hd;
    let first_head = tile.kv_head * group;
    // Keys `key_start..key_end` of this span; the tile's last query sees
    // them all, a query sees those up to its own position.
    let key_start = span * KEY_SPAN;
    let key_end = (s.start_pos + tile.end).min(key_start + KEY_SPAN);
    let width = key_end - key_start;
    let queries = tile.queries(group);
    // Query `qi` is token `tile.first + qi / group`, head `first_head + qi % group`.
    let pos_of = |qi: usize| s.start_pos + tile.first + qi / group;
    // Keys of this span query `qi` sees (maybe none).
    let sees = |qi: usize| (pos_of(qi) + 1).saturating_sub(key_start).min(width);
    // The queries that see keys `key0..key0 + n` of the span (`key0`
    // counted from its start): (query, token, head, how many it sees).
    let seeing = |key0: usize, n: usize| {
        (0..queries).filter_map(move |qi| {
            let (i, head) = (tile.first + qi / group, first_head + qi % group);
            let seen = sees(qi).saturating_sub(key0).min(n);
            (seen > 0).then_some((qi, i, head, seen))
        })
    };
    // The weighted values of query `qi`, summed in place: its output row
    // or its partial. SAFETY (for every call): this unit is the only writer
    // of these heads' columns of these rows in the output `attend` was
    // given, and of its own partial.
    let acc_row = |qi: usize| unsafe {
        match to {
            SpanOut::Rows(out) => {
                let (i, head) = (tile.first + qi / group, first_head + qi % group);
                std::slice::from_raw_parts_mut(out.0.add((tile.row + i) * q_w + head * hd), hd)
            }
            SpanOut::Partial(p) => std::slice::from_raw_parts_mut(p.0.add(qi * (hd + 2) + 2), hd),
        }
    };
    let blocks = || {
        spans(s, key_end)
            .enumerate()
            .skip(key_start / BLOCK_TOKENS)
            .map(move |(bi, (block, n))| {
                (
                    bi * BLOCK_TOKENS - key_start,
                    kv.base(block, tile.layer, tile.kv_head),
                    n,
                )
            })
    };
    let mut scores = vec![0.0f32; queries * width];
    let mut block_f32 = vec![0.0f32; BLOCK_TOKENS * hd];
    for (key0, base, n) in blocks() {
        let keys = floats::<L, E>(&k[base..base + n * hd], &mut block_f32);
        for (qi, i, head, seen) in seeing(key0, n) {
            let q = &qkv[i * tile.stride + head * hd..i * tile.stride + (head + 1) * hd];
            let row = &mut scores[qi * width + key0..qi * width + key0 + seen];
            let keys = &keys[..seen * hd];
            let mut quads = row.chunks_exact_mut(4).zip(keys.chunks_exact(4 * hd));
            for (sc, k4) in &mut quads {
                let k = |j: usize| &k4[j * hd..(j + 1) * hd];
                let d = L::dot4(q, [k(0), k(1), k(2), k(3)]);
                for (sc, d) in sc.iter_mut().zip(d) {
                    *sc = d * scale;
                }
            }
            let done = seen / 4 * 4;
            for (sc, key) in row[done..]
                .iter_mut()
                .zip(keys[done * hd..].chunks_exact(hd))
            {
                *sc = L::dot(q, key) * scale;
            }
        }
    }
    // Per query: the span's max and the sum of its exponentials.
    let mut stats = vec![(f32::NEG_INFINITY, 0.0f32); queries];
    for (qi, stat) in stats.iter_mut().enumerate() {
        let row = &mut scores[qi * width..qi * width + sees(qi)];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &sc| m.max(sc));
        let mut sum = 0.0;
        for sc in row.iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        *stat = (max, sum);
        acc_row(qi).fill(0.0);
    }
    for (key0, base, n) in blocks() {
        let values = floats::<L, E>(&v[base..base + n * hd], &mut block_f32);
        for (qi, _, _, seen) in seeing(key0, n) {
            let weights = &scores[qi * width + key0..qi * width + key0 + seen];
            L::axpy_rows(acc_row(qi), weights, &values[..seen * hd]);
        }
    }
    for (qi, &(max, sum)) in stats.iter().enumerate() {
        match to {
            SpanOut::Rows(_) => {
                let inv = 1.0 / sum;
                acc_row(qi).iter_mut().for_each(|o| *o *= inv);
            }
            // SAFETY: this unit's own partial, as above.
            SpanOut::Partial(p) => unsafe {
                *p.0.add(qi * (hd + 2)) = max;
                *p.0.add(qi * (hd + 2) + 1) = sum;
            },
        }
    }
}

/// Stored keys or values as floats: in place when they are f32, else
/// widened into `scratch` (exact).
#[inline(always)]
fn floats<'a, L: Lanes, E: KvElem>(stored: &'a [E], scratch: &'a mut [f32]) -> &'a [f32] {
    match E::as_f32(stored) {
        Some(floats) => floats,
        None => {
            let widened = &mut scratch[..stored.len()];
            L::widen(widened, stored);
            widened
        }
    }
}

lanes::dispatch! {
    /// A split tile's output: each query's spans' partials (in key order)
    /// rescaled to their common max and summed, times the inverse of the
    /// summed exponentials.
    fn merge_spans(heads: Heads, s: &StepSeq, tile: Tile, spans: usize, partials: &[f32],
        out: AttnOut) => merge_spans_body
}

#[inline(always)]
fn merge_spans_body<L: Lanes>(
    heads: Heads,
    s: &StepSeq,
    tile: Tile,
    spans: usize,
    partials: &[f32],
    out: AttnOut,
) {
    let hd = heads.head_dim;
    let group = heads.n_q / heads.n_kv.max(1);
    let q_w = heads.n_q * hd;
    let queries = tile.queries(group);
    let part = |span: usize, qi: usize| {
        let at = (span * queries + qi) * (hd + 2);
        (
            partials[at],
            partials[at + 1],
            &partials[at + 2..at + 2 + hd],
        )
    };
    for qi in 0..queries {
        let (i, head) = (tile.first + qi / group, tile.kv_head * group + qi % group);
        // Spans past the query's own position hold nothing for it.
        let own = (s.start_pos + i) / KEY_SPAN + 1;
        let max = (0..own.min(spans)).fold(f32::NEG_INFINITY, |m, j| m.max(part(j, qi).0));
        // SAFETY: one merge per (tile, KV head) writes these heads'
        // columns of these rows, after every span unit has finished.
        let o = unsafe {
            std::slice::from_raw_parts_mut(out.0.add((tile.row + i) * q_w + head * hd), hd)
        };
        o.fill(0.0);
        let mut sum = 0.0;
        for j in 0..own.min(spans) {
            let (m, l, values) = part(j, qi);
            let c = (m - max).exp();
            sum += l * c;
            L::axpy(o, c, values);
        }
        let inv = 1.0 / sum;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

/// The attention output, shared by the units that write disjoint heads.
#[derive(Clone, Copy)]
struct AttnOut(*mut f32);
// SAFETY: units write disjoint elements of a buffer that outlives the call.
unsafe impl Send for AttnOut {}
unsafe impl Sync for AttnOut {}

impl AttnOut {
    /// The same buffer from element `n` on.
    ///
    /// # Safety
    /// `n` is within the buffer.
    unsafe fn at(self, n: usize) -> Self {
        AttnOut(self.0.add(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::F16Bits;
    use crate::model::KvDtype;

    const HEADS: Heads = Heads {
        head_dim: 64,
        n_q: 6,
        n_kv: 2,
    };
    const LAYERS: usize = 2;
    const LAYER: usize = 1;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    }

    /// A cache of `blocks` blocks of random keys and values.
    fn cache(blocks: usize, dtype: KvDtype, seed: &mut u64) -> KvCache {
        let mut kv = KvCache::new(blocks, LAYERS, HEADS.n_kv, HEADS.head_dim, dtype);
        match &mut kv.store {
            KvStore::F32 { k, v } => {
                k.iter_mut()
                    .chain(v.iter_mut())
                    .for_each(|x| *x = lcg(seed));
            }
            KvStore::F16 { k, v } => k
                .iter_mut()
                .chain(v.iter_mut())
                .for_each(|x| *x = F16Bits::store(lcg(seed))),
        }
        kv
    }

    /// A sequence whose blocks are the pool's in reverse (the table, not
    /// the pool's order, says where a position is).
    fn seq(blocks: usize, start_pos: usize, new: usize) -> StepSeq {
        StepSeq {
            blocks: (0..blocks as u32).rev().collect(),
            start_pos,
            tokens: vec![0; new],
            want_logits: true,
            all_logits: false,
            copy_from: None,
        }
    }

    fn stride() -> usize {
        (HEADS.n_q + 2 * HEADS.n_kv) * HEADS.head_dim
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn run(kv: &KvCache, seqs: &[StepSeq], qkv: &[f32], portable: bool) -> Vec<f32> {
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let mut out = vec![f32::NAN; rows * HEADS.n_q * HEADS.head_dim];
        attend_on(HEADS, kv, seqs, LAYER, qkv, stride(), &mut out, portable);
        out
    }

    /// Key (or value) `pos` of `s` at `kv_head`, as stored.
    fn stored(kv: &KvCache, s: &StepSeq, kv_head: usize, pos: usize, values: bool) -> Vec<f64> {
        let hd = HEADS.head_dim;
        let at = kv.base(s.blocks[pos / BLOCK_TOKENS], LAYER, kv_head) + pos % BLOCK_TOKENS * hd;
        let wide = |x: &[f32]| x[at..at + hd].iter().map(|&x| x as f64).collect();
        let half = |x: &[F16Bits]| x[at..at + hd].iter().map(|&x| x.load() as f64).collect();
        match (&kv.store, values) {
            (KvStore::F32 { k, .. }, false) => wide(k),
            (KvStore::F32 { v, .. }, true) => wide(v),
            (KvStore::F16 { k, .. }, false) => half(k),
            (KvStore::F16 { v, .. }, true) => half(v),
        }
    }

    /// Softmax attention of row `i` of `s` at query head `head`, in f64.
    fn reference(kv: &KvCache, s: &StepSeq, qkv: &[f32], i: usize, head: usize) -> Vec<f64> {
        let hd = HEADS.head_dim;
        let kv_head = head / (HEADS.n_q / HEADS.n_kv);
        let q = &qkv[i * stride() + head * hd..][..hd];
        let scores: Vec<f64> = (0..=s.start_pos + i)
            .map(|p| {
                let k = stored(kv, s, kv_head, p, false);
                q.iter().zip(&k).map(|(&a, b)| a as f64 * b).sum::<f64>() / (hd as f64).sqrt()
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let mut o = vec![0.0; hd];
        for (p, w) in e.iter().enumerate() {
            for (o, v) in o.iter_mut().zip(stored(kv, s, kv_head, p, true)) {
                *o += w / sum * v;
            }
        }
        o
    }

    /// Long histories (several key spans, a tile straddling a span's end)
    /// against softmax attention computed in f64, for both KV precisions.
    #[test]
    fn attention_over_several_key_spans_is_softmax_attention() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut seed = 5;
            let kv = cache(48, dtype, &mut seed);
            // 20 new tokens at 500..520 (spans 0, 1 and 2), and a prompt
            // chunk from 0 whose tiles need one span, then two.
            let seqs = [seq(48, 500, 20), seq(48, 0, 300)];
            let qkv: Vec<f32> = (0..320 * stride()).map(|_| lcg(&mut seed)).collect();
            let out = run(&kv, &seqs, &qkv, false);
            let (hd, q_w) = (HEADS.head_dim, HEADS.n_q * HEADS.head_dim);
            let mut worst = 0.0f64;
            for (si, row0) in [(0, 0), (1, 20)] {
                for i in (0..seqs[si].tokens.len()).step_by(7) {
                    for head in 0..HEADS.n_q {
                        let want = reference(&kv, &seqs[si], &qkv[row0 * stride()..], i, head);
                        let got = &out[(row0 + i) * q_w + head * hd..][..hd];
                        for (g, w) in got.iter().zip(&want) {
                            worst = worst.max((*g as f64 - w).abs());
                        }
                    }
                }
            }
            assert!(worst < 1e-4, "{dtype:?}: off by {worst}");
        }
    }

    /// Each token's output is the same bits computed in a tile of a long
    /// chunk, alone as a decode step, on the portable loops and on the
    /// dispatched ones.
    #[test]
    fn a_token_attends_alike_in_a_tile_alone_and_on_every_lane_width() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut seed = 9;
            let kv = cache(48, dtype, &mut seed);
            let chunk = [seq(48, 240, 40)];
            let qkv: Vec<f32> = (0..40 * stride()).map(|_| lcg(&mut seed)).collect();
            let tiled = run(&kv, &chunk, &qkv, false);
            assert_eq!(
                bits(&tiled),
                bits(&run(&kv, &chunk, &qkv, true)),
                "{dtype:?}: portable and dispatched loops differ"
            );
            let q_w = HEADS.n_q * HEADS.head_dim;
            for i in [0, 15, 16, 17, 39] {
                let alone = run(&kv, &[seq(48, 240 + i, 1)], &qkv[i * stride()..], false);
                assert_eq!(
                    bits(&alone),
                    bits(&tiled[i * q_w..(i + 1) * q_w]),
                    "{dtype:?}: token {i} differs alone"
                );
            }
        }
    }
}
