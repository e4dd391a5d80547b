//! Scaled dot-product attention, o = softmax(q kᵀ · scale + mask) v, for q [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D]
//! with Hq a multiple of Hkv (GQA: query head r reads KV head ⌊r / (Hq/Hkv)⌋).

use std::sync::atomic::{AtomicU8, Ordering};

use burn::tensor::activation::softmax;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Tensor};

/// What one attention call computes.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionSpec {
    /// Multiplies q kᵀ; 1/√d_k in the Transformer.
    pub scale: f64,
    /// Query i (at absolute position `query_offset + i`) sees keys j ≤ query_offset + i only.
    pub causal: bool,
    /// Absolute position of the first query row: keys before it come from a cache.
    pub query_offset: usize,
}

impl AttentionSpec {
    /// Causal self-attention over heads of width `head_dim`, scale 1/√head_dim.
    pub fn causal(head_dim: usize) -> Self {
        Self { scale: 1.0 / (head_dim as f64).sqrt(), causal: true, query_offset: 0 }
    }
}

/// Which implementation [`attention`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AttentionImpl {
    /// The T×T score matrix, masked and soft-maxed with ordinary tensor ops.
    Naive = 0,
    /// Burn's `attention` module op (fused kernels where the backend has them).
    Burn = 1,
}

static IMPL: AtomicU8 = AtomicU8::new(AttentionImpl::Naive as u8);

/// Selects the implementation for every later call (tests and benchmarks compare them).
pub fn set_attention_impl(imp: AttentionImpl) {
    IMPL.store(imp as u8, Ordering::Relaxed);
}

fn current() -> AttentionImpl {
    match IMPL.load(Ordering::Relaxed) {
        1 => AttentionImpl::Burn,
        _ => AttentionImpl::Naive,
    }
}

/// o = softmax(q kᵀ · scale + mask) v, with the implementation chosen by [`set_attention_impl`].
pub fn attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    attention_with(current(), q, k, v, spec)
}

/// o = softmax(q kᵀ · scale + mask) v with a given implementation.
pub fn attention_with(imp: AttentionImpl, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let [_, hq, _, _] = q.dims();
    let (k, v) = (repeat_kv(k, hq), repeat_kv(v, hq));
    match imp {
        AttentionImpl::Burn if spec.query_offset == 0 => burn::tensor::module::attention(
            q,
            k,
            v,
            None,
            None,
            AttentionModuleOptions { scale: Some(spec.scale), softcap: None, is_causal: spec.causal },
        ),
        _ => naive(q, k, v, spec),
    }
}

/// The reference: s = q kᵀ · scale, masked where key j > query_offset + i, p = softmax(s), o = p v.
fn naive(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let [b, h, tq, _] = q.dims();
    let tk = k.dims()[2];
    let mut s = q.matmul(k.swap_dims(2, 3)) * spec.scale;
    if spec.causal {
        let mask = Tensor::<2, Bool>::tril_mask([tq, tk], spec.query_offset as i64, &s.device());
        s = s.mask_fill(mask.unsqueeze::<4>().expand([b, h, tq, tk]), f32::NEG_INFINITY);
    }
    softmax(s, 3).matmul(v)
}

/// K or V of [B, Hkv, T, D] seen as [B, Hq, T, D]: each KV head serves Hq/Hkv consecutive query heads.
fn repeat_kv(x: Tensor<4>, hq: usize) -> Tensor<4> {
    let [b, hkv, t, d] = x.dims();
    if hkv == hq {
        return x;
    }
    x.unsqueeze_dim::<5>(2).expand([b, hkv, hq / hkv, t, d]).reshape([b, hq, t, d])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};

    fn max_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
        let a = a.into_data().try_to_vec::<f32>().unwrap();
        let b = b.into_data().try_to_vec::<f32>().unwrap();
        a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn causal_row_zero_attends_only_to_key_zero() {
        let dev = Device::flex();
        let q = Tensor::<4>::random([1, 2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
        let k = Tensor::<4>::random([1, 2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
        let v = Tensor::<4>::random([1, 2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
        let o = naive(q, k, v.clone(), &AttentionSpec::causal(8));
        let first: Tensor<4> = o.slice([0..1, 0..2, 0..1, 0..8]);
        assert!(max_diff(first, v.slice([0..1, 0..2, 0..1, 0..8])) < 1e-6);
    }

    #[test]
    fn query_offset_matches_the_last_rows_of_full_attention() {
        let dev = Device::flex();
        let q = Tensor::<4>::random([2, 2, 6, 4], Distribution::Normal(0.0, 1.0), &dev);
        let k = Tensor::<4>::random([2, 2, 6, 4], Distribution::Normal(0.0, 1.0), &dev);
        let v = Tensor::<4>::random([2, 2, 6, 4], Distribution::Normal(0.0, 1.0), &dev);
        let full = naive(q.clone(), k.clone(), v.clone(), &AttentionSpec::causal(4));
        let spec = AttentionSpec { query_offset: 4, ..AttentionSpec::causal(4) };
        let tail = naive(q.slice([0..2, 0..2, 4..6, 0..4]), k, v, &spec);
        assert!(max_diff(tail, full.slice([0..2, 0..2, 4..6, 0..4])) < 1e-6);
    }

    #[test]
    fn burn_fused_equals_naive_and_gqa_repeats_kv_heads() {
        let dev = Device::flex();
        let q = Tensor::<4>::random([2, 4, 7, 8], Distribution::Normal(0.0, 1.0), &dev);
        let k = Tensor::<4>::random([2, 2, 7, 8], Distribution::Normal(0.0, 1.0), &dev);
        let v = Tensor::<4>::random([2, 2, 7, 8], Distribution::Normal(0.0, 1.0), &dev);
        let spec = AttentionSpec::causal(8);
        let reference = naive(q.clone(), repeat_kv(k.clone(), 4), repeat_kv(v.clone(), 4), &spec);
        let fused = attention_with(AttentionImpl::Burn, q.clone(), k.clone(), v.clone(), &spec);
        assert!(max_diff(fused, reference.clone()) < 1e-5);
        // Query head 3 reads KV head 1.
        let one = naive(
            q.slice([0..2, 3..4, 0..7, 0..8]),
            k.slice([0..2, 1..2, 0..7, 0..8]),
            v.slice([0..2, 1..2, 0..7, 0..8]),
            &spec,
        );
        assert!(max_diff(one, reference.slice([0..2, 3..4, 0..7, 0..8])) < 1e-6);
    }
}
