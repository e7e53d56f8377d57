//! The vector loops between the matmuls (attention's dot products and
//! weighted sums over the KV cache, its f16 conversions, the norms, SwiGLU
//! and the residual adds), compiled once for baseline x86-64 and once for
//! AVX2 + FMA + F16C, and picked at run time with the kernels' instruction
//! set ([`crate::kernels::isa`]).
//!
//! Why: the README's build is portable (baseline x86-64), and outside a
//! function that enables them the compiler may use neither 256-bit vectors
//! nor the F16C conversions. The `half` crate then converts every cached
//! key and value with a run-time feature check and a call per element,
//! which made attention most of a batched step's time (issue 44: the
//! portable build had half a native build's throughput at 8 streams).
//!
//! **Same bits on every path.** Each loop performs the same float operations
//! in the same order whichever set runs it: the dot product keeps eight
//! running sums (lane `j` adds the products of elements `j`, `j + 8`, ...)
//! and combines them as `((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 +
//! s7))`; the weighted sum is a multiply then an add per element (no fused
//! multiply-add: Rust never contracts `a * b + c`, and the vector path does
//! not either); f16 to f32 is exact, and f32 to f16 rounds to nearest even
//! on both paths. So a batch, a CPU and a build never change a token.

use crate::kernels::{isa, Isa};
use half::f16;

/// Elements the KV cache can hold.
pub(crate) trait KvElem: Copy + Default + Send + Sync {
    fn store(x: f32) -> Self;
    fn load(self) -> f32;
    /// The elements as floats when they are floats already (read in place,
    /// no widening copy).
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// Eight elements from `p` as floats.
    ///
    /// # Safety
    /// `p` points to 8 readable elements; the caller enables AVX and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Eight floats stored at `p`.
    ///
    /// # Safety
    /// `p` points to 8 writable elements; the caller enables AVX and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store8(p: *mut Self, v: std::arch::x86_64::__m256);
}

impl KvElem for f32 {
    #[inline(always)]
    fn store(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn load(self) -> f32 {
        self
    }
    #[inline(always)]
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut Self, v: std::arch::x86_64::__m256) {
        std::arch::x86_64::_mm256_storeu_ps(p, v)
    }
}

/// An f16 stored as its bits.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub(crate) struct F16Bits(pub(crate) u16);

impl KvElem for F16Bits {
    #[inline(always)]
    fn store(x: f32) -> Self {
        F16Bits(f16::from_f32(x).to_bits())
    }
    #[inline(always)]
    fn load(self) -> f32 {
        f16::from_bits(self.0).to_f32()
    }
    #[inline(always)]
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut Self, v: std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        // Round to nearest even, as `f16::from_f32` does.
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm_storeu_si128(p as *mut __m128i, h)
    }
}

/// The loops' primitive operations, one implementation per instruction
/// set; the loops themselves are written once over this trait.
pub(crate) trait Lanes {
    /// `sum(a[i] * b[i])` in the order the module's documentation states.
    fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32;
    /// `o[i] += w * v[i]`.
    fn axpy<E: KvElem>(o: &mut [f32], w: f32, v: &[E]);
    /// [`Lanes::dot`] of `a` with four rows at once.
    fn dot4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        b.map(|b| Self::dot(a, b))
    }
    /// [`Lanes::axpy`] of `o` with each `(w, row)` in turn: `rows` holds
    /// `w.len()` rows of `o.len()` values.
    fn axpy_rows(o: &mut [f32], w: &[f32], rows: &[f32]) {
        for (&w, v) in w.iter().zip(rows.chunks_exact(o.len())) {
            Self::axpy(o, w, v);
        }
    }
    /// `d[i] = E::store(s[i])`.
    fn convert<E: KvElem>(d: &mut [E], s: &[f32]);
    /// `d[i] = s[i].load()` (exact).
    fn widen<E: KvElem>(d: &mut [f32], s: &[E]);
}

/// Baseline x86-64 (or any other architecture).
pub(crate) struct Portable;

impl Lanes for Portable {
    #[inline(always)]
    fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
        let mut acc = [0.0f32; 8];
        let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
        let mut sum: f32 = ac
            .remainder()
            .iter()
            .zip(bc.remainder())
            .map(|(x, y)| x * y.load())
            .sum();
        for (x, y) in ac.zip(bc) {
            for j in 0..8 {
                acc[j] += x[j] * y[j].load();
            }
        }
        sum += ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        sum
    }

    #[inline(always)]
    fn axpy<E: KvElem>(o: &mut [f32], w: f32, v: &[E]) {
        for (a, &b) in o.iter_mut().zip(v) {
            *a += w * b.load();
        }
    }

    #[inline(always)]
    fn convert<E: KvElem>(d: &mut [E], s: &[f32]) {
        for (d, &s) in d.iter_mut().zip(s) {
            *d = E::store(s);
        }
    }

    #[inline(always)]
    fn widen<E: KvElem>(d: &mut [f32], s: &[E]) {
        for (d, &s) in d.iter_mut().zip(s) {
            *d = s.load();
        }
    }
}

