//! The seam between a model's incremental forward pass and the KV stores of `serve`.

use burn::tensor::Tensor;
use ember_kernels::{AttentionSpec, attention};

/// Per-layer, per-token state that decoding appends to and attends over. A layer of MHA / GQA / MQA appends
/// `[k, v]`, each [B, g, T_new, d_h] with k already rotated at its own positions; a layer of MLA appends `[c, k_R]`,
/// [B, 1, T_new, d_c] and [B, 1, T_new, d_R].
pub trait KvCache {
    /// Tokens cached before the current step (the position of its first new token); read before any layer appends.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes the store holds for this sequence (allocated, including quantization scales).
    fn bytes(&self) -> usize;
    /// Forgets everything (a new sequence, or a context shift that re-fills it).
    fn clear(&mut self);
    /// Appends this step's entries of `layer` and returns everything that layer holds, [B, n, len + T_new, w] each.
    fn append(&mut self, layer: usize, entries: Vec<Tensor<4>>) -> Vec<Tensor<4>>;

    /// Appends this step's k, v of an MHA / GQA / MQA `layer` and returns o = softmax(q kᵀ·scale + mask) v over
    /// everything stored. Stores whose layout a kernel reads in place (pages, int8 codes) override it.
    fn attend(&mut self, layer: usize, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
        attend_appended(self, layer, q, k, v, spec)
    }
}

/// [`KvCache::attend`] by appending, then attending over what `append` returns.
pub fn attend_appended<C: KvCache + ?Sized>(
    cache: &mut C,
    layer: usize,
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    spec: &AttentionSpec,
) -> Tensor<4> {
    let mut kv = cache.append(layer, vec![k, v]).into_iter();
    let (k, v) = (kv.next().expect("keys"), kv.next().expect("values"));
    attention(q, k, v, spec)
}
