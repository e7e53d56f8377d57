//! A tiny Llama GGUF with deterministic random weights, for fast tests here
//! and in the daemon's integration tests (`tt-worker make-test-model --out
//! PATH`, or [`write_tiny_llama`]).
//!
//! Every matrix row holds an even number of 32-element blocks: candle's
//! Q4_1 dot product asserts that in debug builds.
//!
//! It is shaped to exercise what the real model does and a little more:
//! grouped-query attention with 3 KV heads (so TP=2 splits unevenly),
//! Q4_1, Q8_0, F16 and F32 tensors, fused and unfused projections (layer 1's
//! gate and up differ in dtype), a byte-level BPE vocabulary with merges and
//! control tokens, an untied LM head, and a ChatML template.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::path::Path;

/// Shape of the tiny model.
pub const LAYERS: usize = 2;
/// Residual width.
pub const HIDDEN: usize = 192;
/// Query heads.
pub const HEADS: usize = 6;
/// KV heads.
pub const KV_HEADS: usize = 3;
/// MLP width.
pub const FFN: usize = 128;
/// Context length.
pub const CONTEXT: usize = 256;

const CONTROL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const MERGES: [(&str, &str); 12] = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("o", "n"),
    ("Ġ", "c"),
    ("e", "r"),
    ("a", "t"),
    ("Ġc", "at"),
    ("Ġ", "s"),
    ("i", "s"),
];

/// Why the test model could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TestModelError {
    /// Filesystem.
    #[error("cannot write the test model to {path}: {source}")]
    Io {
        /// Destination.
        path: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Tensor construction.
    #[error("cannot build the test model: {0}")]
    Tensor(#[from] candle_core::Error),
}

/// Deterministic pseudo-random numbers (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Uniform in [-1, 1).
        ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    fn tensor(&mut self, rows: usize, cols: usize, scale: f32) -> Vec<f32> {
        (0..rows * cols).map(|_| self.next() * scale).collect()
    }
}

/// GPT-2's byte-to-character map, in byte order.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut n = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap_or('?')
            }
        })
        .collect()
}

/// The tiny model's vocabulary: control tokens, the 256 byte tokens, then
/// one token per merge.
pub fn vocabulary() -> Vec<String> {
    let mut tokens: Vec<String> = CONTROL.iter().map(|s| s.to_string()).collect();
    tokens.extend(byte_chars().into_iter().map(String::from));
    tokens.extend(MERGES.iter().map(|(a, b)| format!("{a}{b}")));
    tokens
}

fn q(data: Vec<f32>, rows: usize, cols: usize, dtype: GgmlDType) -> candle_core::Result<QTensor> {
    let t = Tensor::from_vec(data, (rows, cols), &Device::Cpu)?;
    QTensor::quantize(&t, dtype)
}

fn norm(rng: &mut Rng, n: usize) -> candle_core::Result<QTensor> {
    let v: Vec<f32> = (0..n).map(|_| 1.0 + 0.1 * rng.next()).collect();
    QTensor::quantize(&Tensor::from_vec(v, n, &Device::Cpu)?, GgmlDType::F32)
}