/// AVX2 + FMA + F16C: only inlined into functions that enable them (see
/// [`dispatch!`]).
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2 {
    #[inline(always)]
    fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
        use std::arch::x86_64::*;
        let n = a.len().min(b.len());
        let whole = n / 8 * 8;
        let mut sum: f32 = a[whole..n]
            .iter()
            .zip(&b[whole..n])
            .map(|(x, y)| x * y.load())
            .sum();
        // SAFETY: every load reads 8 elements below `whole`; the caller
        // enabled AVX and F16C (this type is only used under `dispatch!`).
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for c in (0..whole).step_by(8) {
                let x = _mm256_loadu_ps(a.as_ptr().add(c));
                let y = E::load8(b.as_ptr().add(c));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
            }
            // [s0 + s4, s1 + s5, s2 + s6, s3 + s7]
            let pairs = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
            let mut p = [0.0f32; 4];
            _mm_storeu_ps(p.as_mut_ptr(), pairs);
            sum += (p[0] + p[1]) + (p[2] + p[3]);
        }
        sum
    }

    #[inline(always)]
    fn axpy<E: KvElem>(o: &mut [f32], w: f32, v: &[E]) {
        use std::arch::x86_64::*;
        let n = o.len().min(v.len());
        let whole = n / 8 * 8;
        // SAFETY: as in `dot`; the stores write 8 elements below `whole`.
        unsafe {
            let wv = _mm256_set1_ps(w);
            for c in (0..whole).step_by(8) {
                let p = o.as_mut_ptr().add(c);
                let y = E::load8(v.as_ptr().add(c));
                _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(wv, y)));
            }
        }
        for (a, &b) in o[whole..n].iter_mut().zip(&v[whole..n]) {
            *a += w * b.load();
        }
    }

    #[inline(always)]
    fn dot4(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
        use std::arch::x86_64::*;
        let n = b.iter().fold(a.len(), |n, b| n.min(b.len()));
        if !n.is_multiple_of(8) {
            return b.map(|b| Self::dot(a, b));
        }
        // SAFETY: every load reads 8 elements below `n`; AVX is enabled
        // (this type is only used under `dispatch!`).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 4];
            for c in (0..n).step_by(8) {
                let x = _mm256_loadu_ps(a.as_ptr().add(c));
                for j in 0..4 {
                    let y = _mm256_loadu_ps(b[j].as_ptr().add(c));
                    acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(x, y));
                }
            }
            // Per row: [s0 + s4, s1 + s5, s2 + s6, s3 + s7], then two
            // horizontal adds give ((s0 + s4) + (s1 + s5)) + ((s2 + s6) +
            // (s3 + s7)) in lane j for row j, as `dot` adds them.
            let t =
                acc.map(|v| _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v)));
            let h01 = _mm_hadd_ps(t[0], t[1]);
            let h23 = _mm_hadd_ps(t[2], t[3]);
            let r = _mm_hadd_ps(h01, h23);
            let mut out = [0.0f32; 4];
            _mm_storeu_ps(out.as_mut_ptr(), r);
            // `dot` starts from the empty remainder's sum (-0.0 or 0.0) and
            // adds the lanes to it: x + 0.0 is x unless x is -0.0.
            let zero: f32 = [0.0f32; 0].iter().sum();
            out.map(|x| zero + x)
        }
    }

    #[inline(always)]
    fn axpy_rows(o: &mut [f32], w: &[f32], rows: &[f32]) {
        use std::arch::x86_64::*;
        let d = o.len();
        if !d.is_multiple_of(32) || rows.len() < w.len() * d {
            for (&w, v) in w.iter().zip(rows.chunks_exact(d.max(1))) {
                Self::axpy(o, w, v);
            }
            return;
        }
        // 32 columns of `o` held in registers while every row adds to
        // them, in row order: the operations of one `axpy` per row.
        // SAFETY: reads and writes stay below `d` in `o` and each row.
        unsafe {
            for c in (0..d).step_by(32) {
                let op = o.as_mut_ptr().add(c);
                let mut acc = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(op.add(i)));
                for (r, &w) in w.iter().enumerate() {
                    let wv = _mm256_set1_ps(w);
                    let vp = rows.as_ptr().add(r * d + c);
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let y = _mm256_loadu_ps(vp.add(8 * i));
                        *acc = _mm256_add_ps(*acc, _mm256_mul_ps(wv, y));
                    }
                }
                for (i, acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(op.add(8 * i), *acc);
                }
            }
        }
    }

    #[inline(always)]
    fn convert<E: KvElem>(d: &mut [E], s: &[f32]) {
        use std::arch::x86_64::*;
        let n = d.len().min(s.len());
        let whole = n / 8 * 8;
        // SAFETY: as in `axpy`.
        unsafe {
            for c in (0..whole).step_by(8) {
                E::store8(d.as_mut_ptr().add(c), _mm256_loadu_ps(s.as_ptr().add(c)));
            }
        }
        for (d, &s) in d[whole..n].iter_mut().zip(&s[whole..n]) {
            *d = E::store(s);
        }
    }

    #[inline(always)]
    fn widen<E: KvElem>(d: &mut [f32], s: &[E]) {
        use std::arch::x86_64::*;
        let n = d.len().min(s.len());
        let whole = n / 8 * 8;
        // SAFETY: as in `axpy`.
        unsafe {
            for c in (0..whole).step_by(8) {
                _mm256_storeu_ps(d.as_mut_ptr().add(c), E::load8(s.as_ptr().add(c)));
            }
        }
        for (d, &s) in d[whole..n].iter_mut().zip(&s[whole..n]) {
            *d = s.load();
        }
    }
}

