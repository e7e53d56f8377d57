//! The shard plan and the load: which tensors each rank holds, in which
//! dtype and layout, and getting them into memory through the tensor cache.
//!
//! Sharding follows Megatron-style tensor parallelism so that each block needs
//! exactly two all-reduces:
//! - attention is split by whole KV-head groups: a rank owns some KV heads and
//!   every query head that reads them (uneven counts are fine), so Q, K and V
//!   are split by output rows and the output projection by input columns;
//! - the MLP is split by intermediate columns: gate and up by rows, down by
//!   columns;
//! - the embedding (and an untied LM head) is split by vocabulary rows; the
//!   embedding lookup is finished by an all-reduce, the logits by a gather.
//!
//! Q/K/V (and gate/up) of one rank are stored fused in one tensor when they
//! share a dtype, so a decode step quantizes its activations once per fused
//! matmul instead of once per projection.

use crate::cache::{self, CacheError, CacheMode};
use crate::gguf::{Checkpoint, GgufError, ModelConfig};
use crate::kernels;
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;
use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

/// Why the weights could not be planned or loaded.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The checkpoint lacks something.
    #[error(transparent)]
    Checkpoint(#[from] GgufError),
    /// The cache could not be read or written.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The model cannot be split this way.
    #[error("cannot shard the model for TP={tp}: {reason}")]
    Shard {
        /// The requested degree.
        tp: usize,
        /// Why not.
        reason: String,
    },
    /// A tensor could not be converted or constructed.
    #[error("tensor `{tensor}`: {message}")]
    Tensor {
        /// The tensor.
        tensor: String,
        /// What failed.
        message: String,
    },
}

/// Choices that change the stored dtype of some tensors, and so the files
/// (and the cache variant).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DtypePolicy {
    /// `TTW_MLP_DOWN_Q8`: store the MLP down projection as Q8_0.
    pub mlp_down_q8: bool,
}

/// How a shard was cut from its source tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every rank holds the whole tensor.
    Replicated,
    /// Split by output rows (column-parallel linear, vocabulary rows).
    RowShard,
    /// Split by input columns (row-parallel linear, followed by an
    /// all-reduce).
    ColShard,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Replicated => "REPLICATED",
            Layout::RowShard => "ROWSHARD",
            Layout::ColShard => "COLSHARD",
        }
    }
}

/// A piece of a checkpoint tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// Checkpoint tensor name.
    pub source: String,
    /// Rows taken.
    pub rows: Range<usize>,
    /// Columns taken (the whole row for 1-D tensors).
    pub cols: Range<usize>,
}

/// One tensor of one rank: what it is made of and how it is stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardSpec {
    /// Name the ranks look it up by (`blk.3.attn_qkv.weight`).
    pub tensor: String,
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Rank holding it.
    pub rank: usize,
    /// How it was cut.
    pub layout: Layout,
    /// Stored dtype.
    pub dtype: GgmlDType,
    /// Stored shape (rows first).
    pub shape: Vec<usize>,
    /// Sources, concatenated along rows.
    pub parts: Vec<Part>,
    /// Stored interleaved by 8 rows for the kernels
    /// ([`crate::kernels::Format::Q4_1x8`], [`crate::kernels::Format::Q8_0x8`]);
    /// `_X8` in the layout name.
    pub interleaved: bool,
}

impl ShardSpec {
    /// The cache file name: tensor, TP, rank, dtype and layout.
    pub fn file_name(&self) -> String {
        format!(
            "{}_tp{}_rank{}_dtype_{}_layout_{}{}.tensorbin",
            self.tensor,
            self.tp,
            self.rank,
            cache::dtype_name(self.dtype),
            self.layout.name(),
            if self.interleaved { "_X8" } else { "" }
        )
    }
}

/// Whether a shard is stored interleaved by 8 rows: every Q4_1 or Q8_0
/// matrix whose rows come in whole groups of 8 (the others use the plain
/// layout, which the kernels compute to the same bits, only slower).
fn interleave(dtype: GgmlDType, shape: &[usize]) -> bool {
    matches!(dtype, GgmlDType::Q4_1 | GgmlDType::Q8_0)
        && shape.len() == 2
        && shape[0].is_multiple_of(kernels::X8)
}

