//! The forward pass of one rank: RMSNorm, RoPE, grouped-query attention over
//! a paged KV cache ([`crate::kv`]), and the SwiGLU MLP.
//!
//! The matmuls go through our kernels ([`crate::kernels`]: Q4_1, Q8_0) or
//! candle's quantized ones (other dtypes); everything between them runs on
//! plain `f32` slices. Writing those parts by hand is what lets the
//! model be sharded: a rank owns some heads and some MLP columns, and the two
//! places where partial results meet are calls to [`Collective::all_reduce`].
//!
//! A step processes a batch of sequences at once: their new tokens (one for a
//! decoding sequence, a chunk of the prompt for a prefilling one) are stacked
//! into one activation matrix, so each weight is read once per step for the
//! whole batch. Only attention is per sequence: it is split over the matmul
//! pool by (sequence, query head).

use crate::attention::{self, Heads};
use crate::gguf::ModelConfig;
use crate::kernels::{self, Format, Task, WeightView};
use crate::kv::BLOCK_TOKENS;
use crate::lanes::{self, F16Bits};
use crate::weights::{self, Partition, RankTensors, RawTensor, TensorBytes};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use std::sync::Arc;

/// Why a forward step failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A tensor the plan promised is absent (a bug, or a damaged cache).
    #[error("rank {rank}: tensor `{tensor}` was not loaded")]
    MissingTensor {
        /// The rank.
        rank: usize,
        /// The tensor.
        tensor: String,
    },
    /// A kernel failed.
    #[error("forward pass failed: {0}")]
    Compute(String),
    /// The step names a position its block table does not cover, or a
    /// block outside the pool (a scheduler bug).
    #[error("position {pos} is outside the sequence's KV blocks ({table} block(s) of a pool of {blocks}, context {ctx})")]
    OutOfCache {
        /// The position.
        pos: usize,
        /// Blocks in the sequence's table.
        table: usize,
        /// Blocks in the pool.
        blocks: usize,
        /// Positions the model serves.
        ctx: usize,
    },
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError::Compute(e.to_string())
    }
}

/// Sums partial results across all ranks, leaving the same total on every
/// rank.
pub trait Collective {
    /// The elementwise sum of every rank's `parts`, added from zero in
    /// global part order (rank 0's parts first), so the bits do not depend
    /// on how the parts are spread over ranks.
    fn all_reduce(&self, parts: Vec<Vec<f32>>, len: usize) -> Vec<f32>;
}

/// Adds `parts` into a zeroed buffer of `len`, in order.
pub fn sum_parts<'a>(parts: impl IntoIterator<Item = &'a Vec<f32>>, len: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; len];
    for p in parts {
        for (a, b) in out.iter_mut().zip(p) {
            *a += b;
        }
    }
    out
}

/// The single-rank case: the parts are all here.
pub struct Solo;

impl Collective for Solo {
    fn all_reduce(&self, parts: Vec<Vec<f32>>, len: usize) -> Vec<f32> {
        sum_parts(&parts, len)
    }
}

/// One sequence's share of a step.
#[derive(Debug, Clone)]
pub struct StepSeq {
    /// The sequence's KV blocks: position `p` is in `blocks[p / BLOCK_TOKENS]`;
    /// they cover every position up to the end of `tokens`.
    pub blocks: Vec<u32>,
    /// Position of the first token in `tokens`.
    pub start_pos: usize,
    /// New tokens (the next prompt chunk, or the last sampled token).
    pub tokens: Vec<u32>,
    /// Whether to compute logits for the last token.
    pub want_logits: bool,
    /// Whether to compute logits for every token of `tokens` (the prompt's
    /// log-probabilities): the LM head then runs on each row, not only the
    /// last.
    pub all_logits: bool,
    /// A block whose first `start_pos % BLOCK_TOKENS` positions the block of
    /// `start_pos` starts as a copy of (a prefix-cache hit inside a block,
    /// copied before the step).
    pub copy_from: Option<u32>,
}

impl StepSeq {
    /// How many rows of logits the step returns for this sequence.
    pub fn logit_rows(&self) -> usize {
        if self.all_logits {
            self.tokens.len()
        } else {
            usize::from(self.want_logits)
        }
    }
}

