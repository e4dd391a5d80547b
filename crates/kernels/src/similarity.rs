//! Attention as a similarity kernel: y_i = Σ_j κ(q_i, k_j) v_j / Σ_j κ(q_i, k_j) over the keys j query i may see
//! (Y = Z⁻¹ A V, A_ij = κ(q_i, k_j), Z_ii = Σ_j A_ij). Softmax attention is κ(q, k) = exp(s·⟨q, k⟩); linear attention
//! is κ(q, k) = φ(q)·φ(k) with a positive feature map φ, which lets causal attention run in O(T) from prefix sums of
//! φ(k_j) v_jᵀ and φ(k_j) (Katharopoulos et al., 2020); FAVOR+ (Choromanski et al., 2021) draws φ from random
//! orthogonal projections so that E[φ(q)·φ(k)] = exp(⟨q, k⟩/√d): an unbiased estimate of softmax's kernel.

use burn::tensor::{Device, Tensor, TensorData};
use ember_formats::Rng;

use crate::scan::exclusive_scan;
use crate::spec::{AttentionSpec, Similarity, mask, repeat_kv};

/// Chunk length of the O(T) causal form: attention inside a chunk is a masked product, across chunks a prefix sum.
const CHUNK: usize = 64;

/// The least denominator: a query whose features are all zero (as relu can give) gets 0 rather than 0/0.
const TINY: f64 = 1e-30;

/// y = Z⁻¹ A v with A_ij = κ(q_i, k_j) as `spec` masks it (causal, window, query offset, key lengths), for q
/// [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D]. Causal self-attention over a whole sequence with a feature map runs in
/// O(T) by chunks; everything else (decoding against cached keys, padding) as the masked T×T product.
pub fn similarity_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let hq = q.dims()[1];
    let (k, v) = (repeat_kv(k, hq), repeat_kv(v, hq));
    let whole_causal = spec.causal && spec.query_offset == 0 && spec.window.is_none() && spec.key_lengths.is_none();
    match spec.similarity {
        Similarity::Softmax => masked(softmax_weights(q, k, spec), v),
        Similarity::SampledKeys { keys, seed, sketch } => {
            let importance = match sketch {
                None => {
                    let [b, h, tk, _] = k.dims();
                    let norms = (k.clone() * k.clone()).sum_dim(3).sqrt().reshape([b, h, 1, tk]);
                    norms.expand([b, h, q.dims()[2], tk])
                }
                Some(m) => {
                    let sketch = orthogonal_gaussian(m, q.dims()[3], seed ^ 0x5ce7c4, &q.device()).transpose()
                        / (m as f64).sqrt();
                    let project = |x: &Tensor<4>| x.clone().matmul(sketch.clone().unsqueeze::<4>());
                    softmax_weights(project(&q), project(&k), spec)
                }
            };
            let weights = sample_weights(importance, &mask_of(&q, &k, spec), keys, seed);
            masked(softmax_weights(q, k, spec) * weights, v)
        }
        kernel => {
            let (fq, fk) = (features(kernel, q, spec, true), features(kernel, k, spec, false));
            if whole_causal && fq.dims()[2] == fk.dims()[2] {
                chunked_causal(fq, fk, v, None)
            } else {
                masked(feature_weights(fq, fk, spec), v)
            }
        }
    }
}

/// A = exp(s·q kᵀ − m) with m each row's largest score (which cancels in Z⁻¹ A), zero where masked.
fn softmax_weights(q: Tensor<4>, k: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let s = q.clone().matmul(k.clone().swap_dims(2, 3)) * spec.scale;
    let masked = mask_of(&q, &k, spec);
    let s = match &masked {
        Some(m) => s.mask_fill(m.clone(), f32::NEG_INFINITY),
        None => s,
    };
    // A row with every key masked has m = −∞; its weights are zero rather than NaN.
    let m = s.clone().max_dim(3).clamp_min(f32::MIN);
    let a = (s - m).exp();
    match masked {
        Some(m) => a.mask_fill(m, 0.0),
        None => a,
    }
}