/// What one rank owns.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    /// This rank.
    pub rank: usize,
    /// Query heads (global indices).
    pub q_heads: Range<usize>,
    /// KV heads (global indices).
    pub kv_heads: Range<usize>,
    /// MLP intermediate columns.
    pub ffn: Range<usize>,
    /// Vocabulary rows of the embedding and LM head.
    pub vocab: Range<usize>,
    /// The reduction parts this rank computes, in global order.
    pub parts: Vec<ReductionPart>,
}

/// A fixed slice of the row-parallel layers whose partial result is summed
/// with the others in one global order.
///
/// Floating-point addition is not associative, and the quantized matmuls
/// quantize their inputs, so a rounding difference in one layer can flip a
/// later quantization step and change a greedy token. To make TP=2 produce
/// the same bits as TP=1, both compute the attention-output and MLP-down
/// projections as the same [`REDUCTION_PARTS`] partial matmuls and add them
/// in the same order: at TP=1 one rank computes every part, at TP=2 each
/// rank computes its own and the all-reduce adds them in part order.
#[derive(Debug, Clone, PartialEq)]
pub struct ReductionPart {
    /// Attention-output input columns, relative to the rank's shard.
    pub attn_cols: Range<usize>,
    /// MLP-down input columns, relative to the rank's shard.
    pub ffn_cols: Range<usize>,
}

/// Parts the row-parallel layers are cut into at TP=1 and TP=2, so both
/// sum the same partials in the same order (higher TP uses one per rank).
pub const REDUCTION_PARTS: usize = 2;

fn even_split(n: usize, tp: usize, rank: usize) -> Range<usize> {
    n * rank / tp..n * (rank + 1) / tp
}

/// Splits the model for `tp` ranks. `ffn_unit` is the granularity of the
/// intermediate split (the block size of the down projection's dtype, so
/// every column shard starts on a block boundary).
pub fn partition(
    cfg: &ModelConfig,
    tp: usize,
    ffn_unit: usize,
) -> Result<Vec<Partition>, WeightsError> {
    let err = |reason: String| WeightsError::Shard { tp, reason };
    if tp == 0 {
        return Err(err("TP must be at least 1".into()));
    }
    if tp > cfg.n_kv_heads {
        return Err(err(format!(
            "the model has {} KV heads and attention is split by whole KV-head groups",
            cfg.n_kv_heads
        )));
    }
    if !cfg.intermediate.is_multiple_of(ffn_unit) || cfg.intermediate / ffn_unit < tp {
        return Err(err(format!(
            "the MLP width {} does not split into {tp} shards of {ffn_unit}-column blocks",
            cfg.intermediate
        )));
    }
    let group = cfg.n_heads / cfg.n_kv_heads;
    let hd = cfg.head_dim;
    // Canonical parts: whole KV-head groups and whole MLP blocks; a rank
    // owns a contiguous run of them.
    let n_parts = REDUCTION_PARTS.max(tp).min(cfg.n_kv_heads);
    let units = cfg.intermediate / ffn_unit;
    let part_kv = |p: usize| even_split(cfg.n_kv_heads, n_parts, p);
    let part_ffn = |p: usize| {
        let u = even_split(units, n_parts, p);
        u.start * ffn_unit..u.end * ffn_unit
    };
    Ok((0..tp)
        .map(|rank| {
            let owned = even_split(n_parts, tp, rank);
            let kv = part_kv(owned.start).start..part_kv(owned.end - 1).end;
            let ffn = part_ffn(owned.start).start..part_ffn(owned.end - 1).end;
            let parts = owned
                .map(|p| {
                    let (k, f) = (part_kv(p), part_ffn(p));
                    ReductionPart {
                        attn_cols: (k.start - kv.start) * group * hd
                            ..(k.end - kv.start) * group * hd,
                        ffn_cols: f.start - ffn.start..f.end - ffn.start,
                    }
                })
                .collect();
            Partition {
                rank,
                q_heads: kv.start * group..kv.end * group,
                kv_heads: kv,
                ffn,
                vocab: even_split(cfg.vocab, tp, rank),
                parts,
            }
        })
        .collect())
}

/// The columns `cols` of a 2-D quantized tensor, as a new tensor (the
/// columns must start and end on block boundaries).
pub fn slice_cols(t: &QTensor, cols: Range<usize>) -> candle_core::Result<QTensor> {
    let (rows, width) = t.shape().dims2()?;
    if cols == (0..width) {
        return qtensor(&t.data()?, t.dtype(), &[rows, width]);
    }
    let (bs, ts) = (t.dtype().block_size(), t.dtype().type_size());
    let data = t.data()?;
    let row_bytes = width / bs * ts;
    let (c0, c1) = (cols.start / bs * ts, cols.end / bs * ts);
    let mut out = AlignedBytes::zeroed(rows * (c1 - c0));
    for (r, dst) in out.as_mut_slice().chunks_exact_mut(c1 - c0).enumerate() {
        dst.copy_from_slice(&data[r * row_bytes + c0..r * row_bytes + c1]);
    }
    qtensor(out.as_slice(), t.dtype(), &[rows, cols.len()])
}