/// A linear layer `y = x Wᵀ` with `W` of shape `(out, in)`.
struct Linear {
    kind: LinearKind,
    out: usize,
    inp: usize,
}

enum LinearKind {
    /// candle's quantized matmul (F16, K-quants, ...).
    Candle(QMatMul),
    /// Our kernels over the loaded bytes (a column range of them).
    Quant {
        format: Format,
        bytes: Arc<TensorBytes>,
        /// Input width of the whole stored tensor.
        width: usize,
        cols: std::ops::Range<usize>,
    },
}

/// The formats our kernels take.
fn kernel_format(t: &RawTensor) -> Option<Format> {
    match (t.dtype, t.interleaved) {
        (GgmlDType::Q4_1, true) => Some(Format::Q4_1x8),
        (GgmlDType::Q4_1, false) => Some(Format::Q4_1),
        (GgmlDType::Q8_0, true) => Some(Format::Q8_0x8),
        (GgmlDType::Q8_0, false) => Some(Format::Q8_0),
        _ => None,
    }
}

impl Linear {
    fn new(t: RawTensor) -> Result<Self, ModelError> {
        let (_, width) = dims2(&t)?;
        Self::cols(t, 0..width)
    }

    /// Columns `cols` (block-aligned) of `t`: a view for our kernels' formats,
    /// a copy for candle's.
    fn cols(t: RawTensor, cols: std::ops::Range<usize>) -> Result<Self, ModelError> {
        let (out, width) = dims2(&t)?;
        if let Some(format) = kernel_format(&t) {
            if WeightView::cols(format, t.bytes.as_slice(), out, width, cols.clone()).is_none() {
                return Err(ModelError::Compute(format!(
                    "{format:?} tensor of shape {:?} cannot be cut at columns {cols:?}",
                    t.shape
                )));
            }
            return Ok(Self {
                inp: cols.len(),
                kind: LinearKind::Quant {
                    format,
                    bytes: t.bytes,
                    width,
                    cols,
                },
                out,
            });
        }
        let q = t.to_qtensor()?;
        if cols == (0..width) {
            Self::shared(Arc::new(q))
        } else {
            Self::shared(Arc::new(weights::slice_cols(&q, cols)?))
        }
    }

    fn shared(t: Arc<QTensor>) -> Result<Self, ModelError> {
        let (out, inp) = t.shape().dims2()?;
        Ok(Self {
            kind: LinearKind::Candle(QMatMul::from_arc(t)?),
            out,
            inp,
        })
    }

    /// The kernel view, for our formats.
    fn view(&self) -> Result<Option<WeightView<'_>>, ModelError> {
        match &self.kind {
            LinearKind::Candle(_) => Ok(None),
            LinearKind::Quant {
                format,
                bytes,
                width,
                cols,
            } => WeightView::cols(*format, bytes.as_slice(), self.out, *width, cols.clone())
                .map(Some)
                .ok_or_else(|| ModelError::Compute("weight view out of bounds".into())),
        }
    }

    /// `x` holds `rows` rows of `inp` values; returns `rows` rows of `out`.
    fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, ModelError> {
        debug_assert_eq!(x.len(), rows * self.inp);
        match (&self.kind, self.view()?) {
            (_, Some(view)) => {
                let mut y = vec![0.0f32; rows * self.out];
                kernels::matmul(&view, x, rows, &mut y);
                Ok(y)
            }
            (LinearKind::Candle(mm), None) => {
                let t = Tensor::from_slice(x, (rows, self.inp), &Device::Cpu)?;
                Ok(mm.forward(&t)?.flatten_all()?.to_vec1::<f32>()?)
            }
            (LinearKind::Quant { .. }, None) => {
                Err(ModelError::Compute("weight view missing".into()))
            }
        }
    }
}

/// The token embedding: rows looked up in place for our kernels' formats.
enum Embedding {
    Quant(Linear),
    Candle(Arc<QTensor>),
}

fn dims2(t: &RawTensor) -> Result<(usize, usize), ModelError> {
    match t.shape.as_slice() {
        &[rows, cols] => Ok((rows, cols)),
        other => Err(ModelError::Compute(format!(
            "expected a matrix, got shape {other:?}"
        ))),
    }
}

/// Several linears over the same input whose outputs are used side by side
/// (Q/K/V, gate/up): one fused tensor when the cache stored them fused.
struct Projection {
    parts: Vec<Linear>,
    out: usize,
}