/// W [B, H, Tq, Tk]: for each query row, `keys` draws j with probability p_j ∝ `importance`_ij among the keys the
/// row may see (`masked` false), each adding 1/(keys·p_j) to W_ij, so that E[W_ij] = 1 there; rows that see at most
/// `keys` keys get W = 1 on all of them. Importance is floored at 1e-6 of the row's largest, so that every visible
/// key can be drawn, as unbiasedness needs.
fn sample_weights(
    importance: Tensor<4>,
    masked: &Option<Tensor<4, burn::tensor::Bool>>,
    keys: usize,
    seed: u64,
) -> Tensor<4> {
    let [b, h, tq, tk] = importance.dims();
    let device = importance.device();
    let importance = importance.into_data().convert::<f32>().try_to_vec::<f32>().expect("f32");
    let hidden: Vec<bool> = match masked {
        Some(m) => m.clone().into_data().try_to_vec::<bool>().expect("bool"),
        None => vec![false; b * h * tq * tk],
    };
    let mut rng = Rng::new(seed);
    let mut weights = vec![0f32; b * h * tq * tk];
    let mut cumulative: Vec<f64> = Vec::with_capacity(tk);
    let mut seen: Vec<usize> = Vec::with_capacity(tk);
    for (row, out) in weights.chunks_mut(tk).enumerate() {
        let (visible, score) = (&hidden[row * tk..(row + 1) * tk], &importance[row * tk..(row + 1) * tk]);
        seen.clear();
        seen.extend((0..tk).filter(|&j| !visible[j]));
        if seen.len() <= keys {
            seen.iter().for_each(|&j| out[j] = 1.0);
            continue;
        }
        let floor = seen.iter().map(|&j| score[j] as f64).fold(0.0, f64::max) * 1e-6;
        let weight = |j: usize| (score[j] as f64).max(floor).max(f64::MIN_POSITIVE);
        cumulative.clear();
        let mut total = 0.0;
        for &j in &seen {
            total += weight(j);
            cumulative.push(total);
        }
        for _ in 0..keys {
            let u = rng.uniform() * total;
            let at = cumulative.partition_point(|&c| c < u).min(seen.len() - 1);
            let j = seen[at];
            out[j] += (total / (keys as f64 * weight(j))) as f32;
        }
    }
    Tensor::from_data(TensorData::new(weights, [b, h, tq, tk]), &device)
}

/// A = φ(q) φ(k)ᵀ, zero where masked.
fn feature_weights(fq: Tensor<4>, fk: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let masked = mask_of(&fq, &fk, spec);
    let a = fq.matmul(fk.swap_dims(2, 3));
    match masked {
        Some(m) => a.mask_fill(m, 0.0),
        None => a,
    }
}

/// `spec`'s mask for q [B, H, Tq, ·] against k [B, H, Tk, ·], over every head.
fn mask_of(q: &Tensor<4>, k: &Tensor<4>, spec: &AttentionSpec) -> Option<Tensor<4, burn::tensor::Bool>> {
    let [b, h, tq, _] = q.dims();
    let tk = k.dims()[2];
    mask(b, tq, tk, spec, &q.device()).map(|m| m.unsqueeze_dim::<4>(1).expand([b, h, tq, tk]))
}

/// y = (A v) / (A 1).
fn masked(a: Tensor<4>, v: Tensor<4>) -> Tensor<4> {
    let z = a.clone().sum_dim(3);
    a.matmul(v) / z.clamp_min(TINY)
}

/// The recurrent state of causal linear attention over every key so far, per KV head: S = Σ_j φ(k_j) v_jᵀ
/// [B, Hkv, r, d_v] and z = Σ_j φ(k_j) [B, Hkv, 1, r]. FAVOR+'s key features are taken as exp(· − c) with c the
/// largest key exponent so far ([1, 1, 1, 1]); a larger one later rescales S and z by e^(c − c').
#[derive(Clone, Debug)]
pub struct LinearState {
    s: Tensor<4>,
    z: Tensor<4>,
    shift: Option<Tensor<4>>,
}

