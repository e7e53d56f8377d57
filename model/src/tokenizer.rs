//! The tokenizer, built from the GGUF metadata with the `tokenizers` crate,
//! and an incremental detokenizer that never splits a UTF-8 character.
//!
//! GGUF files describe byte-level BPE (`tokenizer.ggml.model = "gpt2"`) by
//! vocabulary and merges only; the pre-tokenizer is named by
//! `tokenizer.ggml.pre`. For the `smollm` family (and the StarCoder family it
//! shares its rule with in llama.cpp) digits are split one per piece before
//! the GPT-2 byte-level split, with no prefix space. Getting this wrong does
//! not fail loudly: it silently yields different ids for numbers, so the
//! tests compare ids with llama.cpp's on such strings.

use crate::gguf::TokenizerSpec;
use std::collections::HashSet;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::AddedToken;

/// GGUF token type of control tokens (`<|im_start|>`, `<|endoftext|>`).
const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of user-defined tokens (matched literally, shown as is).
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Pre-tokenizer families that split digits individually before the GPT-2
/// byte-level regex (llama.cpp groups them under one rule).
const DIGIT_SPLIT_FAMILIES: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
];
/// Pre-tokenizer families that are plain GPT-2 byte-level.
const GPT2_FAMILIES: &[&str] = &["default", "gpt2", "gpt-2"];

/// Why a tokenizer could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The tokenizer model or pre-tokenizer is not one we implement.
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    /// The vocabulary or merges are inconsistent.
    #[error("invalid tokenizer data in the checkpoint: {0}")]
    Invalid(String),
    /// Encoding failed.
    #[error("cannot tokenize the input: {0}")]
    Encode(String),
}

/// A byte-level BPE tokenizer with the token byte table needed for streaming.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The raw bytes each token stands for (empty for control tokens, which
    /// are never shown to the user).
    token_bytes: Vec<Vec<u8>>,
    /// Tokens that end a generation (EOS, end-of-turn).
    end_of_generation: HashSet<u32>,
    bos: Option<u32>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.token_bytes.len())
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer the checkpoint describes.
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Self, TokenizerError> {
        if spec.model != "gpt2" {
            return Err(TokenizerError::Unsupported(format!(
                "tokenizer.ggml.model = `{}`; tt-worker implements byte-level BPE (`gpt2`)",
                spec.model
            )));
        }
        let pre: PreTokenizerWrapper = if DIGIT_SPLIT_FAMILIES.contains(&spec.pre.as_str()) {
            Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, false, true).into(),
            ])
            .into()
        } else if GPT2_FAMILIES.contains(&spec.pre.as_str()) {
            ByteLevel::new(false, false, true).into()
        } else {
            // Refuse rather than guess: a wrong pre-tokenizer still produces
            // fluent-looking output, just from the wrong ids.
            return Err(TokenizerError::Unsupported(format!(
                "tokenizer.ggml.pre = `{}` is not implemented (known: {}, {})",
                spec.pre,
                DIGIT_SPLIT_FAMILIES.join(", "),
                GPT2_FAMILIES.join(", ")
            )));
        };

        let vocab: ahash::AHashMap<String, u32> = spec
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut merges = Vec::with_capacity(spec.merges.len());
        for m in &spec.merges {
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| TokenizerError::Invalid(format!("merge `{m}` has no space")))?;
            merges.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| TokenizerError::Invalid(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre));
        inner.with_decoder(Some(ByteLevel::default()));

        let mut added = Vec::new();
        for (i, t) in spec.tokens.iter().enumerate() {
            match spec.token_types.get(i).copied() {
                Some(TOKEN_TYPE_CONTROL) => added.push(AddedToken::from(t.clone(), true)),
                Some(TOKEN_TYPE_USER_DEFINED) => added.push(AddedToken::from(t.clone(), false)),
                _ => {}
            }
        }
        inner.add_special_tokens(&added);

        let token_bytes = spec
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| match spec.token_types.get(i).copied() {
                Some(TOKEN_TYPE_CONTROL) => Vec::new(),
                Some(TOKEN_TYPE_USER_DEFINED) => t.as_bytes().to_vec(),
                _ => byte_level_decode(t),
            })
            .collect();

        let mut end_of_generation: HashSet<u32> = spec.eos.into_iter().collect();
        // Chat models end a turn with an end-of-turn token that is not always
        // the declared EOS; llama.cpp treats these as end-of-generation too.
        for (i, t) in spec.tokens.iter().enumerate() {
            let control = spec.token_types.get(i).copied() == Some(TOKEN_TYPE_CONTROL);
            if control
                && matches!(
                    t.as_str(),
                    "<|endoftext|>" | "<|im_end|>" | "<|eot_id|>" | "<|end|>" | "<end_of_turn>"
                )
            {
                end_of_generation.insert(i as u32);
            }
        }
        Ok(Self {
            inner,
            token_bytes,
            end_of_generation,
            bos: spec.bos,
            add_bos: spec.add_bos,
        })
    }

    /// Token ids of `text`, with a BOS first when the model asks for one.
    /// Control tokens written in the text (`<|im_start|>`) are recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            if let Some(bos) = self.bos {
                ids.push(bos);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The bytes token `id` stands for (empty for control tokens and ids
    /// outside the vocabulary).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Whether `id` ends a generation.
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.contains(&id)
    }

    /// The tokens that end a generation, in id order.
    pub fn end_of_generation_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.end_of_generation.iter().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// Text of a whole sequence of ids (lossy at invalid UTF-8).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| self.token_bytes(id).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Inverse of GPT-2's `bytes_to_unicode`: the printable bytes map to
