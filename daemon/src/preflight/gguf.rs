//! Enough of the GGUF format to tell whether a checkpoint is whole: the
//! magic, the version, and that the file is as long as its header says
//! (the end of the last tensor's data). A copy cut short by a full disk or
//! an interrupted download passes a glance at its name and size, then fails
//! minutes into a worker's load; this catches it in `check-config`.
//!
//! The daemon does not depend on the model crate, so this reads the header
//! itself: the metadata values are skipped by type (only
//! `general.alignment` is kept), then the tensor infos give each tensor's
//! type, shape and offset into the data section, which starts at the next
//! multiple of the alignment after the header. A tensor type not listed in
//! [`type_size`] leaves the data end unknown, and then only the header is
//! checked.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's default when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u64 = 4;
/// Arrays of arrays nest; real files use one level.
const MAX_NESTING: u32 = 8;
/// Longest metadata key read into memory (real keys are short).
const MAX_KEY_BYTES: u64 = 64 * 1024;

/// GGUF metadata value types.
const TYPE_U32: u32 = 4;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;

/// Checks the GGUF file at `path` (config key `key`); the error is a
/// sentence naming the file, what is wrong and the fix.
pub(super) fn check(path: &Path, key: &str) -> Result<(), String> {
    let shown = path.display();
    let unreadable = |e: std::io::Error| {
        format!(
            "cannot read `{shown}` ({e}); check the path and that the daemon's user may read it"
        )
    };
    let file = File::open(path).map_err(unreadable)?;
    let len = file.metadata().map_err(unreadable)?.len();
    let mut reader = Reader {
        inner: BufReader::new(file),
        pos: 0,
        len,
        wide: true,
    };
    let again = "copy or download it again";
    match layout(&mut reader) {
        Ok(Layout { data_end: Some(end) }) if end > len => Err(format!(
            "`{shown}` is truncated: its GGUF header says the tensor data ends at byte {end}, but the file has {len} bytes; {again}"
        )),
        Ok(_) => Ok(()),
        Err(Error::Io(e)) => Err(unreadable(e)),
        Err(Error::NotGguf(start)) => Err(format!(
            "`{shown}` is not a GGUF file (it starts with {}, not `GGUF`); tt-worker loads GGUF checkpoints: point {key} at the model's .gguf file",
            describe_start(&start)
        )),
        Err(Error::Version(v)) => Err(format!(
            "`{shown}` has GGUF version {v}, which is not one of 1, 2, 3; convert the model with a current llama.cpp or point {key} at another file"
        )),
        Err(Error::Truncated(what)) => Err(format!(
            "`{shown}` is truncated: its {len} bytes end inside the GGUF header ({what}); {again}"
        )),
        Err(Error::Malformed(what)) => Err(format!(
            "`{shown}` has a corrupt GGUF header ({what}); {again}"
        )),
    }
}

/// The first bytes of a file that is not GGUF, for the message.
fn describe_start(start: &[u8]) -> String {
    if start.is_empty() {
        return "nothing: it is empty".into();
    }
    let hex: Vec<String> = start.iter().map(|b| format!("{b:02x}")).collect();
    format!("bytes {}", hex.join(" "))
}