/// The full shard plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// What each rank owns.
    pub partitions: Vec<Partition>,
    /// One list of specs per rank, in load order.
    pub specs: Vec<Vec<ShardSpec>>,
}

/// Plans every rank's tensors for `tp` ranks under `policy`.
pub fn plan(ckpt: &Checkpoint, tp: usize, policy: DtypePolicy) -> Result<Plan, WeightsError> {
    let cfg = &ckpt.config;
    let down_dtype = |l: usize| -> Result<GgmlDType, WeightsError> {
        if policy.mlp_down_q8 {
            Ok(GgmlDType::Q8_0)
        } else {
            Ok(ckpt.entry(&format!("blk.{l}.ffn_down.weight"))?.dtype)
        }
    };
    let ffn_unit = (0..cfg.n_layers)
        .map(|l| down_dtype(l).map(|d| d.block_size()))
        .try_fold(1usize, |acc, b| b.map(|b| acc.max(b)))?;
    let parts = partition(cfg, tp, ffn_unit)?;
    let hd = cfg.head_dim;
    let mut out = Vec::with_capacity(tp);
    for p in &parts {
        let mut specs = Vec::new();
        let mut push = |tensor: &str,
                        layout: Layout,
                        dtype: GgmlDType,
                        pieces: Vec<Part>|
         -> Result<(), WeightsError> {
            specs.push(make_spec(ckpt, tensor, tp, p.rank, layout, dtype, pieces)?);
            Ok(())
        };
        let whole = |name: &str| -> Result<Part, WeightsError> {
            let e = ckpt.entry(name)?;
            Ok(Part {
                source: name.into(),
                rows: 0..e.shape[0],
                cols: 0..*e.shape.get(1).unwrap_or(&1),
            })
        };
        let rows = |name: &str, r: Range<usize>| -> Result<Part, WeightsError> {
            let e = ckpt.entry(name)?;
            Ok(Part {
                source: name.into(),
                rows: r,
                cols: 0..*e.shape.get(1).unwrap_or(&1),
            })
        };
        let cols = |name: &str, c: Range<usize>| -> Result<Part, WeightsError> {
            let e = ckpt.entry(name)?;
            Ok(Part {
                source: name.into(),
                rows: 0..e.shape[0],
                cols: c,
            })
        };
        let dt = |name: &str| -> Result<GgmlDType, WeightsError> { Ok(ckpt.entry(name)?.dtype) };

        push(
            "token_embd.weight",
            Layout::RowShard,
            dt("token_embd.weight")?,
            vec![rows("token_embd.weight", p.vocab.clone())?],
        )?;
        for l in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            push(
                &n("attn_norm"),
                Layout::Replicated,
                GgmlDType::F32,
                vec![whole(&n("attn_norm"))?],
            )?;
            let q_rows = p.q_heads.start * hd..p.q_heads.end * hd;
            let kv_rows = p.kv_heads.start * hd..p.kv_heads.end * hd;
            let (q, k, v) = (n("attn_q"), n("attn_k"), n("attn_v"));
            if dt(&q)? == dt(&k)? && dt(&k)? == dt(&v)? {
                push(
                    &n("attn_qkv"),
                    Layout::RowShard,
                    dt(&q)?,
                    vec![
                        rows(&q, q_rows)?,
                        rows(&k, kv_rows.clone())?,
                        rows(&v, kv_rows)?,
                    ],
                )?;
            } else {
                push(&q, Layout::RowShard, dt(&q)?, vec![rows(&q, q_rows)?])?;
                push(
                    &k,
                    Layout::RowShard,
                    dt(&k)?,
                    vec![rows(&k, kv_rows.clone())?],
                )?;
                push(&v, Layout::RowShard, dt(&v)?, vec![rows(&v, kv_rows)?])?;
            }
            let o = n("attn_output");
            let o_cols = p.q_heads.start * hd..p.q_heads.end * hd;
            push(&o, Layout::ColShard, dt(&o)?, vec![cols(&o, o_cols)?])?;
            push(
                &n("ffn_norm"),
                Layout::Replicated,
                GgmlDType::F32,
                vec![whole(&n("ffn_norm"))?],
            )?;
            let (g, u) = (n("ffn_gate"), n("ffn_up"));
            if dt(&g)? == dt(&u)? {
                push(
                    &n("ffn_gate_up"),
                    Layout::RowShard,
                    dt(&g)?,
                    vec![rows(&g, p.ffn.clone())?, rows(&u, p.ffn.clone())?],
                )?;
            } else {
                push(
                    &g,
                    Layout::RowShard,
                    dt(&g)?,
                    vec![rows(&g, p.ffn.clone())?],
                )?;
                push(
                    &u,
                    Layout::RowShard,
                    dt(&u)?,
                    vec![rows(&u, p.ffn.clone())?],
                )?;
            }
            let d = n("ffn_down");
            push(
                &d,
                Layout::ColShard,
                down_dtype(l)?,
                vec![cols(&d, p.ffn.clone())?],
            )?;
        }
        push(
            "output_norm.weight",
            Layout::Replicated,
            GgmlDType::F32,
            vec![whole("output_norm.weight")?],
        )?;
        if !cfg.tied_embeddings {
            push(
                "output.weight",
                Layout::RowShard,
                dt("output.weight")?,
                vec![rows("output.weight", p.vocab.clone())?],
            )?;
        }
        out.push(specs);
    }
    Ok(Plan {
        partitions: parts,
        specs: out,
    })
}

