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
            let grown = Tensor::<4>::zeros([b, n, end.div_ceil(chunk) * chunk, w], &x.device());
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

    /// Bytes allocated (capacity) and bytes holding cached tokens, over every layer (f32).
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
