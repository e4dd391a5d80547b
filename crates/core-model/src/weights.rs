//! A model's stored weights before it is built: dense tensors by path, and the matrices kept in ggml blocks (a GGUF
//! file's, or a quantized run directory's), with the conversions `--weights` asks for.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use burn::tensor::TensorData;
use ember_formats::ggml::{self, Format};
use ember_formats::packed::{Packed, PackedError};

/// Tensors by name.
pub type Tensors = HashMap<String, TensorData>;

/// How a model's projections and token embedding are held in memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WeightFormat {
    /// As stored: a GGUF file's blocks, a run directory's f32 (or its quantized blocks).
    Native,
    /// Dequantized to f32.
    F32,
    /// Converted to one ggml format (F16, Q8_0, Q4_0, …), from f32 or from the stored blocks.
    Packed(Format),
}

impl FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "native" => Ok(Self::Native),
            "f32" => Ok(Self::F32),
            name => match ggml::by_name(name) {
                Some(format) if format.encode.is_some() => Ok(Self::Packed(format)),
                _ => Err(format!("unknown weight format {s:?} (native, f32, or one of {})", ggml::WRITTEN)),
            },
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Native => f.write_str("native"),
            Self::F32 => f.write_str("f32"),
            Self::Packed(format) => f.write_str(&format.name.to_ascii_lowercase()),
        }
    }
}

/// Stored weights by path: dense, and packed matrices (rows are outputs, as in GGUF).
#[derive(Default)]
pub struct Weights {
    pub dense: Tensors,
    pub packed: HashMap<String, Packed>,
}

/// Whether the parameter at `path` can be held packed, and how its dense tensor is laid out: the token embedding
/// [V, d] has a packed matrix's rows as they are; projections are stored [d_in, d_out] (Burn's layout), the
/// transpose of the packed [d_out, d_in].
fn packed_layout(path: &str) -> Option<bool> {
    const PROJECTIONS: [&str; 5] =
        ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_gate.weight", "mlp.c_proj.weight"];
    if path == "wte.weight" {
        return Some(false);
    }
    let projection = path == "lm_head.weight"
        || path
            .strip_prefix("blocks.")
            .and_then(|p| p.split_once('.'))
            .is_some_and(|(_, rest)| PROJECTIONS.contains(&rest));
    projection.then_some(true)
}

impl Weights {
    /// The weights in `format` (Native leaves them as they are).
    pub fn convert(mut self, format: WeightFormat) -> Result<Self, PackedError> {
        match format {
            WeightFormat::Native => {}
            WeightFormat::F32 => {
                for (path, w) in std::mem::take(&mut self.packed) {
                    let transposed = packed_layout(&path).unwrap_or(true);
                    self.dense.insert(path, dense(&w, transposed));
                }
            }
            WeightFormat::Packed(format) => {
                let paths: Vec<String> = self.dense.keys().filter(|p| packed_layout(p).is_some()).cloned().collect();
                for path in paths {
                    let transposed = packed_layout(&path) == Some(true);
                    let data = &self.dense[&path];
                    let (rows, cols) = match (&data.shape()[..], transposed) {
                        (&[a, b], true) => (b, a),
                        (&[a, b], false) => (a, b),
                        _ => continue,
                    };
                    // Rows of a width that is not whole blocks stay dense.
                    if format.row_bytes(cols).is_none() {
                        continue;
                    }
                    let values = data.as_slice::<f32>().expect("stored weights are f32");
                    let values = if transposed { transpose(values, cols, rows) } else { values.to_vec() };
                    self.packed.insert(path.clone(), Packed::quantize(format, rows, cols, &values)?);
                    self.dense.remove(&path);
                }
                for w in self.packed.values_mut() {
                    if w.parts.iter().any(|p| p.format != format) {
                        *w = Packed::quantize(format, w.rows(), w.cols, &w.dequantize())?;
                    }
                }
            }
        }
        Ok(self)
    }
}

/// A packed matrix as a dense tensor: [cols, rows] when `transposed` (a projection in Burn's layout), else as is.
fn dense(w: &Packed, transposed: bool) -> TensorData {
    let (rows, cols, values) = (w.rows(), w.cols, w.dequantize());
    match transposed {
        true => TensorData::new(transpose(&values, rows, cols), [cols, rows]),
        false => TensorData::new(values, [rows, cols]),
    }
}

/// A row-major [rows, cols] matrix as [cols, rows].
pub fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_print() {
        for name in ["native", "f32", "f16", "q8_0", "q4_1"] {
            assert_eq!(name.parse::<WeightFormat>().unwrap().to_string(), name);
        }
        assert!("q4_k".parse::<WeightFormat>().unwrap_err().contains("unknown weight format"));
    }

    #[test]
    fn projections_are_packed_transposed_and_come_back() {
        let (d_in, d_out) = (64, 3);
        let w: Vec<f32> = (0..d_in * d_out).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
        let mut weights = Weights::default();
        weights.dense.insert("blocks.0.mlp.c_fc.weight".into(), TensorData::new(w.clone(), [d_in, d_out]));
        weights.dense.insert("blocks.0.ln_1.gamma".into(), TensorData::new(vec![1.0f32; d_in], [d_in]));
        let packed = weights.convert(WeightFormat::Packed(ggml::by_name("f32").unwrap())).unwrap();
        assert_eq!(packed.dense.len(), 1);
        let fc = &packed.packed["blocks.0.mlp.c_fc.weight"];
        assert_eq!((fc.rows(), fc.cols), (d_out, d_in));
        let back = packed.convert(WeightFormat::F32).unwrap();
        assert_eq!(back.dense["blocks.0.mlp.c_fc.weight"], TensorData::new(w, [d_in, d_out]));
    }
}