impl Projection {
    fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, ModelError> {
        if let [one] = self.parts.as_slice() {
            return one.forward(x, rows);
        }
        let outs = self
            .parts
            .iter()
            .map(|l| l.forward(x, rows))
            .collect::<Result<Vec<_>, _>>()?;
        let mut y = Vec::with_capacity(rows * self.out);
        for r in 0..rows {
            for (l, o) in self.parts.iter().zip(&outs) {
                y.extend_from_slice(&o[r * l.out..(r + 1) * l.out]);
            }
        }
        Ok(y)
    }
}

/// A row-parallel linear cut into reduction parts by input columns
/// (see [`crate::weights::ReductionPart`]).
struct RowParallel {
    parts: Vec<(std::ops::Range<usize>, Linear)>,
    inp: usize,
    out: usize,
}

impl RowParallel {
    fn new(t: RawTensor, cols: Vec<std::ops::Range<usize>>) -> Result<Self, ModelError> {
        let (out, inp) = dims2(&t)?;
        let parts = if cols.len() == 1 {
            vec![(0..inp, Linear::new(t)?)]
        } else {
            cols.into_iter()
                .map(|c| Ok((c.clone(), Linear::cols(t.clone(), c)?)))
                .collect::<Result<Vec<_>, ModelError>>()?
        };
        Ok(Self { parts, inp, out })
    }

    /// The partial products of each part.
    fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<Vec<f32>>, ModelError> {
        if let [(_, one)] = self.parts.as_slice() {
            return Ok(vec![one.forward(x, rows)?]);
        }
        let views = self
            .parts
            .iter()
            .map(|(_, l)| l.view())
            .collect::<Result<Option<Vec<_>>, _>>()?;
        if let Some(views) = views {
            // One quantization of x and one parallel region for all parts.
            let mut outs: Vec<Vec<f32>> = views.iter().map(|v| vec![0.0; rows * v.n]).collect();
            let mut tasks: Vec<Task<'_>> = views
                .into_iter()
                .zip(outs.iter_mut())
                .zip(&self.parts)
                .map(|((w, out), (cols, _))| Task {
                    w,
                    col: cols.start,
                    out,
                })
                .collect();
            kernels::matmul_fused(x, rows, self.inp, &mut tasks);
            drop(tasks);
            return Ok(outs);
        }
        self.parts
            .iter()
            .map(|(cols, lin)| {
                let mut xs = Vec::with_capacity(rows * cols.len());
                for r in 0..rows {
                    xs.extend_from_slice(&x[r * self.inp + cols.start..r * self.inp + cols.end]);
                }
                lin.forward(&xs, rows)
            })
            .collect()
    }
}

struct Block {
    attn_norm: Vec<f32>,
    qkv: Projection,
    wo: RowParallel,
    ffn_norm: Vec<f32>,
    gate_up: Projection,
    down: RowParallel,
}

/// Key/value storage precision (`TTW_KV_F16` halves the memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit floats.
    F32,
    /// 16-bit floats.
    F16,
}

/// Keys and values of every block, laid out
/// `[block][layer][kv_head][pos in block][dim]` so one head's positions in a
/// block are contiguous. Allocated zeroed (`calloc`: f16 is kept as its bit
/// pattern so the zero fill needs no writes): a block's pages become
/// resident when it is first written, so memory grows with the blocks
/// actually used, up to the budget.
pub(crate) enum KvStore {
    F32 { k: Vec<f32>, v: Vec<f32> },
    F16 { k: Vec<F16Bits>, v: Vec<F16Bits> },
}

/// Zeroed without touching the pages: `vec![0; n]` of a primitive is a
/// `calloc`.
fn zeroed_f16(n: usize) -> Vec<F16Bits> {
    let bits = vec![0u16; n];
    let mut bits = std::mem::ManuallyDrop::new(bits);
    let (ptr, len, cap) = (bits.as_mut_ptr(), bits.len(), bits.capacity());
    // SAFETY: F16Bits is repr(transparent) over u16: same size, alignment
    // and validity; the allocation moves to the new Vec unchanged.
    unsafe { Vec::from_raw_parts(ptr.cast::<F16Bits>(), len, cap) }
}

