//! A weight matrix kept in ggml's block formats: rows of `cols` values stored one after another as blocks, as GGUF
//! files hold them ([out, in], one row per output). Consecutive groups of rows may differ in format: a fused
//! projection made of a Q4_K query and a Q6_K value matrix keeps both as they are.

use crate::ggml::{self, Format};

/// `rows` consecutive rows of one format.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Part {
    pub format: Format,
    pub rows: usize,
}

/// A [rows, cols] matrix as ggml blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct Packed {
    pub parts: Vec<Part>,
    pub cols: usize,
    pub bytes: Vec<u8>,
}

/// Why bytes do not make a packed matrix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PackedError {
    #[error("rows of {cols} values are not whole {format} blocks of {block}")]
    Blocks { format: &'static str, cols: usize, block: usize },
    #[error("{found} bytes for {rows} rows of {cols} {format} values, which take {expected}")]
    Length { format: &'static str, rows: usize, cols: usize, found: usize, expected: usize },
    #[error("Ember does not write {0} (it writes {written})", written = ggml::WRITTEN)]
    NotWritten(&'static str),
    #[error("matrices of {0} and {1} columns cannot be stacked")]
    Columns(usize, usize),
}

impl Packed {
    /// `rows` rows of `cols` values of `format` in `bytes`.
    pub fn new(format: Format, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self, PackedError> {
        let row = row_bytes(format, cols)?;
        if rows.checked_mul(row) != Some(bytes.len()) {
            let expected = rows.saturating_mul(row);
            return Err(PackedError::Length { format: format.name, rows, cols, found: bytes.len(), expected });
        }
        Ok(Self { parts: vec![Part { format, rows }], cols, bytes })
    }

    /// The [rows, cols] row-major `values` quantized to `format`.
    pub fn quantize(format: Format, rows: usize, cols: usize, values: &[f32]) -> Result<Self, PackedError> {
        row_bytes(format, cols)?;
        let bytes = ggml::quantize(format, values).ok_or(PackedError::NotWritten(format.name))?;
        Self::new(format, rows, cols, bytes)
    }

    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.rows).sum()
    }

    /// Each row's format and bytes, in order.
    pub fn row_blocks(&self) -> impl Iterator<Item = (Format, &[u8])> {
        let mut at = 0;
        self.parts.iter().flat_map(move |part| {
            let row = part.format.row_bytes(self.cols).expect("checked when built");
            let start = at;
            at += part.rows * row;
            self.bytes[start..start + part.rows * row].chunks_exact(row).map(move |b| (part.format, b))
        })
    }

    /// The matrix as f32 values, row-major [rows, cols].
    pub fn dequantize(&self) -> Vec<f32> {
        self.row_blocks().flat_map(|(format, b)| ggml::dequantize(format, b)).collect()
    }

    /// The matrices stacked row-wise (a fused projection of separate ones); neighbouring parts of one format merge.
    pub fn stack(matrices: Vec<Packed>) -> Result<Self, PackedError> {
        let cols = matrices.first().map_or(0, |m| m.cols);
        let mut out = Self { parts: Vec::new(), cols, bytes: Vec::new() };
        for m in matrices {
            if m.cols != cols {
                return Err(PackedError::Columns(cols, m.cols));
            }
            for part in m.parts {
                match out.parts.last_mut() {
                    Some(last) if last.format == part.format => last.rows += part.rows,
                    _ => out.parts.push(part),
                }
            }
            out.bytes.extend_from_slice(&m.bytes);
        }
        Ok(out)
    }

    /// The matrix with row i taken from row `order[i]` of a one-format matrix (a permutation of its rows, or a
    /// selection).
    pub fn reorder_rows(&self, order: &[usize]) -> Self {
        let rows: Vec<&[u8]> = self.row_blocks().map(|(_, b)| b).collect();
        let bytes = order.iter().flat_map(|&i| rows[i].iter().copied()).collect();
        assert_eq!(self.parts.len(), 1, "rows are reordered within one format");
        Self { parts: vec![Part { format: self.parts[0].format, rows: order.len() }], cols: self.cols, bytes }
    }

    /// Rows `range` of the matrix, in their formats (a projection split out of a fused one).
    pub fn row_range(&self, range: std::ops::Range<usize>) -> Self {
        let mut out = Self { parts: Vec::new(), cols: self.cols, bytes: Vec::new() };
        for (format, row) in self.row_blocks().skip(range.start).take(range.len()) {
            match out.parts.last_mut() {
                Some(last) if last.format == format => last.rows += 1,
                _ => out.parts.push(Part { format, rows: 1 }),
            }
            out.bytes.extend_from_slice(row);
        }
        out
    }

    /// A short description: "Q4_K 1024 + Q6_K 128 rows × 640".
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self.parts.iter().map(|p| format!("{} {}", p.format.name, p.rows)).collect();
        format!("{} rows × {}", parts.join(" + "), self.cols)
    }
}

