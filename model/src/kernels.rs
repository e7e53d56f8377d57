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
//! The AVX2 path unpacks each weight block once and multiplies it with every
//! activation row of the step (up to [`ROWS_PER_PASS`] at a time, the rest
//! while the weight row is still in L1), so a batch of sequences reads the
//! weights once per step instead of once per sequence. Rows of the weight
//! matrix are spread over [`crate::pool`]'s threads.
//!
//! Every output element is computed by the same sequence of floating-point
//! operations whatever the batch size, the number of threads or the row
//! range a thread gets, so a sequence decoded alone gives the same bits as in
//! a batch, and TP=1 the same bits as TP=2. The scalar path (CPUs without
//! AVX2/FMA/F16C) does the same arithmetic in a different order: it agrees
//! with the AVX2 path within float rounding, not bit for bit.

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
const ROWS_PER_TASK: usize = 8;

/// The instruction set the kernels use on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX2 + FMA + F16C.
    Avx2,
    /// Portable Rust.
    Scalar,
}

/// Detected once per process.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    })
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
        for ((xb, qb), (d, s)) in x
            .chunks_exact(QK)
            .zip(self.qs.chunks_exact_mut(QK))
            .zip(self.d.iter_mut().zip(self.s.iter_mut()))
        {
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
            *d = scale;
            *s = scale * sum as f32;
        }
    }
}

/// The weight block formats the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// f16 `d`, f16 `m`, 16 bytes of nibbles (low nibbles are values 0..16).
    Q4_1,
    /// f16 `d`, 32 signed bytes.
    Q8_0,
}

impl Format {
    /// Bytes per block of [`QK`] values.
    pub fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => Q4_1_BYTES,
            Format::Q8_0 => Q8_0_BYTES,
        }
    }
}

/// Bytes of one Q8_0 block.
pub const Q8_0_BYTES: usize = 34;