pub(crate) struct KvCache {
    pub(crate) store: KvStore,
    blocks: usize,
    layers: usize,
    heads: usize,
    dim: usize,
}

impl KvCache {
    pub(crate) fn new(
        blocks: usize,
        layers: usize,
        heads: usize,
        dim: usize,
        dtype: KvDtype,
    ) -> Self {
        let n = blocks * layers * heads * BLOCK_TOKENS * dim;
        let store = match dtype {
            KvDtype::F32 => KvStore::F32 {
                k: vec![0.0; n],
                v: vec![0.0; n],
            },
            KvDtype::F16 => KvStore::F16 {
                k: zeroed_f16(n),
                v: zeroed_f16(n),
            },
        };
        Self {
            store,
            blocks,
            layers,
            heads,
            dim,
        }
    }

    /// Writes one zero per page of the pool, so every page is resident (and
    /// charged to the process's memory cgroup) now rather than when a block
    /// is first used. Returns the bytes made resident.
    fn prefault(&mut self) -> usize {
        fn touch<T: Copy + Default>(v: &mut [T]) -> usize {
            let per_page = (4096 / std::mem::size_of::<T>()).max(1);
            for i in (0..v.len()).step_by(per_page) {
                // Volatile: a plain store of the zero the page already reads
                // as could be dropped by the optimiser (calloc is known to it).
                // SAFETY: i < v.len(), so the pointer is in bounds and aligned.
                unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), T::default()) };
            }
            std::mem::size_of_val(v)
        }
        match &mut self.store {
            KvStore::F32 { k, v } => touch(k) + touch(v),
            KvStore::F16 { k, v } => touch(k) + touch(v),
        }
    }

    /// Copies positions `0..n` of block `from` (every layer and head) into
    /// block `to`.
    fn copy_positions(&mut self, from: u32, to: u32, n: usize) {
        fn copy<T: Copy>(x: &mut [T], from: usize, to: usize, n: usize) {
            x.copy_within(from..from + n, to);
        }
        let n = n.min(BLOCK_TOKENS) * self.dim;
        for layer in 0..self.layers {
            for head in 0..self.heads {
                let (a, b) = (self.base(from, layer, head), self.base(to, layer, head));
                match &mut self.store {
                    KvStore::F32 { k, v } => {
                        copy(k, a, b, n);
                        copy(v, a, b, n);
                    }
                    KvStore::F16 { k, v } => {
                        copy(k, a, b, n);
                        copy(v, a, b, n);
                    }
                }
            }
        }
    }

    /// Offset of `(block, layer, head)`'s first position.
    pub(crate) fn base(&self, block: u32, layer: usize, head: usize) -> usize {
        (((block as usize * self.layers + layer) * self.heads + head) * BLOCK_TOKENS) * self.dim
    }
}

/// Bytes of keys and values one block holds for `kv_heads` heads (of every
/// rank together, when given the model's total).
pub fn block_bytes(layers: usize, kv_heads: usize, head_dim: usize, dtype: KvDtype) -> usize {
    let elem = match dtype {
        KvDtype::F32 => 4,
        KvDtype::F16 => 2,
    };
    2 * layers * kv_heads * BLOCK_TOKENS * head_dim * elem
}

/// Precomputed RoPE rotations for every position.
pub struct Rope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl Rope {
    /// Tables for `ctx` positions of heads of width `head_dim`.
    pub fn new(head_dim: usize, ctx: usize, theta: f32) -> Self {
        let half = head_dim / 2;
        let freqs: Vec<f64> = (0..half)
            .map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64))
            .collect();
        let mut cos = Vec::with_capacity(ctx * half);
        let mut sin = Vec::with_capacity(ctx * half);
        for pos in 0..ctx {
            for &freq in &freqs {
                let (s, c) = (pos as f64 * freq).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        Self { cos, sin, half }
    }

    /// Rotates one head in place. GGUF Llama checkpoints were permuted at
    /// conversion so that RoPE rotates adjacent pairs `(x[2i], x[2i+1])`.
    #[inline]
    fn apply(&self, x: &mut [f32], pos: usize) {
        let c = &self.cos[pos * self.half..(pos + 1) * self.half];
        let s = &self.sin[pos * self.half..(pos + 1) * self.half];
        for i in 0..self.half {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = a * c[i] - b * s[i];
            x[2 * i + 1] = a * s[i] + b * c[i];
        }
    }
}

