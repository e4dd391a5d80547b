//! Quantized stores: keys and values kept as int8 or int4 with one f32 scale per group of G values,
//! x̂ = s·clip(round(x/s), −q_max, q_max), s = max|x| / q_max over the group (symmetric). Tokens are quantized as they
//! are appended and dequantized when attention reads them.

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::cache::{KvCache, attend_appended};
use ember_kernels::{AttentionSpec, Int8Kv, decodes_in_place, int8_attention};

/// Bits per cached value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bits {
    Int8,
    Int4,
}

impl Bits {
    fn q_max(self) -> f32 {
        match self {
            Bits::Int8 => 127.0,
            Bits::Int4 => 7.0,
        }
    }
}

/// Symmetric per-group quantization of `x` (length a multiple of `group`): the integers and one scale per group.
pub fn quantize(x: &[f32], group: usize, bits: Bits) -> (Vec<i8>, Vec<f32>) {
    let q_max = bits.q_max();
    let mut q = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / group);
    for g in x.chunks(group) {
        let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let s = if amax > 0.0 { amax / q_max } else { 1.0 };
        scales.push(s);
        q.extend(g.iter().map(|v| (v / s).round().clamp(-q_max, q_max) as i8));
    }
    (q, scales)
}

/// x̂ = s · q, group by group.
pub fn dequantize(q: &[i8], scales: &[f32], group: usize) -> Vec<f32> {
    q.chunks(group).zip(scales).flat_map(|(g, &s)| g.iter().map(move |&v| v as f32 * s)).collect()
}

/// int8 as bytes, or int4 two to a byte (low nibble first, offset by 8), padded to whole bytes per token row.
fn pack(q: &[i8], bits: Bits, row: usize) -> Vec<u8> {
    match bits {
        Bits::Int8 => q.iter().map(|&v| v as u8).collect(),
        Bits::Int4 => q
            .chunks(row)
            .flat_map(|r| r.chunks(2).map(|p| ((p[0] + 8) as u8) | (((p.get(1).copied().unwrap_or(0) + 8) as u8) << 4)))
            .collect(),
    }
}

fn unpack(bytes: &[u8], bits: Bits, row: usize) -> Vec<i8> {
    match bits {
        Bits::Int8 => bytes.iter().map(|&b| b as i8).collect(),
        Bits::Int4 => bytes
            .chunks(row.div_ceil(2))
            .flat_map(|r| r.iter().flat_map(|&b| [(b & 0x0f) as i8 - 8, (b >> 4) as i8 - 8]).take(row))
            .collect(),
    }
}

/// One entry of one layer: token-major [t][n·w] quantized rows, packed, with their scales (one per `group` values).
struct Rows {
    n: usize,
    w: usize,
    group: usize,
    packed: Vec<u8>,
    scales: Vec<f32>,
    tokens: usize,
    /// int8 codes as 32-bit words [t, n·w/4] and scales [t, n·w/G] on the device, for the int8 decoding kernel.
    uploaded: Option<(Tensor<2, Int>, Tensor<2>)>,
}

impl Rows {
    /// The int8 codes and scales on `device`, uploading the tokens stored since the last call.
    fn on_device(&mut self, device: &Device) -> (Tensor<2, Int>, Tensor<2>) {
        let (row, per_token) = (self.n * self.w, self.scales.len() / self.tokens.max(1));
        let have = self.uploaded.as_ref().map_or(0, |(codes, _)| codes.dims()[0]);
        let new = self.tokens - have;
        let words: Vec<i32> =
            self.packed[have * row..].chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let codes = Tensor::<2, Int>::from_data(TensorData::new(words, [new, row / 4]), device);
        let scales =
            Tensor::<2>::from_data(TensorData::new(self.scales[have * per_token..].to_vec(), [new, per_token]), device);
        let (codes, scales) = match self.uploaded.take() {
            Some((c, s)) if new > 0 => (Tensor::cat(vec![c, codes], 0), Tensor::cat(vec![s, scales], 0)),
            Some(both) => both,
            None => (codes, scales),
        };
        self.uploaded = Some((codes.clone(), scales.clone()));
        (codes, scales)
    }
}

/// A store of int8 or int4 values with per-group scales: per layer one [`Rows`] per entry, once the layer has
/// appended.
pub struct QuantizedCache {
    bits: Bits,
    group: usize,
    layers: Vec<Option<[Rows; 2]>>,
}