impl LinearState {
    /// Bytes held (f32): the same for every sequence length.
    pub fn bytes(&self) -> usize {
        let elements = |t: &Tensor<4>| t.dims().iter().product::<usize>();
        (elements(&self.s) + elements(&self.z) + self.shift.as_ref().map_or(0, elements)) * 4
    }
}

/// Causal linear attention of new tokens q [B, Hq, T, D], k, v [B, Hkv, T, D] that follow the keys `state`
/// summarises (None: the sequence starts here): y [B, Hq, T, d_v] and the state over every key, in O(T) and
/// O(1) per decoded token (y_i = φ(q_i)(S + Σ_{j≤i} φ(k_j) v_jᵀ) / φ(q_i)·(z + Σ_{j≤i} φ(k_j))).
pub fn recurrent_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    state: Option<LinearState>,
    spec: &AttentionSpec,
) -> (Tensor<4>, LinearState) {
    let hq = q.dims()[1];
    let fq = features(spec.similarity, q, spec, true);
    let (fk, shift, prior) = match spec.similarity {
        Similarity::Favor { features, seed } => {
            let exponent = favor_exponent(k, spec.scale.sqrt(), features, seed);
            let newest = exponent.clone().max().reshape([1, 1, 1, 1]);
            let (c, prior) = match state {
                Some(LinearState { s, z, shift: Some(before) }) => {
                    let c = before.clone().max_pair(newest);
                    let rescale = (before - c.clone()).exp();
                    (c, Some((s * rescale.clone(), z * rescale)))
                }
                _ => (newest, None),
            };
            (positive_features(exponent, c.clone(), features), Some(c), prior)
        }
        kernel => (features(kernel, k, spec, false), None, state.map(|s| (s.s, s.z))),
    };
    let repeated = prior.clone().map(|(s, z)| (repeat_kv(s, hq), repeat_kv(z, hq)));
    let y = chunked_causal(fq, repeat_kv(fk.clone(), hq), repeat_kv(v.clone(), hq), repeated);
    let (s, z) = (fk.clone().swap_dims(2, 3).matmul(v), fk.sum_dim(2));
    let (s, z) = match prior {
        Some((s0, z0)) => (s0 + s, z0 + z),
        None => (s, z),
    };
    (y, LinearState { s, z, shift })
}

/// Causal linear attention in O(T): within each chunk of C positions the masked product, and from the chunks before
/// it (and the keys `prior` = (S₀ [B, H, r, d_v], z₀ [B, H, 1, r]) summarises) the prefix sums S = Σ φ(k_j) v_jᵀ and
/// z = Σ φ(k_j): y_i = (φ(q_i) S + intra) / (φ(q_i)·z + intra's row sum).
fn chunked_causal(fq: Tensor<4>, fk: Tensor<4>, v: Tensor<4>, prior: Option<(Tensor<4>, Tensor<4>)>) -> Tensor<4> {
    let [b, h, t, r] = fq.dims();
    let dv = v.dims()[3];
    // A short input (a decoded token) is one chunk of its own length.
    let chunk = CHUNK.min(t);
    let n = t.div_ceil(chunk);
    let padded = n * chunk;
    // Padded keys have zero features, so they add nothing; padded queries are cut off at the end.
    let pad = |x: Tensor<4>| {
        let [b, h, t, w] = x.dims();
        if t == padded {
            x
        } else {
            Tensor::cat(vec![x.clone(), Tensor::zeros([b, h, padded - t, w], (&x.device(), x.dtype()))], 2)
        }
    };
    let chunks = |x: Tensor<4>, w: usize| pad(x).reshape([b * h, n, chunk, w]);
    let (fq, fk, v) = (chunks(fq, r), chunks(fk, r), chunks(v, dv));
    let device = fq.device();
    // Within a chunk, key j is masked for query i when j > i.
    let later = Tensor::<2, burn::tensor::Bool>::tril_mask([chunk, chunk], 0, &device).unsqueeze::<4>().expand([
        b * h,
        n,
        chunk,
        chunk,
    ]);
    let a = fq.clone().matmul(fk.clone().swap_dims(2, 3)).mask_fill(later, 0.0);
    let (intra, intra_z) = (a.clone().matmul(v.clone()), a.sum_dim(3));
    // Exclusive prefix sums over chunks: the states of the chunks before each one.
    let states = exclusive_scan(fk.clone().swap_dims(2, 3).matmul(v));
    let zs = exclusive_scan(fk.sum_dim(2));
    let (states, zs) = match prior {
        Some((s0, z0)) => (states + s0.reshape([b * h, 1, r, dv]), zs + z0.reshape([b * h, 1, 1, r])),
        None => (states, zs),
    };
    let y = (fq.clone().matmul(states) + intra) / (fq.matmul(zs.swap_dims(2, 3)) + intra_z).clamp_min(TINY);
    y.reshape([b, h, padded, dv]).narrow(2, 0, t)
}

