//! What an attention call computes, o = softmax(q kᵀ · scale + mask) v (or another similarity κ), independent of any
//! implementation: the spec, the algorithm that computes it and how Ember's GPU kernels are tuned, the mask as a
//! boolean tensor, and the GQA repetition of key and value heads. Every other attention module depends on this one.

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

/// What one attention call computes.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionSpec {
    /// Multiplies q kᵀ; 1/√d_k in the Transformer.
    pub scale: f64,
    /// Soft-capping c of the scores, s = c·tanh(scale·q kᵀ / c) (Gemma 2); it runs the reference path.
    pub softcap: Option<f64>,
    /// Query i (at absolute position `query_offset + i`) sees keys j ≤ query_offset + i only.
    pub causal: bool,
    /// Absolute position of the first query row: keys before it come from a cache.
    pub query_offset: usize,
    /// Sliding causal window w: query at position i sees keys i − w < j ≤ i only.
    pub window: Option<usize>,
    /// Valid keys per batch row (padding masks); rows with none give zeros.
    pub key_lengths: Option<Vec<usize>>,
    /// Dropout on the probabilities p while training (on autodiff devices), as in Vaswani et al. (2017) and
    /// nanoGPT; it runs the reference path.
    pub dropout: f64,
    /// Which algorithm computes softmax attention (another similarity has one implementation).
    pub algorithm: AttentionAlgorithm,
    /// How Ember's WGSL kernels run on a GPU; ignored elsewhere.
    pub tuning: GpuTuning,
    /// κ(q, k): softmax's exp(scale·⟨q, k⟩), or a feature map's φ(q)·φ(k).
    pub similarity: Similarity,
}

impl AttentionSpec {
    /// Causal self-attention over heads of width `head_dim`, scale 1/√head_dim.
    pub fn causal(head_dim: usize) -> Self {
        Self {
            scale: 1.0 / (head_dim as f64).sqrt(),
            softcap: None,
            causal: true,
            query_offset: 0,
            window: None,
            key_lengths: None,
            dropout: 0.0,
            algorithm: AttentionAlgorithm::Ember,
            tuning: GpuTuning::default(),
            similarity: Similarity::Softmax,
        }
    }

    /// The same attention restricted to a sliding window of `window` keys (none: unrestricted).
    pub fn with_window(self, window: Option<usize>) -> Self {
        Self { window, ..self }
    }

    /// The same attention computed by `algorithm`, tuned by `tuning` on a GPU.
    pub fn computed_by(self, algorithm: AttentionAlgorithm, tuning: GpuTuning) -> Self {
        Self { algorithm, tuning, ..self }
    }

    /// The same attention computed by `algorithm` with the adapter's default tuning.
    pub fn with_algorithm(self, algorithm: AttentionAlgorithm) -> Self {
        self.computed_by(algorithm, GpuTuning::default())
    }
}

/// Which algorithm computes softmax attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionAlgorithm {
    /// Ember's FlashAttention kernels: WGSL on wgpu, Rust on the CPU (the default).
    #[default]
    Ember,
    /// The T×T score matrix, masked and soft-maxed with ordinary tensor ops: the reference.
    Naive,
    /// Burn's `attention` module op (fused kernels where the backend has them).
    Burn,
}

/// How Ember's WGSL attention kernels run on a GPU; `None` leaves a choice to the adapter. Ignored on the CPU and by
/// the other algorithms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuTuning {
    /// The WGSL tier (None: subgroup where CubeCL enables subgroup operations, else portable).
    pub tier: Option<KernelTier>,
    /// Whether the backward folds dq into the dk/dv pass with f32 atomic adds (true: the adapter must have wgpu
    /// `SHADER_FLOAT32_ATOMIC`) or runs it as a pass of its own (None: folded where the adapter has the atomics).
    pub fold_dq: Option<bool>,
    /// Whether the tiles in workgroup memory hold f16, twice the rows per tile, with every product and sum still in
    /// f32 (true: the adapter must have wgpu `SHADER_F16`; None: where q, k and v are f16 themselves).
    pub half: Option<bool>,
    /// The side N (16 or 8) of the f16 cooperative matrices with f32 accumulators the tiled forward multiplies on
    /// (tensor cores where wgpu exposes EXPERIMENTAL_COOPERATIVE_MATRIX with N×N×N products; head widths multiples
    /// of N); the backward then runs in the tier with f16 tiles, which round q, k and v as the forward did. Never
    /// chosen by default.
    pub cooperative: Option<u32>,
}

impl GpuTuning {
    /// Everything the adapter's choice (the default).
    pub const AUTO: Self = Self { tier: None, fold_dq: None, half: None, cooperative: None };

    /// Tier `tier`, everything else the adapter's choice.
    pub const fn tier(tier: KernelTier) -> Self {
        Self { tier: Some(tier), ..Self::AUTO }
    }

    /// Whether the tiles hold f16 for inputs that are (`f16_inputs`) or are not f16.
    pub fn half_tiles(&self, f16_inputs: bool) -> bool {
        self.cooperative.is_some() || self.half.unwrap_or(f16_inputs)
    }
}