/// Whether the AVX2 versions run: decided once, with the matmul kernels
/// (`TTW_KERNELS_ISA=scalar` makes both portable, to compare them).
#[inline]
pub(crate) fn use_avx2() -> bool {
    cfg!(target_arch = "x86_64") && isa() != Isa::Scalar
}

/// Defines `$name` (dispatching), `$body` its one source, generic over
/// [`Lanes`], and an AVX2 instance compiled with those features enabled so
/// that every loop inlined into it (the primitives, and the plain loops the
/// compiler vectorizes) gets the wider instructions.
macro_rules! dispatch {
    ($(#[$doc:meta])* $vis:vis fn $name:ident $(<$($g:ident: $b:path),*>)? ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:ident) => {
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2 $(<$($g: $b),*>)? ($($arg: $ty),*) $(-> $ret)? {
                    $body::<$crate::lanes::Avx2 $(, $($g),*)?>($($arg),*)
                }
                if $crate::lanes::use_avx2() {
                    // SAFETY: use_avx2() saw AVX2, FMA and F16C on this CPU.
                    return unsafe { avx2 $(::<$($g),*>)? ($($arg),*) };
                }
            }
            $body::<$crate::lanes::Portable $(, $($g),*)?>($($arg),*)
        }
    };
}
pub(crate) use dispatch;

dispatch! {
    /// `x[i] += y[i]`.
    pub(crate) fn add_into(x: &mut [f32], y: &[f32]) => add_into_body
}

#[inline(always)]
fn add_into_body<L: Lanes>(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

dispatch! {
    /// Row-wise RMSNorm of `x` (rows of `w.len()`) into `out`.
    pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) => rms_norm_body
}

#[inline(always)]
fn rms_norm_body<L: Lanes>(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        // One running sum, in order: the same on every path.
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    }
}

dispatch! {
    /// `out[i] = silu(g[i]) * u[i]`.
    pub(crate) fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) => swiglu_body
}

