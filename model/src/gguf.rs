//! Reading a GGUF checkpoint: the model's hyperparameters, its tokenizer
//! vocabulary, its chat template, and where each tensor's bytes lie.
//!
//! Only the header is parsed here. Tensor data is reached through
//! [`Checkpoint::tensor_bytes`] on a memory map, so a warm start (which must
//! never touch the checkpoint's tensor data) can read the header alone.

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::GgmlDType;
use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

/// Why a checkpoint could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read model file {path}: {source}")]
    Io {
        /// The checkpoint.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The header is not valid GGUF.
    #[error("{path} is not a readable GGUF file: {message}")]
    Parse {
        /// The checkpoint.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A required metadata key is absent or has the wrong type.
    #[error(
        "{path}: metadata key `{key}` is missing or malformed; this is not a complete Llama GGUF"
    )]
    Metadata {
        /// The checkpoint.
        path: PathBuf,
        /// The key.
        key: String,
    },
    /// The architecture is not one this engine implements.
    #[error("{path}: architecture `{arch}` is not supported; tt-worker runs Llama-family models (`llama`)")]
    Architecture {
        /// The checkpoint.
        path: PathBuf,
        /// The architecture named in the file.
        arch: String,
    },
    /// A tensor the model needs is absent, or its shape or type is unusable.
    #[error("{path}: tensor `{tensor}`: {problem}")]
    Tensor {
        /// The checkpoint.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
}

/// Hyperparameters of a Llama-family model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    /// `general.name`, or the file stem when absent.
    pub name: String,
    /// `general.architecture`.
    pub architecture: String,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// Context length the model was trained for.
    pub context_length: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// True when there is no `output.weight` and the LM head reuses the
    /// embedding.
    pub tied_embeddings: bool,
}

/// The tokenizer as the GGUF metadata describes it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`, e.g. `gpt2` for byte-level BPE.
    pub model: String,
    /// `tokenizer.ggml.pre`, the pre-tokenizer family, e.g. `smollm`.
    pub pre: String,
    /// Token strings by id.
    pub tokens: Vec<String>,
    /// Token types by id (1 normal, 3 control, 4 user-defined, ...).
    pub token_types: Vec<i32>,
    /// BPE merges, `"a b"` each.
    pub merges: Vec<String>,
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// Whether a BOS token starts every prompt.
    pub add_bos: bool,
    /// The Jinja chat template, if the checkpoint has one.
    pub chat_template: Option<String>,
}

/// Where one tensor lies in the checkpoint.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    /// Storage type.
    pub dtype: GgmlDType,
    /// Shape in row-major order (rows first), as candle reports it.
    pub shape: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte length of the data.
    pub len: usize,
}

/// A parsed GGUF header.
#[derive(Debug)]
pub struct Checkpoint {
    /// The file.
    pub path: PathBuf,
    /// Hyperparameters.
    pub config: ModelConfig,
    /// Tokenizer description.
    pub tokenizer: TokenizerSpec,
    /// Tensors by name.
    pub tensors: HashMap<String, TensorEntry>,
}