/// φ(x) of queries (`queries`) or keys x [B, H, T, D].
fn features(kernel: Similarity, x: Tensor<4>, spec: &AttentionSpec, queries: bool) -> Tensor<4> {
    match kernel {
        // elu(x) + 1: x + 1 above zero, eˣ below.
        Similarity::LinearElu => x.clone().clamp_min(0.0) + x.clamp_max(0.0).exp(),
        Similarity::LinearRelu => x.clamp_min(0.0),
        Similarity::Favor { features, seed } => favor(x, spec.scale.sqrt(), features, seed, queries),
        Similarity::Softmax | Similarity::SampledKeys { .. } => unreachable!("softmax attention has no feature map"),
    }
}

/// FAVOR+ positive random features: φ(x) = exp(ωᵀx' − ‖x'‖²/2 − c)/√r with x' = x·√s, so that E[φ(q)·φ(k)] =
/// exp(s·⟨q, k⟩)·e^(−c_q − c_k). The stabiliser c keeps eˣ finite and cancels in Z⁻¹ A: for a query its own row's
/// largest exponent, for keys the largest over all of them (one constant for every key a query sees).
fn favor(x: Tensor<4>, root_scale: f64, features: usize, seed: u64, queries: bool) -> Tensor<4> {
    let exponent = favor_exponent(x, root_scale, features, seed);
    let stable = exponent.clone().detach();
    let c = if queries { stable.max_dim(3) } else { stable.max().unsqueeze::<4>() };
    positive_features(exponent, c, features)
}

/// φ = exp(exponent − c)/√r: FAVOR+'s features from their exponents and a stabiliser c.
fn positive_features(exponent: Tensor<4>, c: Tensor<4>, features: usize) -> Tensor<4> {
    (exponent - c).exp() / (features as f64).sqrt()
}

/// ωᵀx' − ‖x'‖²/2 for x' = x·√s, per feature [B, H, T, r].
fn favor_exponent(x: Tensor<4>, root_scale: f64, features: usize, seed: u64) -> Tensor<4> {
    let [b, h, _, d] = x.dims();
    let omega = orthogonal_gaussian(features, d, seed, &x.device());
    let x = x * root_scale;
    let half_norm = (x.clone() * x.clone()).sum_dim(3) / 2.0;
    x.matmul(omega.transpose().unsqueeze::<4>().expand([b, h, d, features])) - half_norm
}

