//! Our own quantized matmul for Q4_1 weights, the format SmolLM2's GGUF
//! stores its blocks in and the one candle 0.11 only has a scalar dot product
//! for on x86, and for Q8_0 (the embedding / LM head), so that the weights
//! can be used in place from the mapped cache files and a batch reads them
//! once.
//!
//! The activations are quantized to 8 bits per 32-value block (scale `d` and
//! `s = d * sum(q)`, the Q8_1 scheme), and one Q4_1 block (`w = d * q + m`)
//! against one activation block is
//! `d_w * d_x * sum(q_w * q_x) + m_w * s_x`; a Q8_0 block (`w = d * q`) is
//! `d_w * d_x * sum(q_w * q_x)`.
//!
//! **Q4_1 interleaved by 8 rows** ([`Format::Q4_1x8`], built once by the
//! cold start, see [`pack_q4_1_x8`]): block `b` of 8 consecutive weight rows
//! is one 160-byte unit holding the 8 scales, the 8 minimums and the 256
//! nibbles arranged so that one AVX2 `maddubs` multiplies 4 values of every
//! one of the 8 rows with the same 4 activation values (broadcast). Each
//! 32-bit lane of the result then belongs to one weight row, so a block of 8
//! rows costs 8 multiplies, 7 adds and one widening per activation row
//! instead of 8 x (multiply, widen, horizontal sum), and the 8 scales are one
//! vector. An activation row is multiplied with each unpacked unit while it
//! is in registers, so a batch reads the weights once per step.
//!
//! **Bit-for-bit rules.** For Q4_1 (plain and interleaved, AVX2 and scalar)
//! every output element is computed by the same operations: per block the
//! exact integer `sum(q_w * q_x)`, then `acc = fma(d_w * d_x, isum, acc)` and
//! `macc = fma(m_w, s_x, macc)`, and `acc + macc` at the end. So a sequence
//! decoded alone gives the same bits as in a batch, TP=1 the same bits as
//! TP=2 (whose shards may be packed differently), and a CPU without AVX2 the
//! same bits as one with it. Q8_0 (plain and interleaved by 8 rows the same
//! way, [`Format::Q8_0x8`], for the LM head) follows the same rule: the
//! exact integer block sum, then `acc = fma(d_w * d_x, isum, acc)`.

use half::f16;
use std::cell::RefCell;
use std::sync::OnceLock;

/// Values per block.
pub const QK: usize = 32;
/// Bytes of one Q4_1 block: f16 `d`, f16 `m`, 16 bytes of nibbles.
pub const Q4_1_BYTES: usize = 20;
/// Activation rows multiplied with one unpacked weight block at a time.
pub const ROWS_PER_PASS: usize = 4;
/// Weight rows per unit of work handed to a thread.
/// (16: two interleaved groups, one 512-bit pass where the CPU has it.)
const ROWS_PER_TASK: usize = 16;

/// The instruction set the kernels use on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX2 + FMA + F16C, and AVX-512 (F, BW, VL, VNNI) for the interleaved
    /// formats: 16 rows (two interleaved groups) per 512-bit pass, and one
    /// `vpdpbusd` per 4 values instead of multiply, widen and add; the sums
    /// are the same integers.
    Vnni,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// Portable Rust.
    Scalar,
}

impl Isa {
    /// The name `TTW_KERNELS_ISA` takes.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Vnni => "vnni",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// The set `TTW_KERNELS_ISA` names (`None` for `auto` or an unknown
    /// name).
    pub fn from_name(name: &str) -> Option<Isa> {
        [Isa::Vnni, Isa::Avx2, Isa::Scalar]
            .into_iter()
            .find(|i| i.name() == name)
    }

    /// Wider sets rank higher; each includes the ones below.
    fn rank(self) -> u8 {
        match self {
            Isa::Scalar => 0,
            Isa::Avx2 => 1,
            Isa::Vnni => 2,
        }
    }
}

/// The best instruction set this CPU has.
fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Vnni;
            }
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

static ISA: OnceLock<Isa> = OnceLock::new();

/// The instruction set the kernels use: the best this CPU has, unless
/// [`choose_isa`] picked a narrower one first. Fixed for the process.
pub fn isa() -> Isa {
    *ISA.get_or_init(detect)
}

/// Makes the kernels use `wanted` (`TTW_KERNELS_ISA`, to compare kernels
/// side by side: every set computes the same bits). Refused when the CPU
/// lacks it or the kernels already run with another.
pub fn choose_isa(wanted: Isa) -> Result<(), String> {
    let best = detect();
    if wanted.rank() > best.rank() {
        return Err(format!(
            "TTW_KERNELS_ISA={}: this CPU does not have it (the best it has is {}); leave it at auto",
            wanted.name(),
            best.name()
        ));
    }
    let got = *ISA.get_or_init(|| wanted);
    if got != wanted {
        return Err(format!(
            "TTW_KERNELS_ISA={}: the kernels already run with {}",
            wanted.name(),
            got.name()
        ));
    }
    Ok(())
}

/// Rows of activations quantized to 8 bits per block.
#[derive(Debug, Default, Clone)]
pub struct Q8Rows {
    /// Quantized values, `k` per row.
    pub qs: Vec<i8>,
    /// Block scales, `k / QK` per row.
    pub d: Vec<f32>,
    /// `d * sum(q)` of each block.
    pub s: Vec<f32>,
    /// Values per row.
    pub k: usize,
    /// Rows.
    pub rows: usize,
}

impl Q8Rows {
    /// Quantizes `rows` rows of `k` values (`k` a multiple of [`QK`]),
    /// reusing the buffers.
    pub fn quantize(&mut self, x: &[f32], rows: usize, k: usize) {
        debug_assert_eq!(x.len(), rows * k);
        debug_assert_eq!(k % QK, 0);
        let nb = k / QK;
        self.k = k;
        self.rows = rows;
        self.qs.resize(rows * k, 0);
        self.d.resize(rows * nb, 0.0);
        self.s.resize(rows * nb, 0.0);
        #[cfg(target_arch = "x86_64")]
        let avx2 = isa() != Isa::Scalar;
        for ((xb, qb), (d, s)) in x
            .chunks_exact(QK)
            .zip(self.qs.chunks_exact_mut(QK))
            .zip(self.d.iter_mut().zip(self.s.iter_mut()))
        {
            #[cfg(target_arch = "x86_64")]
            let (scale, sum) = if avx2 {
                // SAFETY: isa() checked AVX2; both blocks hold QK values.
                unsafe { avx2::quantize_block(xb, qb) }
            } else {
                quantize_block(xb, qb)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let (scale, sum) = quantize_block(xb, qb);
            *d = scale;
            *s = scale * sum as f32;
        }
    }
}

/// One block of activations to 8 bits: returns the scale and the sum of
/// the quantized values. The reference every path matches bit for bit.
fn quantize_block(xb: &[f32], qb: &mut [i8]) -> (f32, i32) {
    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let scale = amax / 127.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qb.iter_mut().zip(xb) {
        let r = (v * inv).round() as i32;
        let r = r.clamp(-127, 127);
        *q = r as i8;
        sum += r;
    }
    (scale, sum)
}

/// The weight block formats the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// f16 `d`, f16 `m`, 16 bytes of nibbles (low nibbles are values 0..16).
    Q4_1,
    /// Q4_1 interleaved by 8 rows (see [`pack_q4_1_x8`]).
    Q4_1x8,
    /// f16 `d`, 32 signed bytes.
    Q8_0,
    /// Q8_0 interleaved by 8 rows (see [`pack_q8_0_x8`]).
    Q8_0x8,
}

