//! GGUF files written: metadata typed as llama.cpp's loader reads it (integers as u32 unless they need more, numbers
//! as f32, arrays at their elements' own width), then the tensor directory and each tensor's bytes aligned to 32.

use std::io::{self, Write};

use super::{Array, Value};
use crate::ggml::Format;

/// The alignment of the data section and of every tensor in it (GGUF's default, so no `general.alignment` is written).
const ALIGNMENT: usize = 32;

/// A GGUF file being assembled: metadata in the order it was set, tensors in the order they were added.
#[derive(Default)]
pub struct Writer {
    metadata: Vec<(String, Value)>,
    tensors: Vec<Tensor>,
}

struct Tensor {
    name: String,
    shape: Vec<usize>,
    format: Format,
    bytes: Vec<u8>,
}

impl Writer {
    /// Sets `key` to `value`, replacing an earlier value of the same key in its place.
    pub fn set(&mut self, key: &str, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    /// Adds the tensor `name` of row-major `shape` ([out, in] for a matrix), `bytes` in `format`'s blocks.
    pub fn tensor(&mut self, name: &str, shape: &[usize], format: Format, bytes: Vec<u8>) {
        self.tensors.push(Tensor { name: name.to_string(), shape: shape.to_vec(), format, bytes });
    }

    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// The whole file to `out`: header, metadata, tensor directory, padding, tensor data.
    pub fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            string(&mut head, key);
            self::value(&mut head, value);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            string(&mut head, &t.name);
            head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            // GGUF lists the fastest dimension first.
            for &dim in t.shape.iter().rev() {
                head.extend_from_slice(&(dim as u64).to_le_bytes());
            }
            head.extend_from_slice(&t.format.id.to_le_bytes());
            head.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + t.bytes.len()).next_multiple_of(ALIGNMENT);
        }
        head.resize(head.len().next_multiple_of(ALIGNMENT), 0);
        out.write_all(&head)?;
        for t in &self.tensors {
            out.write_all(&t.bytes)?;
            out.write_all(&[0; ALIGNMENT][..t.bytes.len().next_multiple_of(ALIGNMENT) - t.bytes.len()])?;
        }
        out.flush()
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A scalar's type and bytes: u32 and i32 where the value fits them, else u64 and i64, and numbers as f32 (llama.cpp's
/// loader requires u32 counts and f32 hyper-parameters).
fn value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Uint(v) => match u32::try_from(*v) {
            Ok(v) => tagged(out, 4, &v.to_le_bytes()),
            Err(_) => tagged(out, 10, &v.to_le_bytes()),
        },
        Value::Int(v) => match i32::try_from(*v) {
            Ok(v) => tagged(out, 5, &v.to_le_bytes()),
            Err(_) => tagged(out, 11, &v.to_le_bytes()),
        },
        Value::Float(v) => tagged(out, 6, &(*v as f32).to_le_bytes()),
        Value::Bool(v) => tagged(out, 7, &[*v as u8]),
        Value::Str(s) => {
            out.extend_from_slice(&8u32.to_le_bytes());
            string(out, s);
        }
        Value::Array(a) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            array(out, a);
        }
    }
}