/// ω [r, d]: blocks of d orthonormal rows (Gram–Schmidt on Gaussian rows), each row then scaled by the norm of a
/// d-dimensional Gaussian, so that every row is marginally N(0, I) while rows within a block are orthogonal.
pub fn orthogonal_gaussian(rows: usize, d: usize, seed: u64, device: &Device) -> Tensor<2> {
    let mut rng = Rng::new(seed);
    let mut out: Vec<f32> = Vec::with_capacity(rows * d);
    let mut block: Vec<Vec<f64>> = Vec::new();
    for _ in 0..rows {
        if block.len() == d {
            block.clear();
        }
        let mut row: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
        for earlier in &block {
            let dot: f64 = row.iter().zip(earlier).map(|(a, b)| a * b).sum();
            row.iter_mut().zip(earlier).for_each(|(a, b)| *a -= dot * b);
        }
        let norm = row.iter().map(|a| a * a).sum::<f64>().sqrt();
        row.iter_mut().for_each(|a| *a /= norm);
        block.push(row.clone());
        let length = (0..d).map(|_| rng.normal().powi(2)).sum::<f64>().sqrt();
        out.extend(row.iter().map(|a| (a * length) as f32));
    }
    Tensor::from_data(TensorData::new(out, [rows, d]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::attention;
    use crate::spec::AttentionAlgorithm;
    use ember_test_support::{max_abs_diff_tensors as max_diff, max_relative_diff_tensors as relative_diff};

    /// N(0, 1) values drawn from a fixed sequence, so that every run checks the same inputs.
    fn random(shape: [usize; 4], device: &Device) -> Tensor<4> {
        thread_local!(static RNG: std::cell::RefCell<Rng> = std::cell::RefCell::new(Rng::new(17)));
        let values: Vec<f32> =
            RNG.with(|rng| (0..shape.iter().product()).map(|_| rng.borrow_mut().normal() as f32).collect());
        Tensor::from_data(TensorData::new(values, shape), device)
    }

    #[test]
    fn the_generic_path_with_exp_equals_softmax_attention() {
        let device = Device::flex();
        let (q, k, v) =
            (random([2, 4, 13, 8], &device), random([2, 2, 13, 8], &device), random([2, 2, 13, 8], &device));
        let causal = AttentionSpec::causal(8).with_algorithm(AttentionAlgorithm::Naive);
        let specs = [
            causal.clone(),
            causal.clone().with_window(Some(4)),
            AttentionSpec { causal: false, key_lengths: Some(vec![13, 5]), ..causal.clone() },
        ];
        for spec in specs {
            let softmax = attention(q.clone(), k.clone(), v.clone(), &spec);
            let generic = similarity_attention(q.clone(), k.clone(), v.clone(), &spec);
            let d = max_diff(softmax, generic);
            assert!(d <= 1e-5, "{spec:?}: {d}");
        }
    }

    /// The chunked O(T) form against the masked T×T product, output and gradients, across chunk boundaries, within
    /// 1e-5 of the largest value.
    #[test]
    fn linear_attention_in_o_t_equals_its_masked_form_with_gradients() {
        let device = Device::flex().autodiff();
        let spec = AttentionSpec::causal(16);
        for kernel in [Similarity::LinearElu, Similarity::LinearRelu, Similarity::Favor { features: 32, seed: 5 }] {
            let spec = AttentionSpec { similarity: kernel, ..spec.clone() };
            let inputs =
                [random([1, 2, 150, 16], &device), random([1, 1, 150, 16], &device), random([1, 1, 150, 16], &device)];
            let w = random([1, 2, 150, 16], &device);
            let run = |chunked: bool| {
                let [q, k, v] = inputs.clone().map(|x| x.require_grad());
                let (k2, v2) = (repeat_kv(k.clone(), 2), repeat_kv(v.clone(), 2));
                let (fq, fk) = (features(kernel, q.clone(), &spec, true), features(kernel, k2, &spec, false));
                let o =
                    if chunked { chunked_causal(fq, fk, v2, None) } else { masked(feature_weights(fq, fk, &spec), v2) };
                let grads = (o.clone() * w.clone()).sum().backward();
                let grad = |t: &Tensor<4>| t.grad(&grads).expect("a gradient");
                [o.inner(), grad(&q), grad(&k), grad(&v)]
            };
            for (name, (a, b)) in ["o", "dq", "dk", "dv"].iter().zip(run(true).into_iter().zip(run(false))) {
                let d = relative_diff(a, b);
                assert!(d <= 1e-5, "{kernel:?} {name}: relative error {d}");
            }
        }
    }

    /// Decoding: the last rows against every key (a query offset, as from a KV store) equal those rows of the whole.
    #[test]
    fn query_offset_rows_equal_the_last_rows_of_the_whole() {
        let device = Device::flex();
        let spec = AttentionSpec { similarity: Similarity::LinearElu, ..AttentionSpec::causal(8) };
        let (q, k, v) =
            (random([1, 2, 70, 8], &device), random([1, 2, 70, 8], &device), random([1, 2, 70, 8], &device));
        let whole = similarity_attention(q.clone(), k.clone(), v.clone(), &spec);
        let last = similarity_attention(q.narrow(2, 67, 3), k, v, &AttentionSpec { query_offset: 67, ..spec });
        assert!(max_diff(last, whole.narrow(2, 67, 3)) <= 1e-5);
    }

    /// Prefill then token-by-token decoding from the recurrent state equals attention over the whole sequence, for
    /// every feature map, with GQA (FAVOR+'s key stabiliser rises as larger keys arrive and rescales the state).
    #[test]
    fn recurrent_decoding_equals_the_whole_sequence() {
        let device = Device::flex();
        for kernel in [Similarity::LinearElu, Similarity::LinearRelu, Similarity::Favor { features: 16, seed: 2 }] {
            let spec = AttentionSpec { similarity: kernel, ..AttentionSpec::causal(8) };
            let (q, k, v) =
                (random([2, 4, 75, 8], &device), random([2, 2, 75, 8], &device), random([2, 2, 75, 8], &device));
            // Later keys larger than any in the prompt, so that FAVOR+'s stabiliser moves.
            let k = Tensor::cat(vec![k.clone().narrow(2, 0, 70), k.narrow(2, 70, 5) * 2.0], 2);
            let whole = similarity_attention(q.clone(), k.clone(), v.clone(), &spec);
            let part = |x: &Tensor<4>, from: usize, n: usize| x.clone().narrow(2, from, n);
            let (prefill, mut state) =
                recurrent_attention(part(&q, 0, 70), part(&k, 0, 70), part(&v, 0, 70), None, &spec);
            let mut rows = vec![prefill];
            for t in 70..75 {
                let (y, next) = recurrent_attention(part(&q, t, 1), part(&k, t, 1), part(&v, t, 1), Some(state), &spec);
                rows.push(y);
                state = next;
            }
            let d = relative_diff(Tensor::cat(rows, 2), whole);
            assert!(d <= 1e-5, "{kernel:?}: {d}");
            let r = if let Similarity::Favor { features, .. } = kernel { features } else { 8 };
            let shift = usize::from(matches!(kernel, Similarity::Favor { .. }));
            assert_eq!(
                state.bytes(),
                (2 * 2 * (r * 8 + r) + shift) * 4,
                "a fixed r×d_v state and r-vector per KV head"
            );
        }
    }

    /// FAVOR+ is unbiased: over many draws of ω the mean of φ(q)·φ(k) is exp(s·⟨q, k⟩) within 3 standard errors.
    #[test]
    fn favor_features_estimate_the_softmax_kernel_without_bias() {
        let device = Device::flex();
        let (q, k) = (random([1, 1, 1, 8], &device) * 0.5, random([1, 1, 1, 8], &device) * 0.5);
        let scale = 1.0 / 8f64.sqrt();
        let exact = ((q.clone() * k.clone()).sum().into_scalar::<f32>() as f64 * scale).exp();
        let (draws, r) = (2000, 4);
        let estimates: Vec<f64> = (0..draws)
            .map(|seed| {
                let eq = favor_exponent(q.clone(), scale.sqrt(), r, seed);
                let ek = favor_exponent(k.clone(), scale.sqrt(), r, seed);
                (eq + ek).exp().sum().into_scalar::<f32>() as f64 / r as f64
            })
            .collect();
        let mean = estimates.iter().sum::<f64>() / draws as f64;
        let sd = (estimates.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (draws - 1) as f64).sqrt();
        let se = sd / (draws as f64).sqrt();
        assert!((mean - exact).abs() <= 3.0 * se, "mean {mean} vs exp {exact} (standard error {se})");
    }

    /// Sampled keys are unbiased: over many draws the mean of the reweighted numerator and denominator of a row are
    /// softmax's within 4 standard errors, and a row that sees few keys is exact.
    #[test]
    fn sampled_keys_estimate_the_exact_sums_without_bias() {
        let device = Device::flex();
        let (q, k, v) =
            (random([1, 1, 24, 4], &device), random([1, 1, 24, 4], &device), random([1, 1, 24, 4], &device));
        let spec = AttentionSpec::causal(4);
        let exact = softmax_weights(q.clone(), k.clone(), &spec);
        let row = |a: Tensor<4>| {
            let a = a.narrow(2, 23, 1);
            let numerator = a.clone().matmul(v.clone().narrow(3, 0, 1)).into_scalar::<f32>() as f64;
            (numerator, a.sum().into_scalar::<f32>() as f64)
        };
        let (exact_num, exact_den) = row(exact.clone());
        // Importance by key norms, and by scores like the row's own (the square root of its weights).
        let norms = (k.clone() * k.clone()).sum_dim(3).sqrt().reshape([1, 1, 1, 24]).expand([1, 1, 24, 24]);
        for importance in [norms, exact.clone().sqrt()] {
            let mask = mask_of(&q, &k, &spec);
            let draws: Vec<(f64, f64)> =
                (0..1000).map(|seed| row(exact.clone() * sample_weights(importance.clone(), &mask, 4, seed))).collect();
            for (name, pick, truth) in [("numerator", 0, exact_num), ("denominator", 1, exact_den)] {
                let xs: Vec<f64> = draws.iter().map(|d| if pick == 0 { d.0 } else { d.1 }).collect();
                let mean = xs.iter().sum::<f64>() / xs.len() as f64;
                let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt();
                let se = sd / (xs.len() as f64).sqrt();
                assert!((mean - truth).abs() <= 4.0 * se, "{name}: mean {mean} vs {truth} (standard error {se})");
            }
        }
        let softmax =
            attention(q.clone(), k.clone(), v.clone(), &spec.clone().with_algorithm(AttentionAlgorithm::Naive));
        for sketch in [None, Some(2)] {
            let spec =
                AttentionSpec { similarity: Similarity::SampledKeys { keys: 8, seed: 1, sketch }, ..spec.clone() };
            let sampled = similarity_attention(q.clone(), k.clone(), v.clone(), &spec);
            let d = max_diff(sampled.narrow(2, 0, 8), softmax.clone().narrow(2, 0, 8));
            assert!(d <= 1e-5, "{sketch:?}: rows that see ≤ 8 keys are exact");
        }
    }

    #[test]
    fn orthogonal_projections_have_orthogonal_rows_within_a_block() {
        let omega = orthogonal_gaussian(8, 4, 3, &Device::flex()).into_data().try_to_vec::<f32>().unwrap();
        let row = |i: usize| &omega[i * 4..(i + 1) * 4];
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        assert!(
            dot(row(0), row(1)).abs() < 1e-4 && dot(row(2), row(3)).abs() < 1e-4 && dot(row(4), row(7)).abs() < 1e-4
        );
        assert!(dot(row(0), row(4)).abs() > 1e-4, "a new block draws afresh");
    }
}