#[derive(Debug)]
enum Error {
    Io(std::io::Error),
    /// The first bytes (up to 4), which are not the magic.
    NotGguf(Vec<u8>),
    Version(u32),
    /// The file ends while reading this part of the header.
    Truncated(&'static str),
    Malformed(String),
}

/// What the header says about the file's length.
struct Layout {
    /// Where the last tensor's data ends; None when a tensor type is unknown.
    data_end: Option<u64>,
}

struct Reader {
    inner: BufReader<File>,
    pos: u64,
    len: u64,
    /// Version 1 writes counts and lengths as u32, later versions as u64.
    wide: bool,
}

impl Reader {
    fn bytes<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Error> {
        let mut buf = [0u8; N];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::Truncated(what),
                _ => Error::Io(e),
            })?;
        self.pos += N as u64;
        Ok(buf)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, Error> {
        self.bytes(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, Error> {
        self.bytes(what).map(u64::from_le_bytes)
    }

    /// A count or length: u32 in version 1, u64 after.
    fn count(&mut self, what: &'static str) -> Result<u64, Error> {
        if self.wide {
            self.u64(what)
        } else {
            self.u32(what).map(u64::from)
        }
    }

    /// Skip `n` bytes that must lie inside the file.
    fn skip(&mut self, n: u64, what: &'static str) -> Result<(), Error> {
        let end = self.pos.checked_add(n).filter(|end| *end <= self.len);
        let Some(end) = end else {
            return Err(Error::Truncated(what));
        };
        let step = i64::try_from(n).map_err(|_| Error::Truncated(what))?;
        self.inner.seek_relative(step).map_err(Error::Io)?;
        self.pos = end;
        Ok(())
    }

    fn skip_string(&mut self, what: &'static str) -> Result<(), Error> {
        let n = self.count(what)?;
        self.skip(n, what)
    }

    fn string(&mut self, what: &'static str) -> Result<Vec<u8>, Error> {
        let n = self.count(what)?;
        if n > MAX_KEY_BYTES {
            return Err(Error::Malformed(format!("a metadata key of {n} bytes")));
        }
        if self.pos + n > self.len {
            return Err(Error::Truncated(what));
        }
        let mut buf = vec![0u8; n as usize];
        self.inner.read_exact(&mut buf).map_err(Error::Io)?;
        self.pos += n;
        Ok(buf)
    }

    /// Skip one metadata value of type `ty`.
    fn skip_value(&mut self, ty: u32, depth: u32) -> Result<(), Error> {
        const WHAT: &str = "a metadata value";
        if let Some(size) = scalar_size(ty) {
            return self.skip(size, WHAT);
        }
        match ty {
            TYPE_STRING => self.skip_string(WHAT),
            TYPE_ARRAY if depth < MAX_NESTING => {
                let item = self.u32(WHAT)?;
                let n = self.count(WHAT)?;
                match scalar_size(item) {
                    Some(size) => {
                        let bytes = n.checked_mul(size).ok_or(Error::Truncated(WHAT))?;
                        self.skip(bytes, WHAT)
                    }
                    // Strings and arrays have their own lengths; each takes
                    // at least 8 bytes, so a corrupt count meets the end of
                    // the file soon.
                    None => (0..n).try_for_each(|_| self.skip_value(item, depth + 1)),
                }
            }
            TYPE_ARRAY => Err(Error::Malformed("arrays nested too deep".into())),
            other => Err(Error::Malformed(format!("unknown metadata type {other}"))),
        }
    }
}

/// Bytes of a fixed-size metadata value type.
fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

/// Bytes of `elements` values of ggml type `ty`, for the common types: (block
/// size in elements, bytes per block). None for other types.
fn type_size(ty: u32, elements: u64) -> Option<u64> {
    let (block, bytes) = match ty {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        30 => (1, 2),     // BF16
        _ => return None,
    };
    elements
        .is_multiple_of(block)
        .then(|| elements / block * bytes)
}

fn layout(r: &mut Reader) -> Result<Layout, Error> {
    let mut magic = Vec::with_capacity(4);
    (&mut r.inner)
        .take(4)
        .read_to_end(&mut magic)
        .map_err(Error::Io)?;
    if magic.as_slice() != MAGIC {
        return Err(Error::NotGguf(magic));
    }
    r.pos = 4;
    let version = r.u32("the version")?;
    r.wide = match version {
        1 => false,
        2 | 3 => true,
        other => return Err(Error::Version(other)),
    };
    let tensors = r.count("the tensor count")?;
    let entries = r.count("the metadata count")?;
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..entries {
        let key = r.string("a metadata key")?;
        let ty = r.u32("a metadata type")?;
        if key == b"general.alignment" && ty == TYPE_U32 {
            alignment = u64::from(r.u32("general.alignment")?);
        } else {
            r.skip_value(ty, 0)?;
        }
    }
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(Error::Malformed(format!(
            "general.alignment is {alignment}, not a power of two"
        )));
    }
    let mut data_size = Some(0u64);
    for _ in 0..tensors {
        r.skip_string("a tensor name")?;
        let dims = u64::from(r.u32("a tensor's dimensions")?);
        if dims > MAX_DIMS {
            return Err(Error::Malformed(format!("a tensor with {dims} dimensions")));
        }
        let mut elements = 1u64;
        for _ in 0..dims {
            let dim = r.count("a tensor's dimensions")?;
            elements = elements
                .checked_mul(dim)
                .ok_or_else(|| Error::Malformed("a tensor's size overflows".into()))?;
        }
        let ty = r.u32("a tensor's type")?;
        let offset = r.u64("a tensor's offset")?;
        data_size = match (data_size, type_size(ty, elements)) {
            (Some(size), Some(bytes)) => {
                let end = offset
                    .checked_add(bytes)
                    .ok_or_else(|| Error::Malformed("a tensor's offset overflows".into()))?;
                Some(size.max(end))
            }
            _ => None,
        };
    }
    let data_start = r.pos.div_ceil(alignment) * alignment;
    Ok(Layout {
        data_end: data_size.map(|size| data_start.saturating_add(size)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file: a string, an array of strings, an array of u32, the
    /// alignment, then the given tensors (name, dims, type) laid out one after
    /// another; returns the bytes with the data section filled.
    fn gguf(alignment: u32, tensors: &[(&str, &[u64], u32, u64)]) -> Vec<u8> {
        let mut b = Vec::new();
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        b.extend(MAGIC);
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend(4u64.to_le_bytes());
        string(&mut b, "general.name");
        b.extend(TYPE_STRING.to_le_bytes());
        string(&mut b, "tiny");
        string(&mut b, "tokenizer.ggml.tokens");
        b.extend(TYPE_ARRAY.to_le_bytes());
        b.extend(TYPE_STRING.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        string(&mut b, "a");
        string(&mut b, "bc");
        string(&mut b, "tokenizer.ggml.token_type");
        b.extend(TYPE_ARRAY.to_le_bytes());
        b.extend(TYPE_U32.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend([0u8; 12]);
        string(&mut b, "general.alignment");
        b.extend(TYPE_U32.to_le_bytes());
        b.extend(alignment.to_le_bytes());
        let mut offset = 0;
        let mut data_end = 0;
        for (name, dims, ty, size) in tensors {
            string(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend((offset as u64).to_le_bytes());
            data_end = offset + *size as usize;
            offset = data_end.div_ceil(alignment as usize) * alignment as usize;
        }
        let start = b.len().div_ceil(alignment as usize) * alignment as usize;
        b.resize(start + data_end, 0xab);
        b
    }

    fn check_bytes(bytes: &[u8]) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).unwrap();
        check(&path, "models.m.checkpoint")
    }

    const TENSORS: &[(&str, &[u64], u32, u64)] = &[
        ("token_embd.weight", &[64, 8], 3, 8 * 2 * 20),
        ("output_norm.weight", &[64], 0, 64 * 4),
    ];

    #[test]
    fn a_whole_file_passes_and_one_byte_less_does_not() {
        for alignment in [32, 64] {
            let bytes = gguf(alignment, TENSORS);
            check_bytes(&bytes).unwrap();
            let e = check_bytes(&bytes[..bytes.len() - 1]).unwrap_err();
            assert!(
                e.contains(&format!(
                    "is truncated: its GGUF header says the tensor data ends at byte {}, but the file has {} bytes",
                    bytes.len(),
                    bytes.len() - 1
                )),
                "{e}"
            );
        }
    }

    #[test]
    fn a_file_cut_inside_the_header_says_where() {
        let bytes = gguf(32, TENSORS);
        let e = check_bytes(&bytes[..60]).unwrap_err();
        assert!(e.contains("end inside the GGUF header (a metadata"), "{e}");
        assert!(e.contains("copy or download it again"), "{e}");
    }

    #[test]
    fn other_files_are_named_not_gguf() {
        let e = check_bytes(b"PK\x03\x04zip").unwrap_err();
        assert!(
            e.contains("is not a GGUF file (it starts with bytes 50 4b 03 04, not `GGUF`)"),
            "{e}"
        );
        let e = check_bytes(b"").unwrap_err();
        assert!(e.contains("it starts with nothing: it is empty"), "{e}");
    }

    #[test]
    fn unknown_version_is_named() {
        let mut bytes = gguf(32, TENSORS);
        bytes[4] = 9;
        let e = check_bytes(&bytes).unwrap_err();
        assert!(e.contains("has GGUF version 9"), "{e}");
    }

    #[test]
    fn an_unknown_tensor_type_checks_only_the_header() {
        let bytes = gguf(32, &[("x", &[4], 99, 1000)]);
        // The data section is 1000 bytes; without the type's size the
        // length cannot be known, so a short file still passes.
        check_bytes(&bytes[..bytes.len() - 500]).unwrap();
    }

    #[test]
    fn a_corrupt_count_ends_at_the_end_of_the_file() {
        let mut bytes = gguf(32, TENSORS);
        // The tensor count, claimed huge.
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = check_bytes(&bytes).unwrap_err();
        assert!(e.contains("end inside the GGUF header"), "{e}");
    }
}
