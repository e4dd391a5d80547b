//! GGUF files (llama.cpp): metadata, tensor directory, and tensors dequantized to f32 in every [`ggml`] format
//! Ember reads (F32, F16, BF16, the legacy Q4_0 to Q8_0 and the K-quants Q4_K, Q5_K, Q6_K).

use std::collections::HashMap;

use crate::files::Bytes;
use crate::ggml::{self, Format};
use crate::packed::Packed;

pub mod writer;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Array),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Uint(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v),
            Value::Uint(v) => Some(v as f64),
            Value::Int(v) => Some(v as f64),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// A metadata array with its elements at their own width, so that memory stays near the file's size: a vocabulary's
/// strings share one buffer, a byte array takes a byte per element (as `Vec<Value>` it took 32 and more).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Box<Strings>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    Nested(Vec<Array>),
}

/// Strings concatenated, with the end offset of each.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Strings {
    text: String,
    ends: Vec<usize>,
}

impl<'a> FromIterator<&'a str> for Strings {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        let mut strings = Strings::default();
        for s in iter {
            strings.text.push_str(s);
            strings.ends.push(strings.text.len());
        }
        strings
    }
}

impl Strings {
    pub fn len(&self) -> usize {
        self.ends.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(start, &end)| &self.text[start..end])
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Nested(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The elements of a string array.
    pub fn strings(&self) -> Option<&Strings> {
        match self {
            Array::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The elements of a floating-point array as f64.
    pub fn floats(&self) -> Option<Vec<f64>> {
        match self {
            Array::F32(v) => Some(v.iter().map(|&x| x.into()).collect()),
            Array::F64(v) => Some(v.clone()),
            _ => None,
        }
    }
    /// The elements of an integer array as i64 (u64 elements past i64::MAX saturate).
    pub fn integers(&self) -> Option<Vec<i64>> {
        let wide = |v: &[u64]| v.iter().map(|&x| i64::try_from(x).unwrap_or(i64::MAX)).collect();
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x.into()).collect(),
            Array::I8(v) => v.iter().map(|&x| x.into()).collect(),
            Array::U16(v) => v.iter().map(|&x| x.into()).collect(),
            Array::I16(v) => v.iter().map(|&x| x.into()).collect(),
            Array::U32(v) => v.iter().map(|&x| x.into()).collect(),
            Array::I32(v) => v.iter().map(|&x| x.into()).collect(),
            Array::U64(v) => wide(v),
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }
}

/// One tensor's name, GGUF dimensions (fastest first), ggml type and byte offset in the data section.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<usize>,
    pub ggml_type: u32,
    pub offset: usize,
}

impl TensorInfo {
    /// Row-major shape: GGUF lists the fastest dimension first, so [ne₁, ne₀] is PyTorch's [out, in].
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
    fn len(&self) -> usize {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file: its metadata and tensor directory, over the file's bytes (mapped, so parsing reads only the
/// header and a tensor's pages are read when it is).
pub struct Gguf {
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    bytes: Bytes,
    data_start: usize,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GgufError {
    #[error("not a GGUF file (magic {0:?})")]
    Magic([u8; 4]),
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    Version(u32),
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("metadata value type {0} is unknown")]
    ValueType(u32),
    #[error("tensor {name}: ggml type {ggml_type} is not supported ({} are)", ggml::NAMES)]
    TensorType { name: String, ggml_type: u32 },
    #[error("tensor {0} extends past the end of the file")]
    TensorBounds(String),
    #[error("no tensor named {0}")]
    MissingTensor(String),
    #[error("tensor {name} has dimensions {dims:?}, not a matrix")]
    NotMatrix { name: String, dims: Vec<usize> },
    #[error("text is not UTF-8 at byte {0}")]
    Utf8(usize),
    #[error("metadata arrays nested deeper than {MAX_NESTING} at byte {0}")]
    Nesting(usize),
    #[error("general.alignment {0} is not a power of two from 1 to 2^20")]
    Alignment(u64),
    #[error("metadata {key} is not {expected}")]
    MetadataType { key: String, expected: &'static str },
    #[error("metadata key {0} appears twice")]
    DuplicateKey(String),
    #[error("tensor {0} appears twice")]
    DuplicateTensor(String),
    #[error("tensor {name}: dimensions {dims:?} hold more elements than this machine can address")]
    TensorSize { name: String, dims: Vec<usize> },
}

/// How deep metadata arrays may nest (GGUF files in use nest none; each level is a recursion of the reader).
pub const MAX_NESTING: usize = 8;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], GgufError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or(GgufError::Truncated(self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn len(&mut self) -> Result<usize, GgufError> {
        let at = self.at;
        usize::try_from(self.u64()?).ok().filter(|&n| n <= self.bytes.len()).ok_or(GgufError::Truncated(at))
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.len()?;
        let at = self.at;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| GgufError::Utf8(at))
    }
    /// A metadata value of type `ty`.
    fn value(&mut self, ty: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::Uint(self.array::<1>()?[0] as u64),
            1 => Value::Int(self.array::<1>()?[0] as i8 as i64),
            2 => Value::Uint(u16::from_le_bytes(self.array()?) as u64),
            3 => Value::Int(i16::from_le_bytes(self.array()?) as i64),
            4 => Value::Uint(self.u32()? as u64),
            5 => Value::Int(i32::from_le_bytes(self.array()?) as i64),
            6 => Value::Float(f32::from_le_bytes(self.array()?) as f64),
            7 => Value::Bool(self.array::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => Value::Array(self.array_value(0)?),
            10 => Value::Uint(self.u64()?),
            11 => Value::Int(i64::from_le_bytes(self.array()?)),
            12 => Value::Float(f64::from_le_bytes(self.array()?)),
            other => return Err(GgufError::ValueType(other)),
        })
    }
    /// `n` fixed-size elements of `N` bytes each, decoded by `decode`.
    fn elements<const N: usize, T>(&mut self, n: usize, decode: fn([u8; N]) -> T) -> Result<Vec<T>, GgufError> {
        let at = self.at;
        let bytes = self.take(n.checked_mul(N).ok_or(GgufError::Truncated(at))?)?;
        Ok(bytes.chunks_exact(N).map(|c| decode(c.try_into().expect("N bytes"))).collect())
    }
    /// An array (its element type, length and elements), inside `depth` enclosing arrays.
    fn array_value(&mut self, depth: usize) -> Result<Array, GgufError> {
        if depth == MAX_NESTING {
            return Err(GgufError::Nesting(self.at));
        }
        let item = self.u32()?;
        let n = self.len()?;
        Ok(match item {
            0 => Array::U8(self.elements(n, |[b]| b)?),
            1 => Array::I8(self.elements(n, |[b]| b as i8)?),
            2 => Array::U16(self.elements(n, u16::from_le_bytes)?),
            3 => Array::I16(self.elements(n, i16::from_le_bytes)?),
            4 => Array::U32(self.elements(n, u32::from_le_bytes)?),
            5 => Array::I32(self.elements(n, i32::from_le_bytes)?),
            6 => Array::F32(self.elements(n, f32::from_le_bytes)?),
            7 => Array::Bool(self.elements(n, |[b]| b != 0)?),
            8 => {
                let mut strings = Strings::default();
                for _ in 0..n {
                    let len = self.len()?;
                    let at = self.at;
                    let text = std::str::from_utf8(self.take(len)?).map_err(|_| GgufError::Utf8(at))?;
                    strings.text.push_str(text);
                    strings.ends.push(strings.text.len());
                }
                Array::Str(Box::new(strings))
            }
            9 => Array::Nested((0..n).map(|_| self.array_value(depth + 1)).collect::<Result<_, _>>()?),
            10 => Array::U64(self.elements(n, u64::from_le_bytes)?),
            11 => Array::I64(self.elements(n, i64::from_le_bytes)?),
            12 => Array::F64(self.elements(n, f64::from_le_bytes)?),
            other => return Err(GgufError::ValueType(other)),
        })
    }
}

impl Gguf {
    /// Parses the header, metadata and tensor directory of a GGUF file's bytes.
    pub fn parse(bytes: impl Into<Bytes>) -> Result<Self, GgufError> {
        let bytes = bytes.into();
        let mut r = Reader { bytes: &bytes, at: 0 };
        let magic: [u8; 4] = r.array()?;
        if &magic != b"GGUF" {
            return Err(GgufError::Magic(magic));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version(version));
        }
        let (n_tensors, n_kv) = (r.len()?, r.len()?);
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty)?;
            if metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut names = std::collections::HashSet::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()? as usize;
            let dims: Vec<usize> = (0..n_dims).map(|_| r.len()).collect::<Result<_, _>>()?;
            if dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none() {
                return Err(GgufError::TensorSize { name, dims });
            }
            let ggml_type = r.u32()?;
            let offset = r.len()?;
            if !names.insert(name.clone()) {
                return Err(GgufError::DuplicateTensor(name));
            }
            tensors.push(TensorInfo { name, dims, ggml_type, offset });
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(value) => value.as_u64().ok_or_else(|| GgufError::MetadataType {
                key: "general.alignment".into(),
                expected: "an unsigned integer",
            })?,
        };
        if !alignment.is_power_of_two() || alignment > 1 << 20 {
            return Err(GgufError::Alignment(alignment));
        }
        let data_start = r.at.next_multiple_of(alignment as usize);
        Ok(Self { metadata, tensors, bytes, data_start })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor `name` as f32 values in row-major shape [ne_{n−1}, …, ne₀].
    pub fn tensor(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), GgufError> {
        let (info, format, raw) = self.raw(name)?;
        Ok((info.shape(), ggml::dequantize(format, raw)))
    }