impl QuantizedCache {
    /// `group` values share a scale; it must divide the head width (it is clamped to it otherwise).
    pub fn new(bits: Bits, group: usize) -> Self {
        Self { bits, group: group.max(1), layers: Vec::new() }
    }
}

impl KvCache for QuantizedCache {
    fn len(&self) -> usize {
        self.layers.iter().flatten().flatten().map(|r| r.tokens).min().unwrap_or(0)
    }

    /// The packed integers and the f32 scales.
    fn bytes(&self) -> usize {
        self.layers.iter().flatten().flatten().map(|r| r.packed.len() + r.scales.len() * 4).sum()
    }

    fn clear(&mut self) {
        self.layers.clear();
    }

    fn append(&mut self, layer: usize, entries: [Tensor<4>; 2]) -> [Tensor<4>; 2] {
        let device = entries[0].device();
        let bits = self.bits;
        self.store(layer, &entries).each_ref().map(|rows| {
            let all = dequantize(&unpack(&rows.packed, bits, rows.n * rows.w), &rows.scales, rows.group);
            let tensor = Tensor::<3>::from_data(TensorData::new(all, [rows.tokens, rows.n, rows.w]), &device);
            tensor.swap_dims(0, 1).unsqueeze::<4>()
        })
    }

    /// int8 decoding on wgpu reads the codes with the int8 kernel, dequantizing in it instead of here.
    fn attend(&mut self, layer: usize, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
        if self.bits != Bits::Int8 || !decodes_in_place(&q, spec) {
            return attend_appended(self, layer, q, k, v, spec);
        }
        let device = q.device();
        let [k_rows, v_rows] = self.store(layer, &[k, v]);
        let group = k_rows.group;
        let [(k_codes, k_scales), (v_codes, v_scales)] = [k_rows, v_rows].map(|rows| rows.on_device(&device));
        let kv = Int8Kv {
            k_codes: k_codes.unsqueeze(),
            k_scales: k_scales.unsqueeze(),
            v_codes: v_codes.unsqueeze(),
            v_scales: v_scales.unsqueeze(),
            group,
        };
        int8_attention(q, kv, spec)
    }
}

impl QuantizedCache {
    /// Quantizes this step's entries of `layer` onto its rows and returns them.
    fn store(&mut self, layer: usize, entries: &[Tensor<4>; 2]) -> &mut [Rows; 2] {
        if self.layers.len() <= layer {
            self.layers.resize_with(layer + 1, || None);
        }
        let (bits, group) = (self.bits, self.group);
        let layer_rows = self.layers[layer].get_or_insert_with(|| {
            entries.each_ref().map(|x| {
                let [_, n, _, w] = x.dims();
                // The group must divide the row width w; it is clamped to w otherwise.
                let group = if w.is_multiple_of(group) { group } else { w };
                Rows { n, w, group, packed: Vec::new(), scales: Vec::new(), tokens: 0, uploaded: None }
            })
        });
        for (rows, x) in layer_rows.iter_mut().zip(entries) {
            let [_, n, t, w] = x.dims();
            // [1, n, t, w] → token-major [t, n, w].
            let values = x.clone().reshape([n, t, w]).swap_dims(0, 1).into_data().convert::<f32>();
            let (q, s) = quantize(values.as_slice::<f32>().expect("f32 keys and values"), rows.group, bits);
            rows.packed.extend(pack(&q, bits, n * w));
            rows.scales.extend(s);
            rows.tokens += t;
        }
        layer_rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_error_is_at_most_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.37).collect();
        for (bits, q_max) in [(Bits::Int8, 127.0f32), (Bits::Int4, 7.0)] {
            let (q, s) = quantize(&x, 16, bits);
            assert!(q.iter().all(|&v| (v as f32).abs() <= q_max));
            assert_eq!(unpack(&pack(&q, bits, 64), bits, 64), q, "{bits:?} packs losslessly");
            let back = dequantize(&q, &s, 16);
            for (g, (xs, bs)) in x.chunks(16).zip(back.chunks(16)).enumerate() {
                let err = ember_test_support::max_abs_diff(xs, bs);
                assert!(err <= s[g] / 2.0 + 1e-6, "{bits:?} group {g}: {err} > {}", s[g] / 2.0);
            }
        }
    }
}
