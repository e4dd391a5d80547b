//! The seam between a model's forward pass and the KV stores of `serve`: what the new tokens attend to besides each
//! other, and the stores themselves.

use burn::tensor::{Device, Tensor};
use ember_kernels::{AttentionSpec, Similarity, attention};

use crate::nn::position::Positions;

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
    /// Keeps only the first `len` tokens (speculative decoding drops the drafts the model rejected); false, leaving
    /// the store as it was, when the store cannot roll back (the default).
    fn truncate(&mut self, _len: usize) -> bool {
        false
    }
    /// Appends this step's entries of `layer` and returns everything that layer holds, [B, n, len + T_new, w] each.
    fn append(&mut self, layer: usize, entries: [Tensor<4>; 2]) -> [Tensor<4>; 2];

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
    let [k, v] = cache.append(layer, [k, v]);
    attention(q, k, v, spec)
}

/// What the new tokens of a forward pass attend to besides each other; it also fixes their positions.
pub enum Context<'a, 'c> {
    /// Nothing: a whole sequence from position 0 (training, recomputation).
    Full,
    /// Everything `cache` holds: new tokens at positions `cache.len()..`, appended to it layer by layer.
    Cached(&'a mut dyn KvCache),
    /// One new token per row b at position `caches[b].len()`, against everything cache b holds (batched decoding).
    Batched(&'a mut [&'c mut dyn KvCache]),
}

impl Context<'_, '_> {
    /// The positions of `t` new tokens per row, read before any layer appends.
    pub fn positions(&self, t: usize, device: &Device) -> Positions {
        match self {
            Context::Full => Positions::span(0, t, device),
            Context::Cached(cache) => Positions::span(cache.len(), t, device),
            Context::Batched(caches) => {
                debug_assert_eq!(t, 1, "batched decoding takes one token per row");
                Positions::per_row(caches.iter().map(|c| c.len()).collect(), device)
            }
        }
    }

    /// o = attention(q, [K; k], [V; v]) for this pass's q [B, h, T, d] and k, v [B, g, T, d], K and V being what the
    /// context holds for `layer` (k and v appended to it): nothing, one store, or one store per batch row. With
    /// batch rows, softmax attention pads every row's keys to the longest and masks by length; another similarity
    /// attends row by row (a recurrent state holds no keys to pad).
    pub fn attend(&mut self, layer: usize, q: Tensor<4>, [k, v]: [Tensor<4>; 2], spec: &AttentionSpec) -> Tensor<4> {
        match self {
            Context::Full => attention(q, k, v, spec),
            Context::Cached(cache) => cache.attend(layer, q, k, v, spec),
            Context::Batched(caches) if spec.similarity != Similarity::Softmax => {
                let rows = caches.iter_mut().enumerate().map(|(b, cache)| {
                    let row = |x: &Tensor<4>| x.clone().narrow(0, b, 1);
                    let spec = AttentionSpec { query_offset: cache.len(), ..spec.clone() };
                    cache.attend(layer, row(&q), row(&k), row(&v), &spec)
                });
                Tensor::cat(rows.collect(), 0)
            }
            Context::Batched(caches) => {
                let ([k, v], lengths) = append_rows(caches, layer, [k, v], spec.window);
                let spec = AttentionSpec { causal: false, window: None, key_lengths: Some(lengths), ..spec.clone() };
                attention(q, k, v, &spec)
            }
        }
    }
}

/// Appends row b of each entry [B, n, 1, w] to cache b of `layer` and returns every row's entries (its last `window`
/// when set) zero-padded to the longest, [B, n, T_max, w], with the row lengths.
pub fn append_rows(
    caches: &mut [&mut dyn KvCache],
    layer: usize,
    entries: [Tensor<4>; 2],
    window: Option<usize>,
) -> ([Tensor<4>; 2], Vec<usize>) {
    let mut rows: Vec<[Tensor<4>; 2]> = Vec::with_capacity(caches.len());
    let mut lengths = Vec::with_capacity(caches.len());
    for (b, cache) in caches.iter_mut().enumerate() {
        let mine = entries.clone().map(|e| {
            let [_, n, t, w] = e.dims();
            e.slice([b..b + 1, 0..n, 0..t, 0..w])
        });
        let all = cache.append(layer, mine).map(|a| {
            let [_, n, t, w] = a.dims();
            match window {
                Some(win) if t > win => a.slice([0..1, 0..n, t - win..t, 0..w]),
                _ => a,
            }
        });
        lengths.push(all[0].dims()[2]);
        rows.push(all);
    }
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let pad = |a: Tensor<4>| {
        let [_, n, t, w] = a.dims();
        if t == longest {
            a
        } else {
            Tensor::cat(vec![a.clone(), Tensor::zeros([1, n, longest - t, w], (&a.device(), a.dtype()))], 2)
        }
    };
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for [a, b] in rows {
        first.push(pad(a));
        second.push(pad(b));
    }
    ([Tensor::cat(first, 0), Tensor::cat(second, 0)], lengths)
}