impl Format {
    /// Bytes per block of [`QK`] values of one row.
    pub fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 | Format::Q4_1x8 => Q4_1_BYTES,
            Format::Q8_0 | Format::Q8_0x8 => Q8_0_BYTES,
        }
    }

    /// Rows stored together (the unit a row range is cut in).
    pub fn rows_per_unit(self) -> usize {
        match self {
            Format::Q4_1x8 | Format::Q8_0x8 => X8,
            Format::Q4_1 | Format::Q8_0 => 1,
        }
    }
}

/// Bytes of one Q8_0 block.
pub const Q8_0_BYTES: usize = 34;
/// Rows interleaved by [`Format::Q4_1x8`] and [`Format::Q8_0x8`].
pub const X8: usize = 8;
/// Bytes of one interleaved Q4_1 unit: block `b` of 8 rows.
pub const Q4_1X8_BYTES: usize = X8 * Q4_1_BYTES;
/// Bytes of one interleaved Q8_0 unit: block `b` of 8 rows.
pub const Q8_0X8_BYTES: usize = X8 * Q8_0_BYTES;

/// Value `i` (0..32) of a Q4_1 block's 16 nibble bytes.
fn q4_1_value(nibbles: &[u8], i: usize) -> u8 {
    if i < QK / 2 {
        nibbles[i] & 0x0F
    } else {
        nibbles[i - QK / 2] >> 4
    }
}

/// Byte `j` (0..32) of nibble chunk `p` (0..4) of an interleaved unit holds,
/// for row `j / 4`, value `8p + j % 4` in its low nibble and value
/// `8p + 4 + j % 4` in its high nibble: masking a chunk gives 4 values of
/// each of the 8 rows, in the order one broadcast activation word needs.
fn x8_value_index(p: usize, j: usize, high: bool) -> (usize, usize) {
    (j / 4, 8 * p + 4 * usize::from(high) + j % 4)
}

/// Interleaves a plain Q4_1 matrix of `n` rows of `k` values into
/// [`Format::Q4_1x8`]: `None` unless `n` is a multiple of 8 and the bytes
/// fit. The result has the same length; unit `(g, b)` (rows `8g..8g + 8`,
/// block `b`) starts at byte `(g * k / 32 + b) * 160` and holds the 8 `d`
/// (f16), the 8 `m` (f16), then 4 chunks of 32 nibble bytes.
pub fn pack_q4_1_x8(plain: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    pack_x8(plain, n, k, Q4_1_BYTES, |unit, rows| {
        for (r, blk) in rows.iter().enumerate() {
            unit[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
            unit[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&blk[2..4]);
        }
        for p in 0..4 {
            for j in 0..32 {
                let (r, lo) = x8_value_index(p, j, false);
                let (_, hi) = x8_value_index(p, j, true);
                let nib = &rows[r][4..];
                unit[32 + 32 * p + j] = q4_1_value(nib, lo) | (q4_1_value(nib, hi) << 4);
            }
        }
    })
}

/// What the packers share: the shape check, then unit `(g, b)` built by
/// `fill` from block `b` of rows `8g..8g + 8`, in place of those blocks.
fn pack_x8(
    plain: &[u8],
    n: usize,
    k: usize,
    block_bytes: usize,
    fill: impl Fn(&mut [u8], [&[u8]; X8]),
) -> Option<Vec<u8>> {
    let nb = k / QK;
    if !n.is_multiple_of(X8) || !k.is_multiple_of(QK) || plain.len() != n * nb * block_bytes {
        return None;
    }
    let unit_bytes = X8 * block_bytes;
    let mut out = vec![0u8; plain.len()];
    for g in 0..n / X8 {
        for b in 0..nb {
            let rows: [&[u8]; X8] = std::array::from_fn(|r| {
                &plain[((g * X8 + r) * nb + b) * block_bytes..][..block_bytes]
            });
            fill(&mut out[(g * nb + b) * unit_bytes..][..unit_bytes], rows);
        }
    }
    Some(out)
}

/// One Q4_1 block of row `r` of an interleaved unit, in plain layout.
fn x8_block(unit: &[u8], r: usize) -> [u8; Q4_1_BYTES] {
    let mut q = [0u8; QK];
    for p in 0..4 {
        for j in (r * 4)..(r * 4 + 4) {
            let byte = unit[32 + 32 * p + j];
            q[x8_value_index(p, j, false).1] = byte & 0x0F;
            q[x8_value_index(p, j, true).1] = byte >> 4;
        }
    }
    let mut blk = [0u8; Q4_1_BYTES];
    blk[0..2].copy_from_slice(&unit[2 * r..2 * r + 2]);
    blk[2..4].copy_from_slice(&unit[16 + 2 * r..16 + 2 * r + 2]);
    for i in 0..QK / 2 {
        blk[4 + i] = q[i] | (q[i + QK / 2] << 4);
    }
    blk
}

/// Byte `j` (0..32) of value chunk `p` (0..8) of an interleaved Q8_0 unit
/// holds value `4p + j % 4` of row `j / 4`: one chunk is 4 values of each of
/// the 8 rows, against one broadcast activation word.
fn q8_x8_value_index(p: usize, j: usize) -> (usize, usize) {
    (j / 4, 4 * p + j % 4)
}

/// Interleaves a plain Q8_0 matrix of `n` rows of `k` values into
/// [`Format::Q8_0x8`]: `None` unless `n` is a multiple of 8 and the bytes
/// fit. The result has the same length; unit `(g, b)` (rows `8g..8g + 8`,
/// block `b`) starts at byte `(g * k / 32 + b) * 272` and holds the 8 `d`
/// (f16), then 8 chunks of 32 value bytes.
pub fn pack_q8_0_x8(plain: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    pack_x8(plain, n, k, Q8_0_BYTES, |unit, rows| {
        for (r, blk) in rows.iter().enumerate() {
            unit[2 * r..2 * r + 2].copy_from_slice(&blk[0..2]);
        }
        for p in 0..QK / 4 {
            for j in 0..32 {
                let (r, v) = q8_x8_value_index(p, j);
                unit[16 + 32 * p + j] = rows[r][2 + v];
            }
        }
    })
}

/// One Q8_0 block of row `r` of an interleaved unit, in plain layout.
fn q8_x8_block(unit: &[u8], r: usize) -> [u8; Q8_0_BYTES] {
    let mut blk = [0u8; Q8_0_BYTES];
    blk[0..2].copy_from_slice(&unit[2 * r..2 * r + 2]);
    for p in 0..QK / 4 {
        for j in (r * 4)..(r * 4 + 4) {
            blk[2 + q8_x8_value_index(p, j).1] = unit[16 + 32 * p + j];
        }
    }
    blk
}

/// A weight matrix `(n, k)` in GGML block layout (or interleaved by 8 rows),
/// possibly a column slice of a wider one: storage unit `u` (a row, or 8
/// rows when interleaved) is `blocks` blocks starting at byte
/// `offset + u * stride`.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    /// Block format.
    pub format: Format,
    /// The bytes of the whole (wider) matrix.
    pub data: &'a [u8],
    /// Output rows.
    pub n: usize,
    /// Blocks per row used.
    pub blocks: usize,
    /// Bytes from one storage unit (row, or 8 rows) to the next.
    pub stride: usize,
    /// Byte offset of the first block used in unit 0.
    pub offset: usize,
}