impl Checkpoint {
    /// Reads the header of `path` (metadata and tensor directory, no data).
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let file = File::open(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let file_len = file
            .metadata()
            .map_err(|source| GgufError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| GgufError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let md = Meta {
            path,
            map: &content.metadata,
        };
        let architecture = md.string("general.architecture")?;
        if architecture != "llama" {
            return Err(GgufError::Architecture {
                path: path.to_path_buf(),
                arch: architecture,
            });
        }
        let mut tensors = HashMap::with_capacity(content.tensor_infos.len());
        for (name, info) in &content.tensor_infos {
            tensors.insert(
                name.clone(),
                entry(path, name, info, content.tensor_data_offset, file_len)?,
            );
        }
        let config = read_config(&md, &tensors)?;
        let tokenizer = read_tokenizer(&md)?;
        Ok(Self {
            path: path.to_path_buf(),
            config,
            tokenizer,
            tensors,
        })
    }

    /// Total number of parameters (elements of every tensor).
    pub fn parameter_count(&self) -> u64 {
        self.tensors
            .values()
            .map(|t| t.shape.iter().product::<usize>() as u64)
            .sum()
    }

    /// The header as JSON, stored in the tensor cache by a cold start so a
    /// warm start need not parse the checkpoint (see [`Checkpoint::from_meta`]).
    pub fn to_meta(&self) -> Result<Vec<u8>, String> {
        let file_len = std::fs::metadata(&self.path)
            .map_err(|e| format!("{}: {e}", self.path.display()))?
            .len();
        let meta = HeaderCache {
            format: META_FORMAT,
            checkpoint_len: file_len,
            config: self.config.clone(),
            tokenizer: self.tokenizer.clone(),
            tensors: self
                .tensors
                .iter()
                .map(|(name, e)| {
                    (
                        name.clone(),
                        CachedTensor {
                            dtype: crate::cache::dtype_name(e.dtype).to_string(),
                            shape: e.shape.clone(),
                            offset: e.offset,
                            len: e.len,
                        },
                    )
                })
                .collect(),
        };
        serde_json::to_vec(&meta).map_err(|e| e.to_string())
    }

    /// The header of `path` from [`Checkpoint::to_meta`]'s JSON, checked
    /// against the checkpoint's size (a replaced checkpoint is an error, not
    /// a model served with the wrong tokenizer).
    pub fn from_meta(path: &Path, json: &[u8]) -> Result<Self, String> {
        let meta: HeaderCache = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        if meta.format != META_FORMAT {
            return Err(format!(
                "format {} is not the {META_FORMAT} this worker writes",
                meta.format
            ));
        }
        let len = std::fs::metadata(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if len != meta.checkpoint_len {
            return Err(format!(
                "it describes a checkpoint of {} bytes but {} has {len}",
                meta.checkpoint_len,
                path.display()
            ));
        }
        let mut tensors = HashMap::with_capacity(meta.tensors.len());
        for (name, t) in meta.tensors {
            let dtype = crate::cache::dtype_from_name(&t.dtype)
                .ok_or_else(|| format!("tensor `{name}` has unknown dtype `{}`", t.dtype))?;
            tensors.insert(
                name,
                TensorEntry {
                    dtype,
                    shape: t.shape,
                    offset: t.offset,
                    len: t.len,
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            config: meta.config,
            tokenizer: meta.tokenizer,
            tensors,
        })
    }

    /// The directory entry of `name`, or an error naming the tensor.
    pub fn entry(&self, name: &str) -> Result<&TensorEntry, GgufError> {
        self.tensors.get(name).ok_or_else(|| GgufError::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            problem: "missing from the checkpoint".into(),
        })
    }
}

/// Version of the cached header's layout.
const META_FORMAT: u32 = 1;

#[derive(serde::Serialize, serde::Deserialize)]
struct HeaderCache {
    format: u32,
    checkpoint_len: u64,
    config: ModelConfig,
    tokenizer: TokenizerSpec,
    tensors: HashMap<String, CachedTensor>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CachedTensor {
    dtype: String,
    shape: Vec<usize>,
    offset: u64,
    len: usize,
}

fn entry(
    path: &Path,
    name: &str,
    info: &TensorInfo,
    data_offset: u64,
    file_len: u64,
) -> Result<TensorEntry, GgufError> {
    let shape = info.shape.dims().to_vec();
    let elems: usize = shape.iter().product();
    let bs = info.ggml_dtype.block_size();
    if !elems.is_multiple_of(bs) {
        return Err(GgufError::Tensor {
            path: path.to_path_buf(),
            tensor: name.into(),
            problem: format!("{elems} elements is not a whole number of {bs}-element blocks"),
        });
    }
    let len = elems / bs * info.ggml_dtype.type_size();
    let offset = data_offset + info.offset;
    if offset + len as u64 > file_len {
        return Err(GgufError::Tensor {
            path: path.to_path_buf(),
            tensor: name.into(),
            problem: format!(
                "data ends at byte {} but the file has {file_len} bytes (truncated download?)",
                offset + len as u64
            ),
        });
    }
    Ok(TensorEntry {
        dtype: info.ggml_dtype,
        shape,
        offset,
        len,
    })
}

/// Typed access to the metadata map, with errors naming the key.
struct Meta<'a> {
    path: &'a Path,
    map: &'a HashMap<String, Value>,
}

impl Meta<'_> {
    fn missing(&self, key: &str) -> GgufError {
        GgufError::Metadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
        }
    }
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }
    fn string(&self, key: &str) -> Result<String, GgufError> {
        self.get(key)
            .and_then(|v| v.to_string().ok())
            .cloned()
            .ok_or_else(|| self.missing(key))
    }
    fn usize(&self, key: &str) -> Result<usize, GgufError> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        // Writers disagree on integer widths; accept any non-negative one.
        let n = match v {
            Value::U8(x) => *x as u64,
            Value::U16(x) => *x as u64,
            Value::U32(x) => *x as u64,
            Value::U64(x) => *x,
            Value::I8(x) if *x >= 0 => *x as u64,
            Value::I16(x) if *x >= 0 => *x as u64,
            Value::I32(x) if *x >= 0 => *x as u64,
            Value::I64(x) if *x >= 0 => *x as u64,
            _ => return Err(self.missing(key)),
        };
        Ok(Some(n as usize))
    }
    fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x)),
            Some(Value::F64(x)) => Ok(Some(*x as f32)),
            Some(_) => Err(self.missing(key)),
        }
    }
    fn opt_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(|v| v.to_bool().ok())
    }
    fn strings(&self, key: &str) -> Result<Vec<String>, GgufError> {
        let arr = self
            .get(key)
            .and_then(|v| v.to_vec().ok())
            .ok_or_else(|| self.missing(key))?;
        arr.iter()
            .map(|v| v.to_string().cloned().map_err(|_| self.missing(key)))
            .collect()
    }
}