/// themselves, the other 68 bytes to U+0100.. in order.
fn byte_level_decode(token: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(token.len());
    for c in token.chars() {
        match byte_of_char(c) {
            Some(b) => out.push(b),
            // Not a byte-level character: keep the text itself.
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

fn is_printable_byte(b: u32) -> bool {
    (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b)
}

fn byte_of_char(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && is_printable_byte(cp) {
        return Some(cp as u8);
    }
    // The n-th non-printable byte maps to 256 + n (a table: every token of
    // the vocabulary goes through here at load).
    static NON_PRINTABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let table = NON_PRINTABLE.get_or_init(|| {
        (0u32..256)
            .filter(|&b| !is_printable_byte(b))
            .map(|b| b as u8)
            .collect()
    });
    cp.checked_sub(256)
        .and_then(|n| table.get(n as usize))
        .copied()
}

/// Turns a stream of token bytes into text, holding back an incomplete
/// UTF-8 character until the token that completes it arrives.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// Adds the bytes of one token; returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Valid prefix is safe to emit.
                    if let Ok(s) = std::str::from_utf8(&self.pending[..valid]) {
                        out.push_str(s);
                    }
                    match e.error_len() {
                        // Incomplete character at the end: wait for more.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes can never become valid: replace them.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes whatever is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_round_trips_every_byte() {
        for b in 0u32..256 {
            let c = if is_printable_byte(b) {
                char::from_u32(b).unwrap()
            } else {
                let n = (0..b).filter(|&x| !is_printable_byte(x)).count() as u32;
                char::from_u32(256 + n).unwrap()
            };
            assert_eq!(byte_of_char(c), Some(b as u8), "byte {b}");
        }
    }

    #[test]
    fn stream_decoder_holds_back_split_characters() {
        let mut d = StreamDecoder::default();
        let euro = "€".as_bytes();
        assert_eq!(d.push(&euro[..1]), "");
        assert_eq!(d.push(&euro[1..2]), "");
        assert_eq!(d.push(&[euro[2], b'!']), "€!");
        let crab = "🦀".as_bytes();
        assert_eq!(d.push(&[b'a', crab[0], crab[1]]), "a");
        assert_eq!(d.push(&crab[2..]), "🦀");
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn stream_decoder_replaces_invalid_bytes() {
        let mut d = StreamDecoder::default();
        assert_eq!(d.push(&[b'x', 0xff, b'y']), "x\u{fffd}y");
        assert_eq!(d.push(&[0xe2]), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }
}