impl<'a> WeightView<'a> {
    /// A whole matrix of `n` rows of `k` values.
    pub fn new(format: Format, data: &'a [u8], n: usize, k: usize) -> Option<Self> {
        Self::cols(format, data, n, k, 0..k)
    }

    /// Columns `cols` (block-aligned) of a matrix of `n` rows of `k` values;
    /// `None` when the bytes or the columns do not fit.
    pub fn cols(
        format: Format,
        data: &'a [u8],
        n: usize,
        k: usize,
        cols: std::ops::Range<usize>,
    ) -> Option<Self> {
        let unit_rows = format.rows_per_unit();
        if !k.is_multiple_of(QK)
            || !cols.start.is_multiple_of(QK)
            || !cols.end.is_multiple_of(QK)
            || cols.end > k
            || !n.is_multiple_of(unit_rows)
        {
            return None;
        }
        let bb = format.block_bytes() * unit_rows;
        let stride = k / QK * bb;
        if data.len() != n / unit_rows * stride || cols.is_empty() {
            return None;
        }
        Some(Self {
            format,
            data,
            n,
            blocks: cols.len() / QK,
            stride,
            offset: cols.start / QK * bb,
        })
    }

    /// Input values per row.
    pub fn k(&self) -> usize {
        self.blocks * QK
    }

    /// The used blocks of storage unit `u` (row `u`, or rows `8u..8u + 8`).
    fn unit(&self, u: usize) -> &'a [u8] {
        let at = self.offset + u * self.stride;
        let len = self.blocks * self.format.block_bytes() * self.format.rows_per_unit();
        &self.data[at..at + len]
    }

    /// Row `r` as f32 (the embedding lookup).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let q4_1 = |blk: &[u8], o: &mut [f32]| {
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let m = f16::from_le_bytes([blk[2], blk[3]]).to_f32();
            for (i, v) in o.iter_mut().enumerate() {
                *v = d * q4_1_value(&blk[4..], i) as f32 + m;
            }
        };
        let q8_0 = |blk: &[u8], o: &mut [f32]| {
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            for (v, &q) in o.iter_mut().zip(&blk[2..]) {
                *v = d * (q as i8) as f32;
            }
        };
        match self.format {
            Format::Q8_0 => {
                for (blk, o) in self
                    .unit(r)
                    .chunks_exact(Q8_0_BYTES)
                    .zip(out.chunks_exact_mut(QK))
                {
                    q8_0(blk, o);
                }
            }
            Format::Q8_0x8 => {
                let units = self.unit(r / X8).chunks_exact(Q8_0X8_BYTES);
                for (unit, o) in units.zip(out.chunks_exact_mut(QK)) {
                    q8_0(&q8_x8_block(unit, r % X8), o);
                }
            }
            Format::Q4_1 => {
                for (blk, o) in self
                    .unit(r)
                    .chunks_exact(Q4_1_BYTES)
                    .zip(out.chunks_exact_mut(QK))
                {
                    q4_1(blk, o);
                }
            }
            Format::Q4_1x8 => {
                let units = self.unit(r / X8).chunks_exact(Q4_1X8_BYTES);
                for (unit, o) in units.zip(out.chunks_exact_mut(QK)) {
                    q4_1(&x8_block(unit, r % X8), o);
                }
            }
        }
    }
}

/// Output pointer shared by the threads; each writes disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the threads write disjoint (row, column) elements of buffers that
// outlive the parallel call.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

thread_local! {
    static SCRATCH: RefCell<Q8Rows> = RefCell::new(Q8Rows::default());
}

/// One product of a fused call: `out = x[:, col..col + w.k()] Wᵀ`, `m` rows
/// of `w.n` values.
pub struct Task<'a> {
    /// The weights.
    pub w: WeightView<'a>,
    /// First column of the shared input this product reads (block-aligned).
    pub col: usize,
    /// Its output.
    pub out: &'a mut [f32],
}

/// `out = x Wᵀ`: `x` holds `m` rows of `w.k()` values, `out` receives `m`
/// rows of `w.n` values.
pub fn matmul(w: &WeightView<'_>, x: &[f32], m: usize, out: &mut [f32]) {
    matmul_fused(x, m, w.k(), &mut [Task { w: *w, col: 0, out }]);
}