fn make_spec(
    ckpt: &Checkpoint,
    tensor: &str,
    tp: usize,
    rank: usize,
    layout: Layout,
    dtype: GgmlDType,
    parts: Vec<Part>,
) -> Result<ShardSpec, WeightsError> {
    let mut n_rows = 0;
    let mut width = None;
    let mut one_dim = false;
    for part in &parts {
        let e = ckpt.entry(&part.source)?;
        one_dim = e.shape.len() == 1;
        let src_cols = *e.shape.get(1).unwrap_or(&1);
        let bad = |problem: String| WeightsError::Tensor {
            tensor: part.source.clone(),
            message: problem,
        };
        if part.rows.end > e.shape[0] || part.cols.end > src_cols {
            return Err(bad(format!(
                "shape {:?} does not match the model's hyperparameters",
                e.shape
            )));
        }
        let bs = e.dtype.block_size();
        if !one_dim && (part.cols.start % bs != 0 || part.cols.end % bs != 0) {
            return Err(WeightsError::Shard {
                tp,
                reason: format!(
                    "`{}` would be cut at column {} which is inside a {bs}-element {} block",
                    part.source,
                    part.cols.start.max(part.cols.end),
                    cache::dtype_name(e.dtype)
                ),
            });
        }
        let w = if one_dim { e.shape[0] } else { part.cols.len() };
        if *width.get_or_insert(w) != w {
            return Err(bad("fused parts differ in width".into()));
        }
        n_rows += part.rows.len();
    }
    let width = width.unwrap_or(0);
    let shape = if one_dim {
        vec![width]
    } else {
        vec![n_rows, width]
    };
    if width % dtype.block_size() != 0 {
        return Err(WeightsError::Tensor {
            tensor: tensor.into(),
            message: format!(
                "rows of {width} elements cannot be stored as {}",
                cache::dtype_name(dtype)
            ),
        });
    }
    Ok(ShardSpec {
        tensor: tensor.into(),
        tp,
        rank,
        layout,
        interleaved: interleave(dtype, &shape),
        dtype,
        shape,
        parts,
    })
}

