//! The contiguous store: per layer and entry one buffer [B, n, capacity, w] that grows a chunk of tokens at a time;
//! each step writes its new tokens in place and attention reads the filled prefix, so nothing is copied per step.

use burn::tensor::{Int, Tensor, TensorData};
use ember_core_model::cache::KvCache;

/// One growing buffer: `data[.., .., 0..len, ..]` is filled.
struct Buffer {
    data: Tensor<4>,
    len: usize,
}

impl Buffer {
    fn capacity(&self) -> usize {
        self.data.dims()[2]
    }

    /// Writes x [B, n, t, w] at `len..len + t`, growing to the next multiple of `chunk` tokens when full.
    fn append(&mut self, x: Tensor<4>, chunk: usize) -> Tensor<4> {
        let [b, n, t, w] = x.dims();
        let end = self.len + t;
        if end > self.capacity() {
            let grown = Tensor::<4>::zeros([b, n, end.div_ceil(chunk) * chunk, w], (&x.device(), x.dtype()));
            let filled = self.data.clone().slice([0..b, 0..n, 0..self.len, 0..w]);
            self.data = grown.slice_assign([0..b, 0..n, 0..self.len, 0..w], filled);
        }
        // Taken out of self for the write, so the buffer has one owner and is written in place, not copied.
        let data = std::mem::replace(&mut self.data, Tensor::empty([0, 0, 0, 0], &x.device()));
        self.data = data.slice_assign([0..b, 0..n, self.len..end, 0..w], x);
        self.len = end;
        self.data.clone().slice([0..b, 0..n, 0..end, 0..w])
    }
}

/// Contiguous per-layer buffers (one per entry, once the layer has appended), grown `chunk` tokens at a time.
pub struct ContiguousCache {
    chunk: usize,
    layers: Vec<Option<[Buffer; 2]>>,
}

impl ContiguousCache {
    pub fn new(chunk: usize) -> Self {
        Self { chunk: chunk.max(1), layers: Vec::new() }
    }

    /// Row r of every buffer becomes old row `rows[r]` (beam search keeping the survivors' histories).
    pub fn reorder(&mut self, rows: &[usize], device: &burn::tensor::Device) {
        let index = Tensor::<1, Int>::from_data(
            TensorData::new(rows.iter().map(|&r| r as i64).collect::<Vec<_>>(), [rows.len()]),
            device,
        );
        for buffer in self.layers.iter_mut().flatten().flatten() {
            buffer.data = buffer.data.clone().select(0, index.clone());
        }
    }

    /// Bytes allocated (capacity) and bytes holding cached tokens, over every layer, in the entries' float type.
    pub fn usage(&self) -> (usize, usize) {
        let mut allocated = 0;
        let mut used = 0;
        for buffer in self.layers.iter().flatten().flatten() {
            let [b, n, cap, w] = buffer.data.dims();
            let size = buffer.data.dtype().size();
            allocated += b * n * cap * w * size;
            used += b * n * buffer.len * w * size;
        }
        (allocated, used)
    }
}

impl KvCache for ContiguousCache {
    fn len(&self) -> usize {
        self.layers.iter().flatten().flatten().map(|b| b.len).min().unwrap_or(0)
    }

    fn bytes(&self) -> usize {
        self.usage().0
    }

    fn clear(&mut self) {
        self.layers.clear();
    }

    fn truncate(&mut self, len: usize) -> bool {
        for buffer in self.layers.iter_mut().flatten().flatten() {
            buffer.len = buffer.len.min(len);
        }
        true
    }

    fn append(&mut self, layer: usize, entries: [Tensor<4>; 2]) -> [Tensor<4>; 2] {
        if self.layers.len() <= layer {
            self.layers.resize_with(layer + 1, || None);
        }
        let chunk = self.chunk;
        let [first, second] = self.layers[layer].get_or_insert_with(|| {
            entries.each_ref().map(|x| {
                let [b, n, t, w] = x.dims();
                Buffer { data: Tensor::zeros([b, n, t.div_ceil(chunk) * chunk, w], (&x.device(), x.dtype())), len: 0 }
            })
        });
        let [a, b] = entries;
        [first.append(a, chunk), second.append(b, chunk)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DType, Device, FloatDType};

    /// A store of f16 keys grows past its first chunk in f16, holding every appended token.
    #[test]
    fn growing_keeps_the_entries_float_type() {
        let device = Device::flex();
        let mut cache = ContiguousCache::new(4);
        let token = |i: usize| Tensor::<4>::full([1, 2, 1, 8], i as f32, &device).cast(FloatDType::F16);
        let mut last = None;
        for i in 0..6 {
            last = Some(cache.append(0, [token(i), token(i)]));
        }
        let [k, _] = last.unwrap();
        assert_eq!((k.dims(), k.dtype()), ([1, 2, 6, 8], DType::F16));
        let rows = k.slice([0..1, 0..1, 0..6, 0..1]).cast(FloatDType::F32).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(rows, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    }
}