/// A weight matrix `(n, k)` in GGML block layout, possibly a column slice
/// of a wider one: row `r` is `blocks` blocks starting at byte
/// `offset + r * stride`.
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
    /// Bytes from one row to the next.
    pub stride: usize,
    /// Byte offset of the first block used in row 0.
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
        if !k.is_multiple_of(QK)
            || !cols.start.is_multiple_of(QK)
            || !cols.end.is_multiple_of(QK)
            || cols.end > k
        {
            return None;
        }
        let bb = format.block_bytes();
        let stride = k / QK * bb;
        if data.len() != n * stride || cols.is_empty() {
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

    fn row(&self, r: usize) -> &'a [u8] {
        let at = self.offset + r * self.stride;
        &self.data[at..at + self.blocks * self.format.block_bytes()]
    }

    /// Row `r` as f32 (the embedding lookup).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let bb = self.format.block_bytes();
        for (blk, o) in self.row(r).chunks_exact(bb).zip(out.chunks_exact_mut(QK)) {
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            match self.format {
                Format::Q8_0 => {
                    for (v, &q) in o.iter_mut().zip(&blk[2..]) {
                        *v = d * (q as i8) as f32;
                    }
                }
                Format::Q4_1 => {
                    let m = f16::from_le_bytes([blk[2], blk[3]]).to_f32();
                    for j in 0..QK / 2 {
                        o[j] = d * (blk[4 + j] & 0x0F) as f32 + m;
                        o[j + QK / 2] = d * (blk[4 + j] >> 4) as f32 + m;
                    }
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
                for r in first..(first + ROWS_PER_TASK).min(w.n) {
                    let wr = w.row(r);
                    let mut i = 0;
                    while i < m {
                        let take = (m - i).min(ROWS_PER_PASS);
                        let mut res = [0.0f32; ROWS_PER_PASS];
                        dot_rows(isa, w.format, wr, q, blk0, i, take, &mut res);
                        for (a, v) in res[..take].iter().enumerate() {
                            // SAFETY: (i + a, r) is inside this product's
                            // m x n output and only this unit writes row r.
                            unsafe { *ptr.0.add((i + a) * w.n + r) = *v };
                        }
                        i += take;
                    }
                }
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

/// Dots of one weight row with activation rows `first..first + take`,
/// starting at activation block `blk0`.
#[allow(clippy::too_many_arguments)]
fn dot_rows(
    isa: Isa,
    format: Format,
    w: &[u8],
    q: &Q8Rows,
    blk0: usize,
    first: usize,
    take: usize,
    out: &mut [f32],
) {
    let nb = q.k / QK;
    let xq = |j: usize| &q.qs[(first + j) * q.k + blk0 * QK..(first + j + 1) * q.k];
    let xd = |j: usize| &q.d[(first + j) * nb + blk0..(first + j + 1) * nb];
    let xs = |j: usize| &q.s[(first + j) * nb + blk0..(first + j + 1) * nb];
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            macro_rules! call {
                ($n:literal, $($j:literal),*) => {{
                    // SAFETY: isa() checked AVX2, FMA and F16C; every slice
                    // holds at least the row's blocks.
                    let r = unsafe {
                        match format {
                            Format::Q4_1 => avx2::dot_q4_1::<$n>(w, [$(xq($j)),*], [$(xd($j)),*], [$(xs($j)),*]),
                            Format::Q8_0 => avx2::dot_q8_0::<$n>(w, [$(xq($j)),*], [$(xd($j)),*]),
                        }
                    };
                    out[..$n].copy_from_slice(&r);
                }};
            }
            match take {
                1 => call!(1, 0),
                2 => call!(2, 0, 1),
                3 => call!(3, 0, 1, 2),
                _ => call!(4, 0, 1, 2, 3),
            }
        }
        _ => {
            for (j, o) in out[..take].iter_mut().enumerate() {
                *o = match format {
                    Format::Q4_1 => dot_q4_1_scalar(w, xq(j), xd(j), xs(j)),
                    Format::Q8_0 => dot_q8_0_scalar(w, xq(j), xd(j)),
                };
            }
        }
    }
}

/// The reference: one Q8_0 row against one quantized activation row.
pub fn dot_q8_0_scalar(w: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let mut sum = 0.0f32;
    for (b, blk) in w.chunks_exact(Q8_0_BYTES).enumerate() {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let x = &xq[b * QK..(b + 1) * QK];
        let isum: i32 = blk[2..]
            .iter()
            .zip(x)
            .map(|(&w, &x)| (w as i8) as i32 * x as i32)
            .sum();
        sum += d * xd[b] * isum as f32;
    }
    sum
}

/// The reference: one Q4_1 row against one quantized activation row.
pub fn dot_q4_1_scalar(w: &[u8], xq: &[i8], xd: &[f32], xs: &[f32]) -> f32 {
    let mut sum = 0.0f32;
    for (b, blk) in w.chunks_exact(Q4_1_BYTES).enumerate() {
        let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let m = f16::from_le_bytes([blk[2], blk[3]]).to_f32();
        let x = &xq[b * QK..(b + 1) * QK];
        let mut isum = 0i32;
        for j in 0..QK / 2 {
            let lo = (blk[4 + j] & 0x0F) as i32;
            let hi = (blk[4 + j] >> 4) as i32;
            isum += lo * x[j] as i32 + hi * x[j + QK / 2] as i32;
        }
        sum += d * xd[b] * isum as f32 + m * xs[b];
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Q4_1_BYTES, Q8_0_BYTES, QK};
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// One Q4_1 row against `N` quantized activation rows; each result is
    /// computed by the same operations whatever `N` is.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_1<const N: usize>(
        w: &[u8],
        xq: [&[i8]; N],
        xd: [&[f32]; N],
        xs: [&[f32]; N],
    ) -> [f32; N] {
        let nb = w.len() / Q4_1_BYTES;
        for j in 0..N {
            debug_assert!(xq[j].len() >= nb * QK && xd[j].len() >= nb && xs[j].len() >= nb);
        }
        let low = _mm_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); N];
        let mut mins = [0.0f32; N];
        let wp = w.as_ptr();
        for b in 0..nb {
            let blk = wp.add(b * Q4_1_BYTES);
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                blk as *const i32,
            )));
            let dw = _mm_cvtss_f32(dm);
            let mw = _mm_cvtss_f32(_mm_movehdup_ps(dm));
            let q = _mm_loadu_si128(blk.add(4) as *const __m128i);
            let lo = _mm_and_si128(q, low);
            let hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
            let wv = _mm256_set_m128i(hi, lo);
            for j in 0..N {
                let xv = _mm256_loadu_si256(xq[j].as_ptr().add(b * QK) as *const __m256i);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones);
                let scale = _mm256_set1_ps(dw * *xd[j].get_unchecked(b));
                acc[j] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), acc[j]);
                mins[j] += mw * *xs[j].get_unchecked(b);
            }
        }
        let mut out = [0.0f32; N];
        for j in 0..N {
            out[j] = hsum(acc[j]) + mins[j];
        }
        out
    }

    /// One Q8_0 row against `N` quantized activation rows.
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
        let mut acc = [_mm256_setzero_ps(); N];
        let wp = w.as_ptr();
        for b in 0..nb {
            let blk = wp.add(b * Q8_0_BYTES);
            let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                blk as *const u16,
            ) as i32)));
            let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
            // maddubs wants one unsigned operand: |w| times x with w's sign.
            let wa = _mm256_sign_epi8(wv, wv);
            for j in 0..N {
                let xv = _mm256_loadu_si256(xq[j].as_ptr().add(b * QK) as *const __m256i);
                let xs = _mm256_sign_epi8(xv, wv);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xs), ones);
                let scale = _mm256_set1_ps(dw * *xd[j].get_unchecked(b));
                acc[j] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(p), acc[j]);
            }
        }
        let mut out = [0.0f32; N];
        for j in 0..N {
            out[j] = hsum(acc[j]);
        }
        out
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
                Format::Q4_1 => {
                    out.extend_from_slice(&f16::from_f32(lcg(seed) * 0.3).to_le_bytes());
                    for _ in 0..16 {
                        out.push(((lcg(seed) + 1.0) * 127.9) as u8);
                    }
                }
                Format::Q8_0 => {
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

    #[test]
    fn kernels_match_f32_reference_and_scalar_path() {
        for format in [Format::Q4_1, Format::Q8_0] {
            let mut seed = 42;
            for &(n, k, m) in &[(8, 32, 1), (37, 576, 1), (64, 1536, 3), (40, 576, 9)] {
                let bytes = random_blocks(format, n, k, &mut seed);
                let w = WeightView::new(format, &bytes, n, k).unwrap();
                let dense = dequant_matrix(&w);
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
                        let scalar = match format {
                            Format::Q4_1 => dot_q4_1_scalar(w.row(r), xq, xd, xs),
                            Format::Q8_0 => dot_q8_0_scalar(w.row(r), xq, xd),
                        };
                        let got = out[i * n + r];
                        // Same quantized inputs: only summation order differs.
                        assert!(
                            (got - scalar).abs() <= 1e-5 * mag,
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
    fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
        for format in [Format::Q4_1, Format::Q8_0] {
            let mut seed = 3;
            let (n, k) = (300, 576);
            let bytes = random_blocks(format, n, k, &mut seed);
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