/// Bytes with the alignment of the widest GGML block field, so candle can
/// view them as blocks without copying into a misaligned buffer.
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    fn zeroed(len: usize) -> Self {
        Self {
            words: vec![0u64; len.div_ceil(8)],
            len,
        }
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: a u64 buffer of at least `len` bytes viewed as bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// Cuts the shard of `spec` out of the checkpoint's mapped bytes, applying
/// the dtype policy.
fn build_shard(
    ckpt: &Checkpoint,
    file: &[u8],
    spec: &ShardSpec,
) -> Result<AlignedBytes, WeightsError> {
    let mut out = AlignedBytes::zeroed(cache::data_len(spec.dtype, &spec.shape));
    let dst = out.as_mut_slice();
    let mut at = 0;
    for part in &spec.parts {
        let e = ckpt.entry(&part.source)?;
        let src = &file[e.offset as usize..e.offset as usize + e.len];
        let src_cols = *e.shape.get(1).unwrap_or(&1);
        let (bs, ts) = (e.dtype.block_size(), e.dtype.type_size());
        let piece: Vec<u8> = if e.shape.len() == 1 {
            src.to_vec()
        } else {
            let row_bytes = src_cols / bs * ts;
            let (c0, c1) = (part.cols.start / bs * ts, part.cols.end / bs * ts);
            let mut v = Vec::with_capacity(part.rows.len() * (c1 - c0));
            for r in part.rows.clone() {
                v.extend_from_slice(&src[r * row_bytes + c0..r * row_bytes + c1]);
            }
            v
        };
        let piece_shape: Vec<usize> = if e.shape.len() == 1 {
            vec![e.shape[0]]
        } else {
            vec![part.rows.len(), part.cols.len()]
        };
        let converted = if e.dtype == spec.dtype {
            piece
        } else {
            convert(&piece, e.dtype, &piece_shape, spec.dtype).map_err(|message| {
                WeightsError::Tensor {
                    tensor: part.source.clone(),
                    message,
                }
            })?
        };
        dst[at..at + converted.len()].copy_from_slice(&converted);
        at += converted.len();
    }
    if spec.interleaved {
        let (n, k) = (spec.shape[0], spec.shape[1]);
        let pack = match spec.dtype {
            GgmlDType::Q8_0 => kernels::pack_q8_0_x8,
            _ => kernels::pack_q4_1_x8,
        };
        let packed = pack(out.as_slice(), n, k).ok_or_else(|| WeightsError::Tensor {
            tensor: spec.tensor.clone(),
            message: format!(
                "cannot interleave a {n} x {k} {} matrix by 8 rows",
                cache::dtype_name(spec.dtype)
            ),
        })?;
        out.as_mut_slice().copy_from_slice(&packed);
    }
    Ok(out)
}

/// Re-encodes GGML data in another dtype (through f32).
fn convert(
    bytes: &[u8],
    from: GgmlDType,
    shape: &[usize],
    to: GgmlDType,
) -> Result<Vec<u8>, String> {
    let mut src = AlignedBytes::zeroed(bytes.len());
    src.as_mut_slice().copy_from_slice(bytes);
    let q = qtensor(src.as_slice(), from, shape).map_err(|e| e.to_string())?;
    let f = q.dequantize(&Device::Cpu).map_err(|e| e.to_string())?;
    if to == GgmlDType::F32 {
        let v = f
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| e.to_string())?;
        return Ok(v.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    let q = QTensor::quantize(&f, to).map_err(|e| e.to_string())?;
    q.data().map(|d| d.into_owned()).map_err(|e| e.to_string())
}

/// A candle quantized tensor over (a copy of) `bytes`.
fn qtensor(bytes: &[u8], dtype: GgmlDType, shape: &[usize]) -> candle_core::Result<QTensor> {
    let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, dtype)?;
    QTensor::new(storage, shape.to_vec())
}

/// A tensor's bytes: built in memory by a cold start, or a mapping of its
/// cache file on a warm start (never copied: the kernels read the mapping).
pub enum TensorBytes {
    /// Built from the checkpoint.
    Owned(AlignedBytes),
    /// The cache file, mapped.
    Mapped(cache::Mapped),
}

impl TensorBytes {
    /// The tensor data (GGML block layout), 8-byte aligned.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            TensorBytes::Owned(b) => b.as_slice(),
            TensorBytes::Mapped(m) => m.data(),
        }
    }
}

/// One loaded tensor of a rank: dtype, shape and its bytes.
#[derive(Clone)]
pub struct RawTensor {
    /// Stored dtype.
    pub dtype: GgmlDType,
    /// Shape (rows first).
    pub shape: Vec<usize>,
    /// The data, shared (column slices of one tensor share it).
    pub bytes: std::sync::Arc<TensorBytes>,
    /// Interleaved by 8 rows (only our kernels read it).
    pub interleaved: bool,
}

impl RawTensor {
    /// A candle tensor holding a copy of the data.
    pub fn to_qtensor(&self) -> candle_core::Result<QTensor> {
        if self.interleaved {
            return Err(candle_core::Error::Msg(
                "internal: a tensor interleaved by 8 rows has no candle form".into(),
            ));
        }
        qtensor(self.bytes.as_slice(), self.dtype, &self.shape)
    }
}

/// The tensors of one rank, by name.
pub type RankTensors = HashMap<String, RawTensor>;