/// The attention implementations by the names the command line and the benchmarks give them.
pub const NAMED_ATTENTION: [(&str, AttentionAlgorithm, GpuTuning); 11] = {
    use AttentionAlgorithm::{Burn, Ember, Naive};
    use KernelTier::{Portable, Subgroup};
    const AUTO: GpuTuning = GpuTuning::AUTO;
    const fn two_pass(tier: KernelTier) -> GpuTuning {
        GpuTuning { fold_dq: Some(false), ..GpuTuning::tier(tier) }
    }
    const fn half(tier: KernelTier) -> GpuTuning {
        GpuTuning { half: Some(true), ..GpuTuning::tier(tier) }
    }
    [
        ("ember", Ember, AUTO),
        ("portable", Ember, GpuTuning::tier(Portable)),
        ("subgroup", Ember, GpuTuning::tier(Subgroup)),
        ("portable-2pass", Ember, two_pass(Portable)),
        ("subgroup-2pass", Ember, two_pass(Subgroup)),
        ("portable-f16", Ember, half(Portable)),
        ("subgroup-f16", Ember, half(Subgroup)),
        ("cooperative", Ember, GpuTuning { cooperative: Some(16), ..AUTO }),
        ("cooperative-8", Ember, GpuTuning { cooperative: Some(8), ..AUTO }),
        ("burn", Burn, AUTO),
        ("naive", Naive, AUTO),
    ]
};

/// The algorithm and tuning [`NAMED_ATTENTION`] gives `name` ("auto" is "ember").
pub fn named_attention(name: &str) -> Result<(AttentionAlgorithm, GpuTuning), String> {
    let name = if name == "auto" { "ember" } else { name };
    NAMED_ATTENTION.iter().find(|(n, ..)| *n == name).map(|&(_, a, t)| (a, t)).ok_or_else(|| {
        let names: Vec<&str> = NAMED_ATTENTION.iter().map(|(n, ..)| *n).collect();
        format!("unknown attention {name:?}: expected {}", names.join(", "))
    })
}

/// How the WGSL kernels spread query (or key) rows over lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelTier {
    /// One lane per row, keys scored in chunks, tiles within WebGPU's portable 16 KiB of workgroup memory; no
    /// subgroup operations.
    Portable,
    /// G lanes share a pair of rows, each lane a slice of the head dimension, partial scores summed with subgroup
    /// shuffles (wgpu `SUBGROUP`).
    Subgroup,
}

/// The heads of a fused projection [B, T, (q + 2·kv)·d]: q query heads, then kv key heads, then kv value heads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PackedHeads {
    pub q: usize,
    pub kv: usize,
}

/// κ, the similarity attention weighs values by.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Similarity {
    /// exp(s·⟨q, k⟩): softmax attention.
    #[default]
    Softmax,
    /// φ(q)·φ(k) with φ(x) = elu(x) + 1.
    LinearElu,
    /// φ(q)·φ(k) with φ(x) = relu(x).
    LinearRelu,
    /// φ(q)·φ(k) with `features` random positive features, ω drawn from `seed`.
    Favor { features: usize, seed: u64 },
    /// exp(s·⟨q, k⟩) over `keys` keys per query row, drawn with replacement among the keys the row may see, with
    /// probability p_j ∝ ‖k_j‖ (`sketch` None) or ∝ the row's own softmax weights on an m-dimensional Gaussian sketch
    /// of q and k (`sketch` Some(m)), and reweighted by 1/(keys·p_j), so that numerator and denominator are unbiased
    /// (a row that sees at most `keys` keys attends to all of them exactly); the draws come from `seed`.
    SampledKeys { keys: usize, seed: u64, sketch: Option<usize> },
}

/// True where query i may not see key j, as [B, Tq, Tk] (causal: j > o + i; window: j ≤ o + i − w; padding:
/// j ≥ key_length, with o the query offset); None when nothing is masked.
pub fn mask(b: usize, tq: usize, tk: usize, spec: &AttentionSpec, device: &Device) -> Option<Tensor<3, Bool>> {
    let o = spec.query_offset as i64;
    let mut masked: Option<Tensor<2, Bool>> = None;
    let mut or = |m: Tensor<2, Bool>| masked = Some(masked.take().map_or(m.clone(), |a| a.bool_or(m)));
    if spec.causal {
        or(Tensor::<2, Bool>::tril_mask([tq, tk], o, device)); // j > o + i
    }
    if let Some(w) = spec.window {
        or(Tensor::<2, Bool>::triu_mask([tq, tk], o - w as i64 + 1, device)); // j ≤ o + i − w
    }
    let masked = masked.map(|m| m.unsqueeze::<3>().expand([b, tq, tk]));
    let Some(lengths) = &spec.key_lengths else { return masked };
    let lengths: Vec<i64> = lengths.iter().map(|&l| l as i64).collect();
    let lengths = Tensor::<1, Int>::from_data(TensorData::new(lengths, [b]), device).reshape([b, 1, 1]);
    let j = Tensor::<1, Int>::arange(0..tk as i64, device).reshape([1, 1, tk]);
    let padding = j.greater_equal(lengths).expand([b, tq, tk]);
    Some(masked.map_or(padding.clone(), |m| m.bool_or(padding)))
}

/// K or V of [B, Hkv, T, D] seen as [B, Hq, T, D] (GQA): each KV head serves Hq/Hkv consecutive query heads, query
/// head r reading KV head ⌊r / (Hq/Hkv)⌋.
pub fn repeat_kv(x: Tensor<4>, hq: usize) -> Tensor<4> {
    let [b, hkv, t, d] = x.dims();
    if hkv == hq {
        return x;
    }
    x.unsqueeze_dim::<5>(2).expand([b, hkv, hq / hkv, t, d]).reshape([b, hq, t, d])
}