/// Everything one rank needs to run its share of the model.
pub struct Rank {
    cfg: ModelConfig,
    part: Partition,
    embed: Embedding,
    lm_head: Linear,
    output_norm: Vec<f32>,
    blocks: Vec<Block>,
    kv: KvCache,
    /// Positions served (the RoPE table's length).
    ctx: usize,
    rope: Arc<Rope>,
    n_q: usize,
    n_kv: usize,
}

fn take(t: &mut RankTensors, rank: usize, name: &str) -> Result<RawTensor, ModelError> {
    t.remove(name).ok_or_else(|| ModelError::MissingTensor {
        rank,
        tensor: name.into(),
    })
}

fn projection(
    t: &mut RankTensors,
    rank: usize,
    fused: &str,
    separate: &[&str],
) -> Result<Projection, ModelError> {
    let parts = if t.contains_key(fused) {
        vec![Linear::new(take(t, rank, fused)?)?]
    } else {
        separate
            .iter()
            .map(|n| take(t, rank, n).and_then(Linear::new))
            .collect::<Result<Vec<_>, _>>()?
    };
    let out = parts.iter().map(|l| l.out).sum();
    Ok(Projection { parts, out })
}

impl Rank {
    fn heads(&self) -> Heads {
        Heads {
            head_dim: self.cfg.head_dim,
            n_q: self.n_q,
            n_kv: self.n_kv,
        }
    }

    /// Makes the rank's whole KV pool resident now (`--kv-prefault`);
    /// returns its bytes.
    pub fn prefault_kv(&mut self) -> usize {
        self.kv.prefault()
    }

    /// Test fault `TTW_FAULT_EARLY_EXIT`: drops the last quarter of the
    /// layers, so every step is cheaper and every answer worse (the shape
    /// of a speed trick that breaks numerics); returns the layers kept.
    pub fn exit_early(&mut self) -> usize {
        let keep = (self.blocks.len() * 3 / 4).max(1);
        self.blocks.truncate(keep);
        keep
    }