/// The outcome of a load.
pub struct Loaded {
    /// One tensor map per rank.
    pub ranks: Vec<RankTensors>,
    /// What each rank owns.
    pub partitions: Vec<Partition>,
    /// Cache files mapped (warm start), relative to the cache dir.
    pub files_read: Vec<String>,
    /// Cache files written (cold start), relative to the cache dir.
    pub files_written: Vec<String>,
}

/// Reports load progress: `(done, total, message)`.
pub type Progress<'a> = &'a (dyn Fn(u32, u32, String) + Sync);

/// Loads every rank's tensors: a cold start shards the checkpoint and writes
/// the cache, a warm start maps the cache and never reads the checkpoint's
/// tensor data. `step_hook` runs once per tensor (the slow-load test fault);
/// `fail_write` makes that cache file write (1-based) of a cold build fail
/// with ENOSPC (the full-disk test fault).
#[allow(clippy::too_many_arguments)]
pub fn load(
    ckpt: &Checkpoint,
    tp: usize,
    policy: DtypePolicy,
    cache_dir: &Path,
    mode: CacheMode,
    progress: Progress<'_>,
    step_hook: &dyn Fn(),
    fail_write: Option<u64>,
) -> Result<Loaded, WeightsError> {
    let Plan { partitions, specs } = plan(ckpt, tp, policy)?;
    let total: u32 = specs.iter().map(|s| s.len() as u32).sum();
    let mut done = 0u32;
    let mut ranks = Vec::with_capacity(tp);
    let mut files_read = Vec::new();
    let mut files_written = Vec::new();
    let label = mode.as_str();

    let checkpoint_map = match mode {
        CacheMode::Cold => {
            std::fs::create_dir_all(cache_dir).map_err(|source| CacheError::Io {
                file: cache_dir.to_path_buf(),
                source,
            })?;
            let f = std::fs::File::open(&ckpt.path).map_err(|source| GgufError::Io {
                path: ckpt.path.clone(),
                source,
            })?;
            // SAFETY: the checkpoint is read-only input; nobody rewrites a
            // model file in place while a worker loads it.
            Some(
                unsafe { memmap2::Mmap::map(&f) }.map_err(|source| GgufError::Io {
                    path: ckpt.path.clone(),
                    source,
                })?,
            )
        }
        CacheMode::Warm => None,
    };

    for rank_specs in &specs {
        let mut tensors = HashMap::with_capacity(rank_specs.len());
        for spec in rank_specs {
            progress(
                done,
                total,
                format!("{label} start: {} (rank {})", spec.tensor, spec.rank),
            );
            step_hook();
            let bytes = match &checkpoint_map {
                Some(map) => {
                    let bytes = build_shard(ckpt, map, spec)?;
                    let nth = files_written.len() as u64 + 1;
                    let name = if fail_write == Some(nth) {
                        cache::write_no_space(cache_dir, spec, bytes.as_slice())?
                    } else {
                        cache::write(cache_dir, spec, bytes.as_slice())?
                    };
                    files_written.push(name);
                    TensorBytes::Owned(bytes)
                }
                None => {
                    let mapped = cache::map(cache_dir, spec)?;
                    files_read.push(spec.file_name());
                    TensorBytes::Mapped(mapped)
                }
            };
            tensors.insert(
                spec.tensor.clone(),
                RawTensor {
                    dtype: spec.dtype,
                    shape: spec.shape.clone(),
                    bytes: std::sync::Arc::new(bytes),
                    interleaved: spec.interleaved,
                },
            );
            done += 1;
        }
        ranks.push(tensors);
    }
    if mode == CacheMode::Cold {
        // The header last: a warm start needs it, so a cache whose build
        // died midway stays unusable rather than half-used.
        let json = ckpt.to_meta().map_err(|problem| CacheError::BadHeader {
            file: cache_dir.join(cache::META_FILE),
            problem,
        })?;
        files_written.push(cache::write_meta(cache_dir, &json)?);
        cache::sync_dir(cache_dir)?;
    }
    progress(total, total, format!("{label} start: done"));
    Ok(Loaded {
        ranks,
        partitions,
        files_read,
        files_written,
    })
}

/// The elements of a 1-D tensor as f32 (norm weights).
pub fn vector(t: &RawTensor) -> candle_core::Result<Vec<f32>> {
    if t.dtype == GgmlDType::F32 {
        return Ok(t
            .bytes
            .as_slice()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect());
    }
    t.to_qtensor()?
        .dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()
}