    /// The matrix `name` ([ne₁, ne₀]) in its stored blocks, copied as they are.
    pub fn packed(&self, name: &str) -> Result<Packed, GgufError> {
        let (info, format, raw) = self.raw(name)?;
        let shape = info.shape();
        let [rows, cols] = shape[..] else {
            return Err(GgufError::NotMatrix { name: name.into(), dims: info.dims.clone() });
        };
        Packed::new(format, rows, cols, raw.to_vec())
            .map_err(|_| GgufError::TensorType { name: name.into(), ggml_type: info.ggml_type })
    }

    /// The tensor `name`'s info, format and bytes.
    fn raw(&self, name: &str) -> Result<(&TensorInfo, Format, &[u8]), GgufError> {
        let info = self.info(name).ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        let n = info.len();
        let unsupported = || GgufError::TensorType { name: name.into(), ggml_type: info.ggml_type };
        let format = ggml::format(info.ggml_type).ok_or_else(unsupported)?;
        // Rows are whole blocks: ggml never splits a block across rows.
        if n % format.block != 0 || info.dims.first().is_some_and(|&ne0| ne0 % format.block != 0) {
            return Err(unsupported());
        }
        let bounds = || GgufError::TensorBounds(name.into());
        let start = self.data_start.checked_add(info.offset).ok_or_else(bounds)?;
        let end =
            (n / format.block).checked_mul(format.bytes).and_then(|len| start.checked_add(len)).ok_or_else(bounds)?;
        let raw = self.bytes.get(start..end).ok_or_else(bounds)?;
        Ok((info, format, raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_magic_and_truncation_are_errors() {
        assert_eq!(Gguf::parse(b"GGML\x03\0\0\0".to_vec()).err(), Some(GgufError::Magic(*b"GGML")));
        assert_eq!(Gguf::parse(b"GGUF\x03\0\0\0\x01".to_vec()).err(), Some(GgufError::Truncated(8)));
    }
}