fn row_bytes(format: Format, cols: usize) -> Result<usize, PackedError> {
    format.row_bytes(cols).ok_or(PackedError::Blocks { format: format.name, cols, block: format.block })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::by_name;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect()
    }

    #[test]
    fn quantized_rows_dequantize_within_a_step() {
        let values = ramp(4 * 64);
        for (name, levels) in [("Q8_0", 255.0), ("Q4_0", 15.0), ("Q4_1", 15.0), ("Q5_0", 31.0), ("Q5_1", 31.0)] {
            let packed = Packed::quantize(by_name(name).unwrap(), 4, 64, &values).unwrap();
            let back = packed.dequantize();
            for (block, (x, y)) in values.chunks(32).zip(back.chunks(32)).enumerate() {
                let range = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) * 2.0;
                let step = range / levels;
                // Half a step from rounding; a whole one at the far end of the symmetric formats, whose codes
                // reach −levels/2 · d on the side of the largest magnitude and only (levels/2 − 1) · d on the other.
                for (a, b) in x.iter().zip(y) {
                    assert!((a - b).abs() <= step + 2e-3 * range, "{name} block {block}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn half_precision_round_trips_and_rounds_to_nearest_even() {
        for h in [0x0001u16, 0x03ff, 0x0400, 0x3c00, 0x3555, 0x7bff, 0xc000, 0x8001] {
            assert_eq!(ggml::to_f16(ggml::f16(h)), h);
        }
        // 1 + 2⁻¹¹ lies halfway between 1 and 1 + 2⁻¹⁰: to even, 1.
        assert_eq!(ggml::to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(ggml::to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(ggml::to_f16(65520.0), 0x7c00);
        assert_eq!(ggml::to_f16(1e-9), 0);
    }

    #[test]
    fn stacked_parts_keep_their_formats_and_rows() {
        let (q8, q4) = (by_name("q8_0").unwrap(), by_name("q4_1").unwrap());
        let a = Packed::quantize(q8, 2, 32, &ramp(64)).unwrap();
        let b = Packed::quantize(q4, 1, 32, &ramp(32)).unwrap();
        let stacked = Packed::stack(vec![a.clone(), a.clone(), b.clone()]).unwrap();
        assert_eq!(stacked.parts, vec![Part { format: q8, rows: 4 }, Part { format: q4, rows: 1 }]);
        let mut expected = a.dequantize();
        expected.extend(a.dequantize());
        expected.extend(b.dequantize());
        assert_eq!(stacked.dequantize(), expected);
        assert_eq!(stacked.describe(), "Q8_0 4 + Q4_1 1 rows × 32");
        let swapped = a.reorder_rows(&[1, 0]).dequantize();
        assert_eq!(swapped[..32], a.dequantize()[32..]);
        assert!(Packed::new(q8, 2, 32, vec![0; 10]).is_err());
        assert!(Packed::quantize(by_name("Q4_K").unwrap(), 1, 256, &ramp(256)).is_err());
    }
}