/// Several products over one input `x` (`m` rows of `k` values), quantized
/// once and computed in one parallel region: the Q/K/V of a layer, or the
/// reduction parts of a row-parallel layer.
pub fn matmul_fused(x: &[f32], m: usize, k: usize, tasks: &mut [Task<'_>]) {
    assert_eq!(x.len(), m * k, "activation length");
    for t in tasks.iter() {
        assert!(
            t.col % QK == 0 && t.col + t.w.k() <= k,
            "columns outside the input"
        );
        assert_eq!(t.out.len(), m * t.w.n, "output length");
    }
    SCRATCH.with(|cell| {
        let mut q = cell.borrow_mut();
        q.quantize(x, m, k);
        let q: &Q8Rows = &q;
        let isa = isa();
        // Units of work: ROWS_PER_TASK weight rows of one product.
        let mut starts = Vec::with_capacity(tasks.len() + 1);
        let mut total = 0;
        for t in tasks.iter() {
            starts.push(total);
            total += t.w.n.div_ceil(ROWS_PER_TASK);
        }
        starts.push(total);
        let jobs: Vec<(WeightView<'_>, usize, OutPtr)> = tasks
            .iter_mut()
            .map(|t| (t.w, t.col / QK, OutPtr(t.out.as_mut_ptr())))
            .collect();
        let run = |range: std::ops::Range<usize>| {
            for unit in range {
                let j = starts.partition_point(|&s| s <= unit) - 1;
                let (w, blk0, ptr) = jobs[j];
                let first = (unit - starts[j]) * ROWS_PER_TASK;
                let rows = first..(first + ROWS_PER_TASK).min(w.n);
                // SAFETY: only this unit writes rows `rows` of this
                // product's m x n output, which `ptr` points to.
                unsafe { product_rows(isa, &w, q, blk0, rows, ptr) };
            }
        };
        let work: usize = jobs.iter().map(|(w, _, _)| w.n * w.k()).sum::<usize>() * m;
        if work < 64 * 1024 {
            run(0..total);
        } else {
            crate::pool::global().run(total, &run);
        }
    });
}

/// Expands `$call!(N, 0, .., N - 1)` for `N = $take` (1 to
/// [`ROWS_PER_PASS`]): the kernels take the activation rows of a pass as
/// const-sized arrays.
macro_rules! by_rows {
    ($take:expr, $call:ident) => {
        match $take {
            1 => $call!(1, 0),
            2 => $call!(2, 0, 1),
            3 => $call!(3, 0, 1, 2),
            _ => $call!(4, 0, 1, 2, 3),
        }
    };
}

/// Output rows `rows` of `w` for every activation row of `q`, starting at
/// activation block `blk0`, written to `out` (`q.rows` x `w.n`).
///
/// # Safety
/// `out` points to `q.rows * w.n` floats that no one else writes at `rows`.
unsafe fn product_rows(
    isa: Isa,
    w: &WeightView<'_>,
    q: &Q8Rows,
    blk0: usize,
    rows: std::ops::Range<usize>,
    out: OutPtr,
) {
    let m = q.rows;
    let nb = q.k / QK;
    let put = |i: usize, r: usize, v: f32| {
        // SAFETY: (i, r) is inside the m x n output (see above).
        unsafe { *out.0.add(i * w.n + r) = v };
    };
    let xq = |i: usize| &q.qs[i * q.k + blk0 * QK..(i + 1) * q.k];
    let xd = |i: usize| &q.d[i * nb + blk0..(i + 1) * nb];
    let xs = |i: usize| &q.s[i * nb + blk0..(i + 1) * nb];
    match (w.format, isa) {
        #[cfg(target_arch = "x86_64")]
        (Format::Q4_1x8 | Format::Q8_0x8, Isa::Avx2 | Isa::Vnni) => {
            let groups = rows.start / X8..rows.end.div_ceil(X8);
            let mut g = groups.start;
            while g < groups.end {
                // Two groups at once on 512-bit vectors where the CPU has
                // them (and a second group is in range).
                let two = isa == Isa::Vnni && g + 1 < groups.end;
                let (unit, next) = (w.unit(g), w.unit(if two { g + 1 } else { g }));
                let mut i = 0;
                while i < m {
                    let take = (m - i).min(ROWS_PER_PASS);
                    // Row i of the output, from column 8g: the kernels
                    // store their lanes there, `w.n` apart per row.
                    // SAFETY: (i, 8g) is inside the m x n output.
                    let to = unsafe { out.0.add(i * w.n + g * X8) };
                    macro_rules! call {
                        ($n:literal, $($j:literal),*) => {{
                            // SAFETY: isa() checked AVX2, FMA and F16C (and
                            // AVX-512 F/BW/VL/VNNI for Isa::Vnni); the units
                            // and every activation slice hold `blocks`
                            // blocks; rows i..i + $n of the output have
                            // room for the 8 (or 16) lanes from column 8g,
                            // which only this unit of work writes.
                            unsafe {
                                let (xq, xd) = ([$(xq(i + $j)),*], [$(xd(i + $j)),*]);
                                let xs = [$(xs(i + $j)),*];
                                match (w.format, isa) {
                                    (Format::Q4_1x8, Isa::Vnni) if two => {
                                        avx512::dot_q4_1x16::<$n>(unit, next, xq, xd, xs, to, w.n)
                                    }
                                    (_, Isa::Vnni) if two => {
                                        avx512::dot_q8_0x16::<$n>(unit, next, xq, xd, to, w.n)
                                    }
                                    (Format::Q4_1x8, Isa::Vnni) => {
                                        vnni::dot_q4_1x8::<$n>(unit, xq, xd, xs, to, w.n)
                                    }
                                    (Format::Q4_1x8, _) => {
                                        avx2::dot_q4_1x8::<$n>(unit, xq, xd, xs, to, w.n)
                                    }
                                    (_, Isa::Vnni) => vnni::dot_q8_0x8::<$n>(unit, xq, xd, to, w.n),
                                    _ => avx2::dot_q8_0x8::<$n>(unit, xq, xd, to, w.n),
                                }
                            }
                        }};
                    }
                    by_rows!(take, call);
                    i += take;
                }
                g += if two { 2 } else { 1 };
            }
        }
        (Format::Q4_1x8, _) => {
            for r in rows {
                let blocks: Vec<[u8; Q4_1_BYTES]> = w
                    .unit(r / X8)
                    .chunks_exact(Q4_1X8_BYTES)
                    .map(|u| x8_block(u, r % X8))
                    .collect();
                for i in 0..m {
                    put(
                        i,
                        r,
                        dot_q4_1_scalar(blocks.as_flattened(), xq(i), xd(i), xs(i)),
                    );
                }
            }
        }
        (Format::Q4_1, _) => {
            for r in rows {
                for i in 0..m {
                    put(i, r, dot_q4_1_scalar(w.unit(r), xq(i), xd(i), xs(i)));
                }
            }
        }
        (Format::Q8_0x8, _) => {
            for r in rows {
                let blocks: Vec<[u8; Q8_0_BYTES]> = w
                    .unit(r / X8)
                    .chunks_exact(Q8_0X8_BYTES)
                    .map(|u| q8_x8_block(u, r % X8))
                    .collect();
                for i in 0..m {
                    put(i, r, dot_q8_0_scalar(blocks.as_flattened(), xq(i), xd(i)));
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        (Format::Q8_0, Isa::Avx2 | Isa::Vnni) => {
            for r in rows {
                let wr = w.unit(r);
                let mut i = 0;
                while i < m {
                    let take = (m - i).min(ROWS_PER_PASS);
                    let mut res = [0.0f32; ROWS_PER_PASS];
                    macro_rules! call {
                        ($n:literal, $($j:literal),*) => {{
                            // SAFETY: as above.
                            let r = unsafe {
                                avx2::dot_q8_0::<$n>(wr, [$(xq(i + $j)),*], [$(xd(i + $j)),*])
                            };
                            res[..$n].copy_from_slice(&r);
                        }};
                    }
                    by_rows!(take, call);
                    for (a, &v) in res[..take].iter().enumerate() {
                        put(i + a, r, v);
                    }
                    i += take;
                }
            }
        }
        (Format::Q8_0, _) => {
            for r in rows {
                for i in 0..m {
                    put(i, r, dot_q8_0_scalar(w.unit(r), xq(i), xd(i)));
                }
            }
        }
    }
}

/// The reference: one Q8_0 row against one quantized activation row, with
/// the operations every Q8_0 path performs: per block the exact integer
/// `sum(q_w * q_x)`, then `acc = fma(d_w * d_x, isum, acc)`.
pub fn dot_q8_0_scalar(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(Q8_0_BYTES).enumerate() {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let x = &xq[b * QK..(b + 1) * QK];
        let isum: i32 = blk[2..]
            .iter()
            .zip(x)
            .map(|(&w, &x)| (w as i8) as i32 * x as i32)
            .sum();
        // |isum| <= 32 * 128 * 127: exact in f32.
        acc = (d * xd[b]).mul_add(isum as f32, acc);
    }
    acc
}

/// The reference: one Q4_1 row against one quantized activation row, with
/// the operations every Q4_1 path performs (see the module doc).
pub fn dot_q4_1_scalar(w: &[u8], xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    let mut macc = 0.0f32;
    for (b, blk) in w.chunks_exact(Q4_1_BYTES).enumerate() {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let m = f16::from_le_bytes([blk[2], blk[3]]).to_f32();
        let x = &xq[b * QK..(b + 1) * QK];
        let isum: i32 = (0..QK)
            .map(|i| q4_1_value(&blk[4..], i) as i32 * x[i] as i32)
            .sum();
        // |isum| <= 32 * 15 * 127: exact in f32.
        acc = (d * xd[b]).mul_add(isum as f32, acc);
        macc = m.mul_add(xs[b], macc);
    }
    acc + macc
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Q4_1X8_BYTES, Q8_0X8_BYTES, Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    /// 8 interleaved Q4_1 rows (`units`: one unit per block) against `N`
    /// quantized activation rows: row `r` times activation row `j`,
    /// computed as [`super::dot_q4_1_scalar`] does, is stored at
    /// `out[j * stride + r]` (written straight from the vector registers:
    /// no result array to copy and scatter per call).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_1x8<const N: usize>(
        units: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        xs: [&[f32]; N],
        out: *mut f32,
        stride: usize,
    ) {
        q4_1x8::<N, false>(units, xq, xd, xs, out, stride)
    }

    /// The loop of [`dot_q4_1x8`], with each 4-value dot product of 8 rows
    /// one `vpdpbusd` when `VNNI` (inlined into a caller that enables it),
    /// else `maddubs` sums kept in i16 and widened once per block. Both
    /// give the same exact integer block sums.
    #[inline(always)]
    pub(super) unsafe fn q4_1x8<const N: usize, const VNNI: bool>(
        units: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        xs: [&[f32]; N],
        out: *mut f32,
        stride: usize,
    ) {
        let nb = units.len() / Q4_1X8_BYTES;
        for j in 0..N {
            debug_assert!(xq[j].len() >= nb * QK && xd[j].len() >= nb && xs[j].len() >= nb);
        }
        let low = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut macc = [_mm256_setzero_ps(); N];
        let up = units.as_ptr();
        for b in 0..nb {
            let unit = up.add(b * Q4_1X8_BYTES);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(unit as *const __m128i));
            let m = _mm256_cvtph_ps(_mm_loadu_si128(unit.add(16) as *const __m128i));
            // Without VNNI: sums of 8 products of a nibble (<= 15) and an
            // activation (|q| <= 127) stay within i16: 8 * 2 * 15 * 127 =
            // 30480.
            let mut isum = [_mm256_setzero_si256(); N];
            for p in 0..4 {
                let c = _mm256_loadu_si256(unit.add(32 + 32 * p) as *const __m256i);
                let w0 = _mm256_and_si256(c, low);
                let w1 = _mm256_and_si256(_mm256_srli_epi16(c, 4), low);
                for j in 0..N {
                    let xp = xq[j].as_ptr().add(b * QK + 8 * p);
                    let x0 = _mm256_set1_epi32(std::ptr::read_unaligned(xp as *const i32));
                    let x1 = _mm256_set1_epi32(std::ptr::read_unaligned(xp.add(4) as *const i32));
                    if VNNI {
                        isum[j] = _mm256_dpbusd_epi32(isum[j], w0, x0);
                        isum[j] = _mm256_dpbusd_epi32(isum[j], w1, x1);
                    } else {
                        isum[j] = _mm256_add_epi16(isum[j], _mm256_maddubs_epi16(w0, x0));
                        isum[j] = _mm256_add_epi16(isum[j], _mm256_maddubs_epi16(w1, x1));
                    }
                }
            }
            for j in 0..N {
                let ints = if VNNI {
                    isum[j]
                } else {
                    _mm256_madd_epi16(isum[j], ones)
                };
                let dots = _mm256_cvtepi32_ps(ints);
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(*xd[j].get_unchecked(b)));
                acc[j] = _mm256_fmadd_ps(scale, dots, acc[j]);
                macc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(*xs[j].get_unchecked(b)), macc[j]);
            }
        }
        for j in 0..N {
            _mm256_storeu_ps(out.add(j * stride), _mm256_add_ps(acc[j], macc[j]));
        }
    }

    /// [`super::quantize_block`] on 8 lanes: the same maximum (a NaN is
    /// skipped), scale and reciprocal, and `round` (half away from zero),
    /// saturating cast (NaN to 0) and clamp done exactly as `f32::round`
    /// and `as i32` do them.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_block(xb: &[f32], qb: &mut [i8]) -> (f32, i32) {
        debug_assert!(xb.len() >= QK && qb.len() >= QK);
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let xp = xb.as_ptr();
        let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(xp.add(o)));
        // max(|v|, a) keeps `a` where |v| is NaN, as f32::max does.
        let mut m = _mm256_setzero_ps();
        for vi in v {
            m = _mm256_max_ps(_mm256_and_ps(vi, abs_mask), m);
        }
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        let amax = lanes.iter().fold(0.0f32, |a, &l| a.max(l));
        let scale = amax / 127.0;
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let vinv = _mm256_set1_ps(inv);
        let half = _mm256_set1_ps(0.5);
        let sign_mask = _mm256_set1_ps(-0.0);
        let one = _mm256_set1_ps(1.0);
        let lim = _mm256_set1_ps(127.0);
        let mut sum = _mm256_setzero_si256();
        let mut q32 = [_mm256_setzero_si256(); 4];
        for (i, vi) in v.into_iter().enumerate() {
            let t = _mm256_mul_ps(vi, vinv);
            // round half away from zero: trunc, then one step outwards
            // where the dropped fraction is at least a half (t - trunc(t)
            // is exact).
            let tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            let frac = _mm256_and_ps(_mm256_sub_ps(t, tr), abs_mask);
            let step = _mm256_or_ps(_mm256_and_ps(t, sign_mask), one);
            let up = _mm256_cmp_ps(frac, half, _CMP_GE_OQ);
            let r = _mm256_add_ps(tr, _mm256_and_ps(up, step));
            // Clamp in float (the cast of anything beyond i32 saturates
            // first, then the clamp; both end at +-127), NaN to 0.
            let r = _mm256_min_ps(
                _mm256_max_ps(r, _mm256_sub_ps(_mm256_setzero_ps(), lim)),
                lim,
            );
            let ordered = _mm256_cmp_ps(t, t, _CMP_ORD_Q);
            let r = _mm256_and_ps(r, ordered);
            q32[i] = _mm256_cvtps_epi32(r);
            sum = _mm256_add_epi32(sum, q32[i]);
        }
        // i32 -> i16 -> i8 with saturation (values are within +-127);
        // packs interleave 128-bit lanes, the permute restores the order.
        let p01 = _mm256_packs_epi32(q32[0], q32[1]);
        let p23 = _mm256_packs_epi32(q32[2], q32[3]);
        let p = _mm256_packs_epi16(p01, p23);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, p);
        (scale, hsum_epi32(sum))
    }

    /// Sum of the eight 32-bit integer lanes (exact).
    #[inline(always)]
    unsafe fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }

    /// 8 interleaved Q8_0 rows (`units`: one unit per block) against `N`
    /// quantized activation rows: row `r` times activation row `j`,
    /// computed as [`super::dot_q8_0_scalar`] does, at `out[j * stride + r]`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q8_0x8<const N: usize>(
        units: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        out: *mut f32,
        stride: usize,
    ) {
        q8_0x8::<N, false>(units, xq, xd, out, stride)
    }

    /// The loop of [`dot_q8_0x8`]; `VNNI` as for [`q4_1x8`].
    #[inline(always)]
    pub(super) unsafe fn q8_0x8<const N: usize, const VNNI: bool>(
        units: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        out: *mut f32,
        stride: usize,
    ) {
        let nb = units.len() / Q8_0X8_BYTES;
        for j in 0..N {
            debug_assert!(xq[j].len() >= nb * QK && xd[j].len() >= nb);
        }
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); N];
        let up = units.as_ptr();
        for b in 0..nb {
            let unit = up.add(b * Q8_0X8_BYTES);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(unit as *const __m128i));
            let mut isum = [_mm256_setzero_si256(); N];
            for p in 0..QK / 4 {
                let c = _mm256_loadu_si256(unit.add(16 + 32 * p) as *const __m256i);
                // maddubs and vpdpbusd want one unsigned operand: |w| times
                // x with w's sign. A maddubs pair's sum is at most
                // 2 * 128 * 127, within i16; two pairs are not, so each is
                // widened at once.
                let ca = _mm256_sign_epi8(c, c);
                for j in 0..N {
                    let xp = xq[j].as_ptr().add(b * QK + 4 * p);
                    let x = _mm256_set1_epi32(std::ptr::read_unaligned(xp as *const i32));
                    let xs = _mm256_sign_epi8(x, c);
                    isum[j] = if VNNI {
                        _mm256_dpbusd_epi32(isum[j], ca, xs)
                    } else {
                        let prod = _mm256_maddubs_epi16(ca, xs);
                        _mm256_add_epi32(isum[j], _mm256_madd_epi16(prod, ones))
                    };
                }
            }
            for j in 0..N {
                let scale = _mm256_mul_ps(d, _mm256_set1_ps(*xd[j].get_unchecked(b)));
                acc[j] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum[j]), acc[j]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(j * stride), *a);
        }
    }

    /// One plain Q8_0 row against `N` quantized activation rows (matrices
    /// whose rows do not come in groups of 8), computed as
    /// [`super::dot_q8_0_scalar`] does.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q8_0<const N: usize>(
        w: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
    ) -> [f32; N] {
        let nb = w.len() / Q8_0_BYTES;
        for j in 0..N {
            debug_assert!(xq[j].len() >= nb * QK && xd[j].len() >= nb);
        }
        let ones = _mm256_set1_epi16(1);
        let mut acc = [0.0f32; N];
        let wp = w.as_ptr();
        for b in 0..nb {
            let blk = wp.add(b * Q8_0_BYTES);
            let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                blk as *const u16,
            ) as i32)));
            let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            let wa = _mm256_sign_epi8(wv, wv);
            for j in 0..N {
                let xv = _mm256_loadu_si256(xq[j].as_ptr().add(b * QK) as *const __m256i);
                let xs = _mm256_sign_epi8(xv, wv);
                let isum = hsum_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wa, xs), ones));
                acc[j] = (dw * *xd[j].get_unchecked(b)).mul_add(isum as f32, acc[j]);
            }
        }
        acc
    }
}