/// Writes the tiny model to `path`; the same `seed` gives the same file.
pub fn write_tiny_llama(path: &Path, seed: u64) -> Result<(), TestModelError> {
    let tokens = vocabulary();
    let vocab = tokens.len();
    let hd = HIDDEN / HEADS;
    let mut rng = Rng(seed);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    tensors.push((
        "token_embd.weight".into(),
        q(
            rng.tensor(vocab, HIDDEN, 1.0),
            vocab,
            HIDDEN,
            GgmlDType::Q8_0,
        )?,
    ));
    // Weights large enough that every block changes the residual stream
    // visibly; with small ones the model just echoes its last input token.
    let s_in = 3.0 / (HIDDEN as f32).sqrt();
    let s_ffn = 3.0 / (FFN as f32).sqrt();
    for l in 0..LAYERS {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        tensors.push((n("attn_norm"), norm(&mut rng, HIDDEN)?));
        tensors.push((
            n("attn_q"),
            q(
                rng.tensor(HEADS * hd, HIDDEN, s_in),
                HEADS * hd,
                HIDDEN,
                GgmlDType::Q4_1,
            )?,
        ));
        tensors.push((
            n("attn_k"),
            q(
                rng.tensor(KV_HEADS * hd, HIDDEN, s_in),
                KV_HEADS * hd,
                HIDDEN,
                GgmlDType::Q4_1,
            )?,
        ));
        tensors.push((
            n("attn_v"),
            q(
                rng.tensor(KV_HEADS * hd, HIDDEN, s_in),
                KV_HEADS * hd,
                HIDDEN,
                GgmlDType::Q4_1,
            )?,
        ));
        tensors.push((
            n("attn_output"),
            q(
                rng.tensor(HIDDEN, HEADS * hd, s_in),
                HIDDEN,
                HEADS * hd,
                GgmlDType::Q4_1,
            )?,
        ));
        tensors.push((n("ffn_norm"), norm(&mut rng, HIDDEN)?));
        let (gate_t, up_t) = if l == 0 {
            (GgmlDType::F16, GgmlDType::F16)
        } else {
            (GgmlDType::Q8_0, GgmlDType::Q4_1)
        };
        tensors.push((
            n("ffn_gate"),
            q(rng.tensor(FFN, HIDDEN, s_in), FFN, HIDDEN, gate_t)?,
        ));
        tensors.push((
            n("ffn_up"),
            q(rng.tensor(FFN, HIDDEN, s_in), FFN, HIDDEN, up_t)?,
        ));
        tensors.push((
            n("ffn_down"),
            q(rng.tensor(HIDDEN, FFN, s_ffn), HIDDEN, FFN, GgmlDType::Q4_1)?,
        ));
    }
    tensors.push(("output_norm.weight".into(), norm(&mut rng, HIDDEN)?));
    // An untied LM head (SmolLM2 ties it; this covers the other case).
    // Control tokens get zero rows: their logit is 0 while the largest of
    // the ~270 random others is far above it, so greedy output never ends
    // early on an end-of-turn token.
    let mut head = rng.tensor(vocab, HIDDEN, 1.0);
    head[..CONTROL.len() * HIDDEN].fill(0.0);
    tensors.push((
        "output.weight".into(),
        q(head, vocab, HIDDEN, GgmlDType::Q4_1)?,
    ));

    let mut token_types = vec![Value::I32(3); CONTROL.len()];
    token_types.extend((CONTROL.len()..vocab).map(|_| Value::I32(1)));
    let chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let s = |v: &str| Value::String(v.into());
    let u = |v: usize| Value::U32(v as u32);
    let metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", s("llama")),
        ("general.name", s("tt-tiny-llama")),
        ("llama.block_count", u(LAYERS)),
        ("llama.context_length", u(CONTEXT)),
        ("llama.embedding_length", u(HIDDEN)),
        ("llama.feed_forward_length", u(FFN)),
        ("llama.attention.head_count", u(HEADS)),
        ("llama.attention.head_count_kv", u(KV_HEADS)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", u(vocab)),
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.pre", s("smollm")),
        (
            "tokenizer.ggml.tokens",
            Value::Array(tokens.iter().map(|t| s(t)).collect()),
        ),
        ("tokenizer.ggml.token_type", Value::Array(token_types)),
        (
            "tokenizer.ggml.merges",
            Value::Array(MERGES.iter().map(|(a, b)| s(&format!("{a} {b}"))).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", u(1)),
        ("tokenizer.ggml.eos_token_id", u(2)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ("tokenizer.chat_template", s(chatml)),
    ];
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let io = |source| TestModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    // Write beside the destination and rename, so concurrent tests that
    // share a path never read a half-written model.
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    gguf_file::write(&mut f, &md, &ts)?;
    use std::io::Write;
    f.flush().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}