    /// Builds a rank from its loaded tensors, with a KV pool of `kv_blocks`
    /// blocks, serving positions up to `ctx`.
    pub fn new(
        cfg: &ModelConfig,
        part: Partition,
        mut t: RankTensors,
        kv_blocks: usize,
        ctx: usize,
        kv_dtype: KvDtype,
        rope: Arc<Rope>,
    ) -> Result<Self, ModelError> {
        let r = part.rank;
        let mut blocks = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            blocks.push(Block {
                attn_norm: weights::vector(&take(&mut t, r, &n("attn_norm"))?)?,
                qkv: projection(
                    &mut t,
                    r,
                    &n("attn_qkv"),
                    &[&n("attn_q"), &n("attn_k"), &n("attn_v")],
                )?,
                wo: RowParallel::new(
                    take(&mut t, r, &n("attn_output"))?,
                    part.parts.iter().map(|p| p.attn_cols.clone()).collect(),
                )?,
                ffn_norm: weights::vector(&take(&mut t, r, &n("ffn_norm"))?)?,
                gate_up: projection(
                    &mut t,
                    r,
                    &n("ffn_gate_up"),
                    &[&n("ffn_gate"), &n("ffn_up")],
                )?,
                down: RowParallel::new(
                    take(&mut t, r, &n("ffn_down"))?,
                    part.parts.iter().map(|p| p.ffn_cols.clone()).collect(),
                )?,
            });
        }
        let embed_raw = take(&mut t, r, "token_embd.weight")?;
        let embed = if kernel_format(&embed_raw).is_some() {
            Embedding::Quant(Linear::new(embed_raw.clone())?)
        } else {
            Embedding::Candle(Arc::new(embed_raw.to_qtensor()?))
        };
        // A tied LM head reads the same rows: share them rather than hold a
        // second copy of the largest tensor.
        let lm_head = match (&embed, cfg.tied_embeddings) {
            (Embedding::Candle(q), true) => Linear::shared(q.clone())?,
            (Embedding::Quant(_), true) => Linear::new(embed_raw)?,
            (_, false) => Linear::new(take(&mut t, r, "output.weight")?)?,
        };
        let n_q = part.q_heads.len();
        let n_kv = part.kv_heads.len();
        Ok(Self {
            cfg: cfg.clone(),
            embed,
            lm_head,
            output_norm: weights::vector(&take(&mut t, r, "output_norm.weight")?)?,
            blocks,
            kv: KvCache::new(kv_blocks, cfg.n_layers, n_kv, cfg.head_dim, kv_dtype),
            ctx,
            rope,
            n_q,
            n_kv,
            part,
        })
    }

    /// This rank's vocabulary rows (its slice of every logits row).
    pub fn vocab(&self) -> std::ops::Range<usize> {
        self.part.vocab.clone()
    }

    /// Runs one step. Returns, for every sequence, its
    /// [`StepSeq::logit_rows`] rows of logits (the last token's, or every
    /// token's) over this rank's vocabulary, row after row.
    pub fn step(
        &mut self,
        seqs: &[StepSeq],
        comm: &dyn Collective,
    ) -> Result<Vec<f32>, ModelError> {
        let h = self.cfg.hidden;
        let hd = self.cfg.head_dim;
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        for s in seqs {
            let end = s.start_pos + s.tokens.len();
            let covered = s.blocks.len() * BLOCK_TOKENS;
            let bad_block = s.blocks.iter().any(|&b| b as usize >= self.kv.blocks);
            let bad_copy = s.copy_from.is_some_and(|b| {
                b as usize >= self.kv.blocks || s.start_pos / BLOCK_TOKENS >= s.blocks.len()
            });
            if end > covered || end > self.ctx || bad_block || bad_copy {
                return Err(ModelError::OutOfCache {
                    pos: end,
                    table: s.blocks.len(),
                    blocks: self.kv.blocks,
                    ctx: self.ctx,
                });
            }
        }
        for s in seqs {
            let to = s.blocks.get(s.start_pos / BLOCK_TOKENS);
            if let (Some(from), Some(&to)) = (s.copy_from, to) {
                self.kv.copy_positions(from, to, s.start_pos % BLOCK_TOKENS);
            }
        }

        let x = self.embed_tokens(seqs)?;
        let mut x = comm.all_reduce(vec![x], rows * h);

        let q_w = self.n_q * hd;
        let kv_w = self.n_kv * hd;
        let mut normed = vec![0.0f32; rows * h];
        let mut attn = vec![0.0f32; rows * q_w];
        for l in 0..self.blocks.len() {
            let block = &self.blocks[l];
            lanes::rms_norm(&x, &block.attn_norm, self.cfg.rms_eps, &mut normed);
            let mut qkv = block.qkv.forward(&normed, rows)?;
            let stride = q_w + 2 * kv_w;
            let mut row = 0;
            for s in seqs {
                for (i, _) in s.tokens.iter().enumerate() {
                    let pos = s.start_pos + i;
                    let r = &mut qkv[(row + i) * stride..(row + i + 1) * stride];
                    for head in r[..q_w + kv_w].chunks_exact_mut(hd) {
                        self.rope.apply(head, pos);
                    }
                    let block = s.blocks[pos / BLOCK_TOKENS];
                    let at = pos % BLOCK_TOKENS;
                    self.store_kv(block, l, at, &r[q_w..q_w + kv_w], &r[q_w + kv_w..]);
                }
                row += s.tokens.len();
            }
            attention::attend(self.heads(), &self.kv, seqs, l, &qkv, stride, &mut attn);
            let block = &self.blocks[l];
            let o = comm.all_reduce(block.wo.forward(&attn, rows)?, rows * block.wo.out);
            lanes::add_into(&mut x, &o);

            lanes::rms_norm(&x, &block.ffn_norm, self.cfg.rms_eps, &mut normed);
            let gu = block.gate_up.forward(&normed, rows)?;
            let ff = block.gate_up.out / 2;
            let mut act = vec![0.0f32; rows * ff];
            let swiglu = |r: usize, out: &mut [f32]| {
                let g = &gu[r * 2 * ff..r * 2 * ff + ff];
                let u = &gu[r * 2 * ff + ff..(r + 1) * 2 * ff];
                lanes::swiglu(g, u, out);
            };
            // Rows over the pool when there are several (a batch): the
            // exponentials are a serial stretch the helpers would spin
            // through. Each element is computed alike either way.
            if rows > 1 {
                crate::pool::global().for_each_chunk_mut(&mut act, ff, &swiglu);
            } else {
                for (r, out) in act.chunks_exact_mut(ff).enumerate() {
                    swiglu(r, out);
                }
            }
            let d = comm.all_reduce(block.down.forward(&act, rows)?, rows * block.down.out);
            lanes::add_into(&mut x, &d);
        }

        // Only the last token of each sequence that samples needs logits,
        // unless the prompt's log-probabilities are asked for.
        let mut last = Vec::new();
        let mut row = 0;
        for s in seqs {
            row += s.tokens.len();
            let rows = s.logit_rows();
            last.extend_from_slice(&x[(row - rows) * h..row * h]);
        }
        if last.is_empty() {
            return Ok(Vec::new());
        }
        let n = last.len() / h;
        let mut normed = vec![0.0f32; last.len()];
        lanes::rms_norm(&last, &self.output_norm, self.cfg.rms_eps, &mut normed);
        self.lm_head.forward(&normed, n)
    }

    /// Embedding rows of the tokens this rank's vocabulary shard holds, zero
    /// for the others: the all-reduce that follows completes every row.
    fn embed_tokens(&self, seqs: &[StepSeq]) -> Result<Vec<f32>, ModelError> {
        let h = self.cfg.hidden;
        let vocab = &self.part.vocab;
        let tokens: Vec<u32> = seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        let local: Vec<u32> = tokens
            .iter()
            .filter(|&&t| vocab.contains(&(t as usize)))
            .map(|&t| (t as usize - vocab.start) as u32)
            .collect();
        let mut x = vec![0.0f32; tokens.len() * h];
        if local.is_empty() {
            return Ok(x);
        }
        let rows = match &self.embed {
            Embedding::Quant(lin) => {
                let view = lin
                    .view()?
                    .ok_or_else(|| ModelError::Compute("embedding view missing".into()))?;
                let mut rows = vec![0.0f32; local.len() * h];
                for (&id, row) in local.iter().zip(rows.chunks_exact_mut(h)) {
                    if id as usize >= view.n {
                        return Err(ModelError::Compute(format!(
                            "token {id} outside the embedding's {} rows",
                            view.n
                        )));
                    }
                    view.dequantize_row(id as usize, row);
                }
                rows
            }
            Embedding::Candle(q) => {
                let ids = Tensor::new(local.as_slice(), &Device::Cpu)?;
                q.embedding(&ids)?.flatten_all()?.to_vec1::<f32>()?
            }
        };
        let mut next = 0;
        for (i, &t) in tokens.iter().enumerate() {
            if vocab.contains(&(t as usize)) {
                x[i * h..(i + 1) * h].copy_from_slice(&rows[next * h..(next + 1) * h]);
                next += 1;
            }
        }
        Ok(x)
    }

    /// Writes one position's keys and values (`at` within `block`).
    fn store_kv(&mut self, block: u32, layer: usize, at: usize, k: &[f32], v: &[f32]) {
        let dim = self.kv.dim;
        for head in 0..self.n_kv {
            let at = self.kv.base(block, layer, head) + at * dim;
            let (ks, vs) = (
                &k[head * dim..(head + 1) * dim],
                &v[head * dim..(head + 1) * dim],
            );
            match &mut self.kv.store {
                KvStore::F32 { k, v } => {
                    k[at..at + dim].copy_from_slice(ks);
                    v[at..at + dim].copy_from_slice(vs);
                }
                KvStore::F16 { k, v } => {
                    lanes::store_row(&mut k[at..at + dim], ks);
                    lanes::store_row(&mut v[at..at + dim], vs);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let rope = Rope::new(8, 16, 10_000.0);
        let orig = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut x = orig;
        rope.apply(&mut x, 0);
        assert_eq!(x, orig);
        rope.apply(&mut x, 7);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3, "{n0} vs {n1}");
        assert_ne!(x, orig);
    }

    #[test]
    fn rms_norm_scales_rows_to_unit_rms() {
        let x = [3.0, 4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        lanes::rms_norm(&x, &[1.0, 1.0], 1e-6, &mut out);
        let rms = (12.5f32 + 1e-6).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6);
        assert!((out[1] - 4.0 / rms).abs() < 1e-6);
        assert_eq!(&out[2..], &[0.0, 0.0]);
    }
}