#[inline(always)]
fn swiglu_body<L: Lanes>(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

dispatch! {
    /// `d[i] = E::store(s[i])`: keys or values into the cache.
    pub(crate) fn store_row<E: KvElem>(d: &mut [E], s: &[f32]) => store_row_body
}

#[inline(always)]
fn store_row_body<L: Lanes, E: KvElem>(d: &mut [E], s: &[f32]) {
    L::convert(d, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
    }

    fn values(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n).map(|_| lcg(seed)).collect()
    }

    fn avx2_here() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The AVX2 primitives against the portable ones, bit for bit, on the
    /// head widths models use and on lengths with a remainder.
    #[test]
    fn every_primitive_gives_the_portable_bits() {
        if !avx2_here() {
            eprintln!("skipped: this CPU lacks AVX2/FMA/F16C");
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn dot_avx2<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
                Avx2::dot(a, b)
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn axpy_avx2<E: KvElem>(o: &mut [f32], w: f32, v: &[E]) {
                Avx2::axpy(o, w, v)
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn dot4_avx2(a: &[f32], b: [&[f32]; 4]) -> [f32; 4] {
                Avx2::dot4(a, b)
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn axpy_rows_avx2(o: &mut [f32], w: &[f32], rows: &[f32]) {
                Avx2::axpy_rows(o, w, rows)
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn widen_avx2<E: KvElem>(d: &mut [f32], s: &[E]) {
                Avx2::widen(d, s)
            }
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn convert_avx2<E: KvElem>(d: &mut [E], s: &[f32]) {
                Avx2::convert(d, s)
            }
            let mut seed = 7;
            for n in [1, 7, 8, 13, 32, 64, 80, 96, 128, 131] {
                let a = values(n, &mut seed);
                let b = values(n, &mut seed);
                let bh: Vec<F16Bits> = b.iter().map(|&x| F16Bits::store(x)).collect();
                // SAFETY: avx2_here() checked the features.
                unsafe {
                    assert_eq!(
                        dot_avx2(&a, &b).to_bits(),
                        Portable::dot(&a, &b).to_bits(),
                        "f32 dot, n={n}"
                    );
                    assert_eq!(
                        dot_avx2(&a, &bh).to_bits(),
                        Portable::dot(&a, &bh).to_bits(),
                        "f16 dot, n={n}"
                    );
                    let rows4: Vec<Vec<f32>> = (0..4).map(|_| values(n, &mut seed)).collect();
                    let r4 = [&rows4[0][..], &rows4[1][..], &rows4[2][..], &rows4[3][..]];
                    let got = dot4_avx2(&a, r4);
                    for j in 0..4 {
                        assert_eq!(
                            got[j].to_bits(),
                            Portable::dot(&a, r4[j]).to_bits(),
                            "dot4, n={n}"
                        );
                    }
                    let ws = values(5, &mut seed);
                    let rows = values(5 * n, &mut seed);
                    let (mut o1, mut o2) = (a.clone(), a.clone());
                    axpy_rows_avx2(&mut o1, &ws, &rows);
                    Portable::axpy_rows(&mut o2, &ws, &rows);
                    assert_eq!(bits(&o1), bits(&o2), "axpy_rows, n={n}");
                    let w = lcg(&mut seed);
                    let (mut o1, mut o2) = (a.clone(), a.clone());
                    axpy_avx2(&mut o1, w, &bh);
                    Portable::axpy(&mut o2, w, &bh);
                    assert_eq!(bits(&o1), bits(&o2), "f16 axpy, n={n}");
                    let (mut o1, mut o2) = (a.clone(), a.clone());
                    axpy_avx2(&mut o1, w, &b);
                    Portable::axpy(&mut o2, w, &b);
                    assert_eq!(bits(&o1), bits(&o2), "f32 axpy, n={n}");
                    // Conversions round alike, including ties, tiny and
                    // huge values and the specials.
                    let mut s = a.clone();
                    s.extend([
                        1.0 + f32::EPSILON * 2048.0,
                        65520.0,
                        1e-8,
                        -0.0,
                        f32::INFINITY,
                        6.1e-5,
                        0.000_030_517_578,
                    ]);
                    let mut h1 = vec![F16Bits::default(); s.len()];
                    let mut h2 = vec![F16Bits::default(); s.len()];
                    convert_avx2(&mut h1, &s);
                    Portable::convert(&mut h2, &s);
                    let raw = |h: &[F16Bits]| h.iter().map(|x| x.0).collect::<Vec<_>>();
                    assert_eq!(raw(&h1), raw(&h2), "f16 store, n={n}");
                    let (mut w1, mut w2) = (vec![0.0; s.len()], vec![0.0; s.len()]);
                    widen_avx2(&mut w1, &h1);
                    Portable::widen(&mut w2, &h1);
                    assert_eq!(bits(&w1), bits(&w2), "f16 load, n={n}");
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The dispatched loops against their portable instances.
    #[test]
    fn dispatched_loops_give_the_portable_bits() {
        let mut seed = 11;
        let h = 576;
        let x = values(3 * h, &mut seed);
        let w = values(h, &mut seed);
        let mut a = vec![0.0; 3 * h];
        let mut b = vec![0.0; 3 * h];
        rms_norm(&x, &w, 1e-5, &mut a);
        rms_norm_body::<Portable>(&x, &w, 1e-5, &mut b);
        assert_eq!(bits(&a), bits(&b), "rms_norm");
        let u = values(3 * h, &mut seed);
        swiglu(&x, &u, &mut a);
        swiglu_body::<Portable>(&x, &u, &mut b);
        assert_eq!(bits(&a), bits(&b), "swiglu");
        let (mut p, mut q) = (x.clone(), x.clone());
        add_into(&mut p, &u);
        add_into_body::<Portable>(&mut q, &u);
        assert_eq!(bits(&p), bits(&q), "add_into");
    }
}