/// The interleaved kernels with AVX-512 VNNI on 256-bit vectors: [`avx2`]'s
/// loops with each 4-value dot product of 8 rows one `vpdpbusd` (unsigned
/// weights or their magnitudes times signed activations, summed into the
/// row's 32-bit lane, exact). The integer block sums, and so every float
/// operation after them, are [`avx2`]'s.
#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::avx2;

    /// As [`avx2::dot_q4_1x8`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_q4_1x8<const N: usize>(
        units: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        xs: [&[f32]; N],
        out: *mut f32,
        stride: usize,
    ) {
        avx2::q4_1x8::<N, true>(units, xq, xd, xs, out, stride)
    }

    /// As [`avx2::dot_q8_0x8`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_q8_0x8<const N: usize>(
        units: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        out: *mut f32,
        stride: usize,
    ) {
        avx2::q8_0x8::<N, true>(units, xq, xd, out, stride)
    }
}

/// The interleaved kernels on 512-bit vectors, for CPUs with AVX-512 VNNI:
/// two units side by side (rows `8g..8g + 16`, lanes 0-7 from the first,
/// 8-15 from the second), so each `vpdpbusd`, broadcast and float operation
/// serves 16 weight rows instead of 8. Every lane performs [`avx2`]'s
/// operations on the same integers in the same order, so the bits are the
/// 8-row kernels' (and the scalar reference's).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Q4_1X8_BYTES, Q8_0X8_BYTES, QK};
    use std::arch::x86_64::*;

    /// 32 bytes at `off` of unit `a` in the low half, of unit `b` in the
    /// high half.
    #[inline(always)]
    unsafe fn pair(a: *const u8, b: *const u8, off: usize) -> __m512i {
        let lo = _mm256_loadu_si256(a.add(off) as *const __m256i);
        let hi = _mm256_loadu_si256(b.add(off) as *const __m256i);
        _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
    }

    /// The 8 f16 values at `off` of units `a` and `b`, widened: 16 lanes.
    #[inline(always)]
    unsafe fn pair_f16(a: *const u8, b: *const u8, off: usize) -> __m512 {
        let lo = _mm_loadu_si128(a.add(off) as *const __m128i);
        let hi = _mm_loadu_si128(b.add(off) as *const __m128i);
        _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1))
    }

    /// Two groups of 8 interleaved Q4_1 rows (`a`, `b`: one unit per block
    /// each, the same length) against `N` quantized activation rows: row
    /// `r` of the 16 times activation row `j`, computed as
    /// [`super::dot_q4_1_scalar`] does, at `out[j * stride + r]`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_q4_1x16<const N: usize>(
        a: &[u8],
        b: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        xs: [&[f32]; N],
        out: *mut f32,
        stride: usize,
    ) {
        let nb = a.len() / Q4_1X8_BYTES;
        debug_assert_eq!(a.len(), b.len());
        for j in 0..N {
            debug_assert!(xq[j].len() >= nb * QK && xd[j].len() >= nb && xs[j].len() >= nb);
        }
        let low = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); N];
        let mut macc = [_mm512_setzero_ps(); N];
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        for blk in 0..nb {
            let (ua, ub) = (pa.add(blk * Q4_1X8_BYTES), pb.add(blk * Q4_1X8_BYTES));
            let d = pair_f16(ua, ub, 0);
            let m = pair_f16(ua, ub, 16);
            let mut isum = [_mm512_setzero_si512(); N];
            for p in 0..4 {
                let c = pair(ua, ub, 32 + 32 * p);
                let w0 = _mm512_and_si512(c, low);
                let w1 = _mm512_and_si512(_mm512_srli_epi16(c, 4), low);
                for j in 0..N {
                    let xp = xq[j].as_ptr().add(blk * QK + 8 * p);
                    let x0 = _mm512_set1_epi32(std::ptr::read_unaligned(xp as *const i32));
                    let x1 = _mm512_set1_epi32(std::ptr::read_unaligned(xp.add(4) as *const i32));
                    isum[j] = _mm512_dpbusd_epi32(isum[j], w0, x0);
                    isum[j] = _mm512_dpbusd_epi32(isum[j], w1, x1);
                }
            }
            for j in 0..N {
                let dots = _mm512_cvtepi32_ps(isum[j]);
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(*xd[j].get_unchecked(blk)));
                acc[j] = _mm512_fmadd_ps(scale, dots, acc[j]);
                macc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(*xs[j].get_unchecked(blk)), macc[j]);
            }
        }
        for j in 0..N {
            _mm512_storeu_ps(out.add(j * stride), _mm512_add_ps(acc[j], macc[j]));
        }
    }

    /// Two groups of 8 interleaved Q8_0 rows against `N` quantized
    /// activation rows, computed as [`super::dot_q8_0_scalar`] does, at
    /// `out[j * stride + r]`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn dot_q8_0x16<const N: usize>(
        a: &[u8],
        b: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        out: *mut f32,
        stride: usize,
    ) {
        let nb = a.len() / Q8_0X8_BYTES;
        debug_assert_eq!(a.len(), b.len());
        for j in 0..N {
            debug_assert!(xq[j].len() >= nb * QK && xd[j].len() >= nb);
        }
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); N];
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        for blk in 0..nb {
            let (ua, ub) = (pa.add(blk * Q8_0X8_BYTES), pb.add(blk * Q8_0X8_BYTES));
            let d = pair_f16(ua, ub, 0);
            let mut isum = [_mm512_setzero_si512(); N];
            for p in 0..QK / 4 {
                let c = pair(ua, ub, 16 + 32 * p);
                // vpdpbusd wants one unsigned operand: |w| (-128 reads as
                // 128 unsigned) times x negated where w is negative. There
                // is no 512-bit vpsignb; where w is 0 the product is 0
                // either way, so the integer sums are avx2's.
                let ca = _mm512_abs_epi8(c);
                let neg = _mm512_movepi8_mask(c);
                for j in 0..N {
                    let xp = xq[j].as_ptr().add(blk * QK + 4 * p);
                    let x = _mm512_set1_epi32(std::ptr::read_unaligned(xp as *const i32));
                    let xs = _mm512_mask_sub_epi8(x, neg, zero, x);
                    isum[j] = _mm512_dpbusd_epi32(isum[j], ca, xs);
                }
            }
            for j in 0..N {
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(*xd[j].get_unchecked(blk)));
                acc[j] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum[j]), acc[j]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(j * stride), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random stream.
    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }

    /// Random blocks of `format` (the bytes only need to be valid blocks).
    fn random_blocks(format: Format, n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(n * k / QK * format.block_bytes());
        for _ in 0..n * k / QK {
            out.extend_from_slice(&f16::from_f32(lcg(seed).abs() * 0.05).to_le_bytes());
            match format {
                Format::Q4_1 | Format::Q4_1x8 => {
                    out.extend_from_slice(&f16::from_f32(lcg(seed) * 0.3).to_le_bytes());
                    for _ in 0..16 {
                        out.push(((lcg(seed) + 1.0) * 127.9) as u8);
                    }
                }
                Format::Q8_0 | Format::Q8_0x8 => {
                    for _ in 0..32 {
                        // The whole i8 range, -128 included.
                        out.push(((lcg(seed) + 1.0) * 127.9) as u8);
                    }
                }
            }
        }
        out
    }

    fn dequant_matrix(w: &WeightView<'_>) -> Vec<f32> {
        let k = w.k();
        let mut out = vec![0.0; w.n * k];
        for r in 0..w.n {
            w.dequantize_row(r, &mut out[r * k..(r + 1) * k]);
        }
        out
    }

    #[test]
    fn quantized_rows_round_trip_within_half_a_step() {
        let mut seed = 7;
        let x: Vec<f32> = (0..2 * 64).map(|_| lcg(&mut seed) * 3.0).collect();
        let mut q = Q8Rows::default();
        q.quantize(&x, 2, 64);
        for (i, &v) in x.iter().enumerate() {
            let d = q.d[i / QK];
            let back = q.qs[i] as f32 * d;
            assert!((back - v).abs() <= d * 0.5 + 1e-6, "{v} vs {back}");
        }
        for b in 0..4 {
            let sum: i32 = q.qs[b * QK..(b + 1) * QK].iter().map(|&v| v as i32).sum();
            assert_eq!(q.s[b], q.d[b] * sum as f32);
        }
        // A zero block quantizes to zeros with scale 0, not NaN.
        q.quantize(&[0.0; 32], 1, 32);
        assert_eq!(q.d[0], 0.0);
        assert!(q.qs.iter().all(|&v| v == 0));
    }

    #[test]
    fn activations_quantize_alike_on_every_path() {
        if isa() == Isa::Scalar {
            return; // nothing to compare the portable path with
        }
        let mut seed = 23;
        let mut blocks: Vec<[f32; QK]> = (0..2000)
            .map(|i| {
                let mut b = [0.0f32; QK];
                for v in b.iter_mut() {
                    *v = lcg(&mut seed) * [1.0, 1e-3, 1e3, 1e-38][i % 4];
                }
                b
            })
            .collect();
        // Exact halves after scaling (amax 127 gives scale 1): the ties
        // round away from zero.
        let mut ties = [0.0f32; QK];
        for (i, v) in ties.iter_mut().enumerate() {
            *v = (i as f32 - 16.0) + 0.5;
        }
        ties[0] = 127.0;
        blocks.push(ties);
        let mut odd = [0.0f32; QK];
        odd[..6].copy_from_slice(&[f32::NAN, -0.0, 1.0, -f32::INFINITY, 2.5, -2.5]);
        blocks.push(odd);
        blocks.push([0.0; QK]);
        let mut nan_led = [1.0f32; QK];
        nan_led[3] = f32::NAN;
        nan_led[9] = -7.0;
        blocks.push(nan_led);
        for b in &blocks {
            let (mut q1, mut q2) = ([0i8; QK], [0i8; QK]);
            let r1 = quantize_block(b, &mut q1);
            // SAFETY: the CPU has AVX2 (checked above).
            let r2 = unsafe { avx2::quantize_block(b, &mut q2) };
            assert_eq!(
                (r1.0.to_bits(), r1.1, q1),
                (r2.0.to_bits(), r2.1, q2),
                "{b:?}"
            );
        }
    }

    #[test]
    fn dequantize_row_matches_the_block_formulas() {
        let mut blk = vec![0u8; Q4_1_BYTES];
        blk[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        blk[2..4].copy_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        blk[4] = 0x3A; // value 0 = 0xA, value 16 = 0x3
        let w = WeightView::new(Format::Q4_1, &blk, 1, 32).unwrap();
        let mut out = [0.0; 32];
        w.dequantize_row(0, &mut out);
        assert_eq!((out[0], out[16], out[1]), (4.0, 0.5, -1.0));
        let mut blk = vec![0u8; Q8_0_BYTES];
        blk[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        blk[2] = 0x80; // -128
        blk[3] = 7;
        let w = WeightView::new(Format::Q8_0, &blk, 1, 32).unwrap();
        w.dequantize_row(0, &mut out);
        assert_eq!((out[0], out[1], out[2]), (-32.0, 1.75, 0.0));
    }

    /// Plain rows `r` of a matrix for the scalar reference.
    fn plain_row(plain: &[u8], format: Format, k: usize, r: usize) -> &[u8] {
        let len = k / QK * format.block_bytes();
        &plain[r * len..(r + 1) * len]
    }

    /// The plain format a format is packed from.
    fn plain_of(format: Format) -> Format {
        match format {
            Format::Q4_1 | Format::Q4_1x8 => Format::Q4_1,
            Format::Q8_0 | Format::Q8_0x8 => Format::Q8_0,
        }
    }

    /// `plain` in `format` (packed when it interleaves).
    fn packed(format: Format, plain: &[u8], n: usize, k: usize) -> Vec<u8> {
        match format {
            Format::Q4_1x8 => pack_q4_1_x8(plain, n, k).unwrap(),
            Format::Q8_0x8 => pack_q8_0_x8(plain, n, k).unwrap(),
            Format::Q4_1 | Format::Q8_0 => plain.to_vec(),
        }
    }

    const FORMATS: [Format; 4] = [Format::Q4_1, Format::Q4_1x8, Format::Q8_0, Format::Q8_0x8];

    #[test]
    fn kernels_match_f32_reference_and_scalar_path() {
        for format in FORMATS {
            let plain_format = plain_of(format);
            let mut seed = 42;
            for &(n, k, m) in &[(8, 32, 1), (40, 576, 1), (64, 1536, 3), (40, 576, 9)] {
                let plain = random_blocks(plain_format, n, k, &mut seed);
                let bytes = packed(format, &plain, n, k);
                let w = WeightView::new(format, &bytes, n, k).unwrap();
                let dense = dequant_matrix(&w);
                assert_eq!(
                    dense,
                    dequant_matrix(&WeightView::new(plain_format, &plain, n, k).unwrap()),
                    "{format:?}: packing keeps every value"
                );
                let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
                let mut out = vec![0.0; m * n];
                matmul(&w, &x, m, &mut out);
                let mut q = Q8Rows::default();
                q.quantize(&x, m, k);
                let nb = k / QK;
                for i in 0..m {
                    let (xq, xd, xs) = (
                        &q.qs[i * k..(i + 1) * k],
                        &q.d[i * nb..(i + 1) * nb],
                        &q.s[i * nb..(i + 1) * nb],
                    );
                    for r in 0..n {
                        let prods = (0..k).map(|c| dense[r * k + c] * x[i * k + c]);
                        let exact: f32 = prods.clone().sum();
                        let mag: f32 = prods.map(f32::abs).sum::<f32>().max(1.0);
                        let row = plain_row(&plain, plain_format, k, r);
                        let got = out[i * n + r];
                        // Every path of a format performs the same operations.
                        let scalar = if plain_format == Format::Q4_1 {
                            dot_q4_1_scalar(row, xq, xd, xs)
                        } else {
                            dot_q8_0_scalar(row, xq, xd)
                        };
                        assert_eq!(
                            got.to_bits(),
                            scalar.to_bits(),
                            "{format:?} n={n} k={k} row {r} seq {i}: kernel {got} vs scalar {scalar}"
                        );
                        // Against f32 activations: the 8-bit quantization error.
                        assert!(
                            (got - exact).abs() <= 0.02 * mag,
                            "{format:?} n={n} k={k} row {r} seq {i}: kernel {got} vs exact {exact}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn every_instruction_set_gets_the_same_bits() {
        let isas: &[Isa] = match isa() {
            Isa::Vnni => &[Isa::Vnni, Isa::Avx2, Isa::Scalar],
            Isa::Avx2 => &[Isa::Avx2, Isa::Scalar],
            Isa::Scalar => return, // nothing to compare the portable path with
        };
        for format in FORMATS {
            let mut seed = 17;
            let (n, k, m) = (24, 192, 5);
            let bytes = packed(
                format,
                &random_blocks(plain_of(format), n, k, &mut seed),
                n,
                k,
            );
            let w = WeightView::new(format, &bytes, n, k).unwrap();
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
            let mut q = Q8Rows::default();
            q.quantize(&x, m, k);
            let bits = |isa: Isa| {
                let mut out = vec![0.0f32; m * n];
                // SAFETY: one call writes the whole m x n output; `isas`
                // holds only what this CPU has.
                unsafe { product_rows(isa, &w, &q, 0, 0..n, OutPtr(out.as_mut_ptr())) };
                out.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
            };
            for &other in &isas[1..] {
                assert_eq!(
                    bits(isas[0]),
                    bits(other),
                    "{format:?}: {:?} vs {other:?}",
                    isas[0]
                );
            }
        }
    }

    #[test]
    fn packing_needs_whole_groups_of_eight_rows() {
        let mut seed = 5;
        let plain = random_blocks(Format::Q4_1, 12, 64, &mut seed);
        assert!(pack_q4_1_x8(&plain, 12, 64).is_none());
        assert!(pack_q4_1_x8(&plain[..8 * 2 * Q4_1_BYTES], 8, 64).is_some());
        assert!(WeightView::new(Format::Q4_1x8, &plain, 12, 64).is_none());
        let plain = random_blocks(Format::Q8_0, 12, 64, &mut seed);
        assert!(pack_q8_0_x8(&plain, 12, 64).is_none());
        assert!(pack_q8_0_x8(&plain[..8 * 2 * Q8_0_BYTES], 8, 64).is_some());
        assert!(WeightView::new(Format::Q8_0x8, &plain, 12, 64).is_none());
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
        for format in FORMATS {
            let mut seed = 3;
            let (n, k) = (296, 576);
            let bytes = packed(
                format,
                &random_blocks(plain_of(format), n, k, &mut seed),
                n,
                k,
            );
            let w = WeightView::new(format, &bytes, n, k).unwrap();
            let x: Vec<f32> = (0..11 * k).map(|_| lcg(&mut seed)).collect();
            let mut batch = vec![0.0; 11 * n];
            matmul(&w, &x, 11, &mut batch);
            for i in 0..11 {
                let mut alone = vec![0.0; n];
                matmul(&w, &x[i * k..(i + 1) * k], 1, &mut alone);
                assert_eq!(alone, batch[i * n..(i + 1) * n], "{format:?} row {i}");
            }
        }
    }

    #[test]
    fn packed_column_slices_give_the_bits_of_plain_ones() {
        for (plain_format, x8) in [
            (Format::Q4_1, Format::Q4_1x8),
            (Format::Q8_0, Format::Q8_0x8),
        ] {
            packed_column_slices(plain_format, x8);
        }
    }

    fn packed_column_slices(plain_format: Format, x8: Format) {
        let mut seed = 11;
        let (n, k, m) = (48, 192, 5);
        let plain = random_blocks(plain_format, n, k, &mut seed);
        let interleaved = packed(x8, &plain, n, k);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        for cols in [0..64, 64..192, 32..96] {
            let mut outs = Vec::new();
            for (format, bytes) in [(plain_format, &plain), (x8, &interleaved)] {
                let w = WeightView::cols(format, bytes, n, k, cols.clone()).unwrap();
                let mut out = vec![0.0; m * n];
                matmul_fused(
                    &x,
                    m,
                    k,
                    &mut [Task {
                        w,
                        col: cols.start,
                        out: &mut out,
                    }],
                );
                outs.push(out);
            }
            assert_eq!(outs[0], outs[1], "{x8:?} columns {cols:?}");
        }
    }

    #[test]
    fn fused_column_parts_equal_separate_products_of_copied_columns() {
        let mut seed = 9;
        let (n, k) = (700, 128);
        let bytes = random_blocks(Format::Q4_1, n, k, &mut seed);
        let x: Vec<f32> = (0..2 * k).map(|_| lcg(&mut seed)).collect();
        let left = WeightView::cols(Format::Q4_1, &bytes, n, k, 0..64).unwrap();
        let right = WeightView::cols(Format::Q4_1, &bytes, n, k, 64..128).unwrap();
        let (mut a0, mut a1) = (vec![0.0; 2 * n], vec![0.0; 2 * n]);
        matmul_fused(
            &x,
            2,
            k,
            &mut [
                Task {
                    w: left,
                    col: 0,
                    out: &mut a0,
                },
                Task {
                    w: right,
                    col: 64,
                    out: &mut a1,
                },
            ],
        );
        let copy: Vec<u8> = (0..n)
            .flat_map(|r| bytes[r * 80 + 40..r * 80 + 80].to_vec())
            .collect();
        let whole = WeightView::new(Format::Q4_1, &copy, n, 64).unwrap();
        let xr: Vec<f32> = (0..2)
            .flat_map(|i| x[i * k + 64..(i + 1) * k].to_vec())
            .collect();
        let mut b1 = vec![0.0; 2 * n];
        matmul(&whole, &xr, 2, &mut b1);
        assert_eq!(a1, b1);
        let xl: Vec<f32> = (0..2).flat_map(|i| x[i * k..i * k + 64].to_vec()).collect();
        let mut b0 = vec![0.0; 2 * n];
        matmul(&left, &xl, 2, &mut b0);
        assert_eq!(a0, b0);
        assert!(WeightView::cols(Format::Q4_1, &bytes, n, k, 16..64).is_none());
        assert!(WeightView::new(Format::Q4_1, &bytes[1..], n, k).is_none());
    }
}