fn tagged(out: &mut Vec<u8>, ty: u32, bytes: &[u8]) {
    out.extend_from_slice(&ty.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// An array's element type, length and elements, each at the width it was read with.
fn array(out: &mut Vec<u8>, a: &Array) {
    fn fixed<T: Copy, const N: usize>(out: &mut Vec<u8>, ty: u32, v: &[T], bytes: fn(T) -> [u8; N]) {
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter().for_each(|&x| out.extend_from_slice(&bytes(x)));
    }
    match a {
        Array::U8(v) => fixed(out, 0, v, |x| [x]),
        Array::I8(v) => fixed(out, 1, v, |x| x.to_le_bytes()),
        Array::U16(v) => fixed(out, 2, v, u16::to_le_bytes),
        Array::I16(v) => fixed(out, 3, v, i16::to_le_bytes),
        Array::U32(v) => fixed(out, 4, v, u32::to_le_bytes),
        Array::I32(v) => fixed(out, 5, v, i32::to_le_bytes),
        Array::F32(v) => fixed(out, 6, v, f32::to_le_bytes),
        Array::Bool(v) => fixed(out, 7, v, |x| [x as u8]),
        Array::Str(strings) => {
            out.extend_from_slice(&8u32.to_le_bytes());
            out.extend_from_slice(&(strings.len() as u64).to_le_bytes());
            strings.iter().for_each(|s| string(out, s));
        }
        Array::Nested(arrays) => {
            out.extend_from_slice(&9u32.to_le_bytes());
            out.extend_from_slice(&(arrays.len() as u64).to_le_bytes());
            arrays.iter().for_each(|a| array(out, a));
        }
        Array::U64(v) => fixed(out, 10, v, u64::to_le_bytes),
        Array::I64(v) => fixed(out, 11, v, i64::to_le_bytes),
        Array::F64(v) => fixed(out, 12, v, f64::to_le_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml;
    use crate::gguf::Gguf;

    #[test]
    fn what_is_written_reads_back() {
        let mut w = Writer::default();
        w.set("general.architecture", Value::Str("llama".into()));
        w.set("llama.block_count", Value::Uint(2));
        w.set("llama.block_count", Value::Uint(3));
        w.set("big", Value::Uint(1 << 40));
        w.set("eps", Value::Float(1e-5));
        w.set("theta", Value::Float(10_000.0));
        w.set("add_bos", Value::Bool(true));
        w.set("tokens", Value::Array(Array::Str(Box::new(["a", "é", ""].into_iter().collect()))));
        w.set("types", Value::Array(Array::I32(vec![1, 3, -1])));
        w.set("nested", Value::Array(Array::Nested(vec![Array::U8(vec![7]), Array::F64(vec![0.1])])));
        let q8 = ggml::by_name("q8_0").unwrap();
        let values: Vec<f32> = (0..64).map(|i| i as f32 / 8.0 - 4.0).collect();
        let blocks = ggml::quantize(q8, &values).unwrap();
        w.tensor(
            "norm",
            &[3],
            ggml::by_name("f32").unwrap(),
            [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect(),
        );
        w.tensor("m", &[2, 32], q8, blocks.clone());
        let mut bytes = Vec::new();
        w.write_to(&mut bytes).unwrap();
        let g = Gguf::parse(bytes).unwrap();
        assert_eq!(g.get("llama.block_count"), Some(&Value::Uint(3)));
        assert_eq!(g.metadata.len(), 9);
        assert_eq!(g.get("big"), Some(&Value::Uint(1 << 40)));
        assert_eq!(g.get("eps").and_then(Value::as_f64), Some(1e-5f32 as f64));
        assert_eq!(g.get("theta"), Some(&Value::Float(10_000.0)));
        assert_eq!(g.get("add_bos"), Some(&Value::Bool(true)));
        let tokens = g.get("tokens").and_then(Value::as_array).and_then(Array::strings).unwrap();
        assert_eq!(tokens.iter().collect::<Vec<_>>(), ["a", "é", ""]);
        assert_eq!(g.get("types"), Some(&Value::Array(Array::I32(vec![1, 3, -1]))));
        assert_eq!(
            g.get("nested"),
            Some(&Value::Array(Array::Nested(vec![Array::U8(vec![7]), Array::F64(vec![0.1])])))
        );
        assert_eq!(g.tensor("norm").unwrap(), (vec![3], vec![1.0, 2.0, 3.0]));
        assert_eq!(g.info("m").unwrap().dims, [32, 2]);
        assert_eq!(g.packed("m").unwrap().bytes, blocks);
        assert_eq!(g.tensors[1].offset % ALIGNMENT, 0);
    }
}
