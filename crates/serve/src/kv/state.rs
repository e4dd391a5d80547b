//! The recurrent store of linear attention: per layer the fixed state S = Σ_j φ(k_j) v_jᵀ and z = Σ_j φ(k_j)
//! ([`LinearState`]) instead of every key and value, so a sequence's bytes and each decoded token's work stay the
//! same however long it grows.

use burn::tensor::Tensor;
use ember_core_model::cache::KvCache;
use ember_kernels::{AttentionSpec, LinearState, recurrent_attention};

/// One [`LinearState`] per layer, and the tokens each layer has seen.
#[derive(Default)]
pub struct StateCache {
    layers: Vec<Option<LinearState>>,
    seen: Vec<usize>,
}

impl KvCache for StateCache {
    fn len(&self) -> usize {
        self.seen.iter().copied().min().unwrap_or(0)
    }

    fn bytes(&self) -> usize {
        self.layers.iter().flatten().map(LinearState::bytes).sum()
    }

    fn clear(&mut self) {
        self.layers.clear();
        self.seen.clear();
    }

    /// Keys are folded into the state, never kept: only linear-attention layers use this store, through `attend`
    /// (`KvSpec::check` refuses it for any other model).
    fn append(&mut self, _layer: usize, _entries: [Tensor<4>; 2]) -> [Tensor<4>; 2] {
        unreachable!("the recurrent store keeps no keys; a softmax or MLA layer cannot append to it")
    }

    fn attend(&mut self, layer: usize, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
        if self.layers.len() <= layer {
            self.layers.resize_with(layer + 1, || None);
            self.seen.resize(layer + 1, 0);
        }
        let t = q.dims()[2];
        let (y, state) = recurrent_attention(q, k, v, self.layers[layer].take(), spec);
        self.layers[layer] = Some(state);
        self.seen[layer] += t;
        y
    }
}