fn read_config(
    md: &Meta<'_>,
    tensors: &HashMap<String, TensorEntry>,
) -> Result<ModelConfig, GgufError> {
    let name = md.string("general.name").unwrap_or_else(|_| {
        md.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let hidden = md.usize("llama.embedding_length")?;
    let n_heads = md.usize("llama.attention.head_count")?;
    let n_kv_heads = md
        .opt_usize("llama.attention.head_count_kv")?
        .unwrap_or(n_heads);
    if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || hidden % n_heads != 0 {
        return Err(md.missing("llama.attention.head_count_kv"));
    }
    let head_dim = hidden / n_heads;
    let vocab = match md.opt_usize("llama.vocab_size")? {
        Some(v) => v,
        None => tensors
            .get("token_embd.weight")
            .map(|t| t.shape[0])
            .ok_or_else(|| md.missing("llama.vocab_size"))?,
    };
    Ok(ModelConfig {
        name,
        architecture: "llama".into(),
        n_layers: md.usize("llama.block_count")?,
        hidden,
        n_heads,
        n_kv_heads,
        head_dim,
        intermediate: md.usize("llama.feed_forward_length")?,
        vocab,
        context_length: md.usize("llama.context_length")?,
        rope_theta: md.opt_f32("llama.rope.freq_base")?.unwrap_or(10_000.0),
        rms_eps: md
            .opt_f32("llama.attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5),
        tied_embeddings: !tensors.contains_key("output.weight"),
    })
}

fn read_tokenizer(md: &Meta<'_>) -> Result<TokenizerSpec, GgufError> {
    let tokens = md.strings("tokenizer.ggml.tokens")?;
    let token_types = match md.get("tokenizer.ggml.token_type") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::I32(x) => Ok(*x),
                Value::U32(x) => Ok(*x as i32),
                _ => Err(md.missing("tokenizer.ggml.token_type")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => vec![1; tokens.len()],
    };
    let merges = if md.get("tokenizer.ggml.merges").is_some() {
        md.strings("tokenizer.ggml.merges")?
    } else {
        Vec::new()
    };
    let id =
        |key: &str| -> Result<Option<u32>, GgufError> { Ok(md.opt_usize(key)?.map(|v| v as u32)) };
    Ok(TokenizerSpec {
        model: md.string("tokenizer.ggml.model")?,
        pre: md
            .string("tokenizer.ggml.pre")
            .unwrap_or_else(|_| "default".into()),
        tokens,
        token_types,
        merges,
        bos: id("tokenizer.ggml.bos_token_id")?,
        eos: id("tokenizer.ggml.eos_token_id")?,
        add_bos: md.opt_bool("tokenizer.ggml.add_bos_token").unwrap_or(false),
        chat_template: md.string("tokenizer.chat_template").ok(),
    })
}
