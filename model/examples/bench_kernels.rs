//! Kernel microbenchmark: the quantized matmuls on SmolLM2-135M's layer
//! shapes at 1, 2, 4 and 8 activation rows, as JSON lines (one per format,
//! shape and row count) with GMAC/s, so a kernel change can be compared side
//! by side in one run. Random weights: only speed is measured here (the
//! kernels' results are checked by the unit tests).
//!
//! Each is measured twice: `"weights": "cache"` multiplies one copy of the
//! matrix again and again (it stays in the CPU's caches, up to 32 MiB L3
//! here), `"weights": "dram"` cycles through copies totalling more than
//! 128 MiB, so every call reads its weights from memory as a decode step
//! does (SmolLM2's weights are 94 MiB).
//!
//! `cpu_gmac_s` divides by the CPU time the process used instead of the
//! wall time: run with `CANDLE_NUM_THREADS=1` to compare kernels on a
//! machine that is not quiet.
//!
//! Usage: bench_kernels [--millis N] [--isa vnni|avx2|scalar]
//!   --millis: time per measurement (default 300); --isa: a narrower
//!   instruction set than the CPU's best (as `TTW_KERNELS_ISA`).

use std::time::{Duration, Instant};
use tt_worker::kernels::{self, Format, WeightView, QK};

fn lcg(seed: &mut u64) -> u8 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u8
}

/// Random plain blocks with small finite f16 scales.
fn random_blocks(format: Format, n: usize, k: usize) -> Vec<u8> {
    let mut seed = 1;
    let bb = format.block_bytes();
    let mut out = Vec::with_capacity(n * k / QK * bb);
    for _ in 0..n * k / QK {
        out.extend_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        for _ in 2..bb {
            out.push(lcg(&mut seed));
        }
    }
    out
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let millis: u64 = match args.iter().position(|a| a == "--millis") {
        Some(i) => args
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("--millis N"))?
            .parse()?,
        None => 300,
    };
    if let Some(i) = args.iter().position(|a| a == "--isa") {
        let isa = args
            .get(i + 1)
            .and_then(|n| kernels::Isa::from_name(n))
            .ok_or_else(|| anyhow::anyhow!("--isa vnni|avx2|scalar"))?;
        kernels::choose_isa(isa).map_err(anyhow::Error::msg)?;
    }
    let budget = Duration::from_millis(millis);
    // (name, rows, input width, plain format)
    let shapes = [
        ("attn_qkv", 960, 576, Format::Q4_1),
        ("attn_output", 576, 576, Format::Q4_1),
        ("ffn_gate_up", 3072, 576, Format::Q4_1),
        ("ffn_down", 576, 1536, Format::Q4_1),
        ("lm_head", 49152, 576, Format::Q8_0),
    ];
    let threads = kernels_threads();
    for (name, n, k, plain_format) in shapes {
        let plain = random_blocks(plain_format, n, k);
        let mut variants = vec![(plain_format, plain.clone())];
        let (x8, packed) = match plain_format {
            Format::Q8_0 => (Format::Q8_0x8, kernels::pack_q8_0_x8(&plain, n, k)),
            _ => (Format::Q4_1x8, kernels::pack_q4_1_x8(&plain, n, k)),
        };
        let packed = packed.ok_or_else(|| anyhow::anyhow!("{name}: cannot pack"))?;
        variants.push((x8, packed));
        for (format, bytes) in &variants {
            let copies = (128 << 20) / bytes.len() + 1;
            let dram: Vec<Vec<u8>> = (0..copies).map(|_| bytes.clone()).collect();
            for (placement, set) in [("cache", std::slice::from_ref(bytes)), ("dram", &dram[..])] {
                let views = set
                    .iter()
                    .map(|b| WeightView::new(*format, b, n, k))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| anyhow::anyhow!("{name}: bad view"))?;
                for m in [1usize, 2, 4, 8] {
                    let x: Vec<f32> = (0..m * k)
                        .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
                        .collect();
                    let mut out = vec![0.0f32; m * n];
                    kernels::matmul(&views[0], &x, m, &mut out);
                    let start = Instant::now();
                    let cpu_start = process_cpu_secs();
                    let mut calls = 0u64;
                    while start.elapsed() < budget {
                        kernels::matmul(&views[calls as usize % views.len()], &x, m, &mut out);
                        calls += 1;
                    }
                    let secs = start.elapsed().as_secs_f64();
                    let cpu_secs = process_cpu_secs() - cpu_start;
                    let gmacs = (calls as f64 * (m * n * k) as f64) / secs / 1e9;
                    println!(
                        "{}",
                        serde_json::json!({
                            "bench": "kernels",
                            "tensor": name,
                            "format": format!("{format:?}"),
                            "weights": placement,
                            "n": n,
                            "k": k,
                            "m": m,
                            "threads": threads,
                        "isa": format!("{:?}", kernels::isa()),
                            "us_per_call": secs / calls as f64 * 1e6,
                            "gmac_s": gmacs,
                            // Per CPU-second of all threads: with
                            // CANDLE_NUM_THREADS=1 a kernel's own speed, even
                            // on a machine that is busy with other work.
                            "cpu_gmac_s": (calls as f64 * (m * n * k) as f64) / cpu_secs / 1e9,
                            "gb_s": calls as f64 * bytes.len() as f64 / secs / 1e9,
                        })
                    );
                }
            }
        }
    }
    Ok(())
}

/// CPU time this process has used, all threads.
fn process_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn kernels_threads() -> usize {
    tt_worker::pool::global().threads()
}
