//! Causal multi-head self-attention with a fused QKV projection (GPT-2's `c_attn`): MHA, GQA and MQA by the number
//! of key/value heads, optional RoPE on q and k, optional sliding window.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{FloatDType, Tensor};
use ember_kernels::{
    AttentionAlgorithm, AttentionSpec, GpuTuning, PackedHeads, Similarity, attention, merge_heads, packed_attention,
    split_heads,
};

use crate::cache::Context;
use crate::init::Init;
use crate::nn::norm::{Norm, NormConfig};
use crate::nn::position::{Positions, Rotary};
use crate::nn::projection;
use crate::nn::projection::Projection;
use ember_formats::Rng;
use ember_formats::config::ModelConfig;
use ember_formats::config::{AttentionKernel, DEFAULT_FAVOR_FEATURES, FeatureMap, NormKind, PositionKind};
use ember_formats::rope::RopeScaling;

#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// [W_Q | W_K | W_V]: d → (h + 2g)·d_h.
    pub c_attn: Projection,
    /// W_O: h·d_h → d.
    pub c_proj: Projection,
    /// RMSNorm of each query head and key head (γ over d_h), when the config has q/k norms.
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    resid_drop: Dropout,
    n_heads: usize,
    n_kv_heads: usize,
    #[module(skip)]
    window: Option<usize>,
    #[module(skip)]
    attention_dropout: f64,
    /// The multiplier of q kᵀ (None: 1/√d_h) and the soft-capping of the scores.
    #[module(skip)]
    scale: Option<f64>,
    #[module(skip)]
    softcap: Option<f64>,
    /// RoPE on q and k, when the model's positions are rotary.
    #[module(skip)]
    rope: Option<Rotary>,
    #[module(skip)]
    algorithm: AttentionAlgorithm,
    #[module(skip)]
    tuning: GpuTuning,
    /// κ(q, k): softmax's, or a feature map's.
    #[module(skip)]
    similarity: Similarity,
    /// What FAVOR+'s draws of random features derive from: the layer's path.
    #[module(skip)]
    scope_seed: u64,
    /// Full self-attention without RoPE reads q, k, v where the fused projection put them (on the CPU one kernel
    /// call, no head split); its gradients differ from the split heads' in the last bits.
    #[module(skip)]
    packed: bool,
}

/// The heads of an attention layer of width d: h query heads and g key/value heads of width d_h (MHA g = h, GQA,
/// MQA g = 1), and whether the q/k/v and the output projections have biases.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadsConfig {
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub qkv_bias: bool,
    pub bias: bool,
}

impl HeadsConfig {
    /// The heads of `model`'s attention layers.
    pub fn of(model: &ModelConfig) -> Self {
        Self {
            d_model: model.d_model,
            n_heads: model.n_heads,
            n_kv_heads: model.kv_heads(),
            head_dim: model.head_dim(),
            qkv_bias: model.qkv_bias(),
            bias: model.bias,
        }
    }
}

/// Causal self-attention over its heads, with per-head q/k RMSNorm (its ε) when set, sliding window, RoPE, the scale
/// and soft-capping of the scores, dropout, similarity κ and the init scale of its output projection.
#[derive(Clone, Debug, PartialEq)]
pub struct SelfAttentionConfig {
    pub heads: HeadsConfig,
    pub qk_norm_eps: Option<f64>,
    pub window: Option<usize>,
    pub rope: Option<Rotary>,
    pub scale: Option<f64>,
    pub softcap: Option<f64>,
    pub dropout: f64,
    pub attention_dropout: f64,
    pub kernel: AttentionKernel,
    pub feature_map: FeatureMap,
    pub favor_features: usize,
    /// σ of W_O's initial weights.
    pub residual_std: f64,
}

impl SelfAttentionConfig {
    /// The self-attention of `model` with its global window and RoPE (an encoder–decoder's layers).
    pub fn of(model: &ModelConfig) -> Self {
        Self::with(model, model.window, model.rope_theta, model.rope_scaling.as_ref())
    }

    /// Layer `layer` of a decoder: its window and RoPE base and scaling as the model's local/global pattern gives them.
    pub fn of_layer(model: &ModelConfig, layer: usize) -> Self {
        let rope = (model.layer_rope_theta(layer), model.layer_rope_scaling(layer));
        Self::with(model, model.layer_window(layer), rope.0, rope.1)
    }

    fn with(model: &ModelConfig, window: Option<usize>, rope_theta: f64, scaling: Option<&RopeScaling>) -> Self {
        let heads = HeadsConfig::of(model);
        Self {
            heads,
            qk_norm_eps: model.qk_norm.then_some(model.norm_eps),
            window,
            rope: (model.positions == PositionKind::Rope).then_some(Rotary {
                theta: rope_theta,
                dim: heads.head_dim,
                scaling: scaling.cloned(),
            }),
            scale: model.attention_scale,
            softcap: model.attention_softcap,
            dropout: model.dropout,
            attention_dropout: model.attention_dropout,
            kernel: model.attention_kernel,
            feature_map: model.feature_map,
            favor_features: model.favor_features.unwrap_or(DEFAULT_FAVOR_FEATURES),
            residual_std: model.residual_std(),
        }
    }

    /// κ: softmax's, or the feature map's (FAVOR+'s projections drawn from `seed`).
    fn similarity(&self, seed: u64) -> Similarity {
        match (self.kernel, self.feature_map) {
            (AttentionKernel::Softmax, _) => Similarity::Softmax,
            (AttentionKernel::Linear, FeatureMap::Elu) => Similarity::LinearElu,
            (AttentionKernel::Linear, FeatureMap::Relu) => Similarity::LinearRelu,
            (AttentionKernel::Favor, _) => Similarity::Favor { features: self.favor_features, seed },
        }
    }

    /// GPT-2 init: N(0, 0.02) weights, W_O N(0, `residual_std`), zero biases, norm gains 1.
    pub fn init(&self, init: &mut Init) -> CausalSelfAttention {
        let HeadsConfig { d_model: d, n_heads: h, n_kv_heads: g, head_dim: dh, qkv_bias, bias } = self.heads;
        let head_norm = |init: &mut Init, name: &str| {
            self.qk_norm_eps.map(|eps| {
                init.scope(name, |init| NormConfig { kind: NormKind::RmsNorm, d: dh, eps, bias: false }.init(init))
            })
        };
        CausalSelfAttention {
            c_attn: projection(init, "c_attn", d, (h + 2 * g) * dh, 0.02, qkv_bias),
            c_proj: projection(init, "c_proj", h * dh, d, self.residual_std, bias),
            q_norm: head_norm(init, "q_norm"),
            k_norm: head_norm(init, "k_norm"),
            resid_drop: DropoutConfig::new(self.dropout).init(),
            n_heads: h,
            n_kv_heads: g,
            window: self.window,
            attention_dropout: self.attention_dropout,
            scale: self.scale,
            softcap: self.softcap,
            rope: self.rope.clone(),
            algorithm: AttentionAlgorithm::Ember,
            tuning: GpuTuning::default(),
            similarity: self.similarity(init.scope_seed()),
            scope_seed: init.scope_seed(),
            packed: true,
        }
    }
}

impl CausalSelfAttention {
    /// The same layer, splitting q, k, v into heads before attending in every pass.
    pub fn with_split_heads(self) -> Self {
        Self { packed: false, ..self }
    }

    /// Computes attention with `algorithm`, tuned by `tuning` on a GPU, from now on.
    pub fn set_attention(&mut self, algorithm: AttentionAlgorithm, tuning: GpuTuning) {
        (self.algorithm, self.tuning) = (algorithm, tuning);
    }

    /// Weighs values by `similarity` from now on (the weights stay: a trained softmax layer run with FAVOR+).
    pub fn set_similarity(&mut self, similarity: Similarity) {
        self.similarity = similarity;
    }

    /// FAVOR+ with draw `draw` of this layer's random features (draw 0: the one it was built with); other
    /// similarities stay as they are.
    pub fn redraw_features(&mut self, draw: u64) {
        if let Similarity::Favor { features, .. } = self.similarity {
            let seed = if draw == 0 { self.scope_seed } else { Rng::new(self.scope_seed ^ draw).next_u64() };
            self.similarity = Similarity::Favor { features, seed };
        }
    }

    /// q [B, h, T, d_h] and k, v [B, g, T, d_h] of x [B, T, d]; q and k normalised per head when the layer has
    /// q/k norms, then rotated at `positions` when RoPE is on.
    pub fn qkv(&self, x: Tensor<3>, positions: &Positions) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let (q, k, v) = split_heads(self.c_attn.forward(x), self.heads());
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(q_norm), Some(k_norm)) => (q_norm.forward(q), k_norm.forward(k)),
            _ => (q, k),
        };
        match &self.rope {
            Some(rotary) => {
                let rope = positions.rope(rotary, FloatDType::from(q.dtype()));
                (rope.apply(q), rope.apply(k), v)
            }
            None => (q, k, v),
        }
    }

    /// y = softmax(q kᵀ / √d_k + mask) v as `spec` masks it, heads concatenated, then W_O.
    pub fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<3> {
        self.project(attention(q, k, v, spec))
    }

    /// Causal attention (in this layer's window, with its scale, soft-capping, dropout and algorithm) for heads of
    /// width `head_dim`, queries from `query_offset`.
    pub fn spec(&self, head_dim: usize, query_offset: usize) -> AttentionSpec {
        let causal = AttentionSpec::causal(head_dim);
        AttentionSpec {
            scale: self.scale.unwrap_or(causal.scale),
            softcap: self.softcap,
            query_offset,
            dropout: self.attention_dropout,
            similarity: self.similarity,
            ..causal.with_window(self.window).computed_by(self.algorithm, self.tuning)
        }
    }

    /// Heads [B, h, T, d_h] concatenated to [B, T, h·d_h], then W_O.
    pub fn project(&self, y: Tensor<4>) -> Tensor<3> {
        self.output(merge_heads(y))
    }

    /// W_O of the concatenated heads [B, T, h·d_h].
    fn output(&self, y: Tensor<3>) -> Tensor<3> {
        self.resid_drop.forward(self.c_proj.forward(y))
    }

    fn heads(&self) -> PackedHeads {
        PackedHeads { q: self.n_heads, kv: self.n_kv_heads }
    }

    /// y = softmax(q kᵀ / √d_k + mask) v W_O for x at `positions`, the keys and values being this pass's and whatever
    /// `context` holds for `layer` (this pass's appended to it).
    ///
    /// # Shapes
    /// x [B, T, d] → [B, T, d]; q [B, h, T, d_h], k and v [B, g, T, d_h] inside.
    pub fn forward(&self, x: Tensor<3>, positions: &Positions, layer: usize, context: &mut Context) -> Tensor<3> {
        if self.packed && self.rope.is_none() && self.q_norm.is_none() && matches!(context, Context::Full) {
            // Unrotated q, k, v are read where the fused projection put them.
            let dh = self.c_attn.d_out() / (self.n_heads + 2 * self.n_kv_heads);
            return self.output(packed_attention(self.c_attn.forward(x), self.heads(), &self.spec(dh, 0)));
        }
        let (q, k, v) = self.qkv(x, positions);
        let spec = self.spec(q.dims()[3], positions.query_offset());
        self.project(context.attend(layer, q, [k, v], &spec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{load_state_dict, state_dict};
    use burn::tensor::{Device, Distribution, TensorData};
    use std::collections::HashMap;

    fn layer(config: &ModelConfig, seed: u64) -> CausalSelfAttention {
        SelfAttentionConfig::of(config).init(&mut Init::draw(&mut Rng::new(seed), &Device::flex()))
    }

    /// Full causal self-attention over x [B, T, d].
    fn full(attn: &CausalSelfAttention, x: Tensor<3>) -> Tensor<3> {
        let positions = Positions::span(0, x.dims()[1], &x.device());
        attn.forward(x, &positions, 0, &mut Context::Full)
    }

    use ember_test_support::max_abs_diff_tensors as max_diff;

    /// Weights of `mha` (h heads of width dh) with K/V head r taken from head `source(r)`, for `n` K/V heads.
    fn kv_heads_from(
        mha: &CausalSelfAttention,
        h: usize,
        dh: usize,
        n: usize,
        source: impl Fn(usize) -> usize,
    ) -> HashMap<String, TensorData> {
        let mut sd: HashMap<String, TensorData> = state_dict(mha).into_iter().collect();
        let w = Tensor::<2>::from_data(sd["c_attn.weight"].clone(), &Device::flex());
        let d = w.dims()[0];
        let head = |part: usize, r: usize| w.clone().slice([0..d, (part * h + r) * dh..(part * h + r + 1) * dh]);
        let q = w.clone().slice([0..d, 0..h * dh]);
        let k = (0..n).map(|r| head(1, source(r)));
        let v = (0..n).map(|r| head(2, source(r)));
        let fused = Tensor::cat(std::iter::once(q).chain(k).chain(v).collect(), 1);
        sd.insert("c_attn.weight".into(), fused.into_data());
        sd
    }

    #[test]
    fn gqa_with_g_equal_h_is_mha_and_query_head_r_reads_kv_head_r_over_h_by_g() {
        let dev = Device::flex();
        let (h, dh) = (4, 8);
        let base = ModelConfig { bias: false, ..ModelConfig::gpt(10, 1, h, h * dh, 16) };
        let mha = layer(&base, 1);
        let x = Tensor::<3>::random([2, 6, h * dh], Distribution::Normal(0.0, 1.0), &dev);

        // g = h: the same weights give the same output.
        let g4 = layer(&ModelConfig { n_kv_heads: Some(h), ..base.clone() }, 1);
        assert!(max_diff(full(&g4, x.clone()), full(&mha, x.clone())) < 1e-6);

        // g = 2 (GQA) and g = 1 (MQA): K/V head j is MHA head j·(h/g); MHA with every K/V head r replaced by
        // head ⌊r / (h/g)⌋·(h/g) computes the same.
        for g in [2, 1] {
            let group = h / g;
            let cfg = ModelConfig { n_kv_heads: Some(g), ..base.clone() };
            let gqa = layer(&cfg, 2);
            let gqa = load_state_dict(gqa, &kv_heads_from(&mha, h, dh, g, |j| j * group)).unwrap();
            let shared = layer(&base, 3);
            let shared = load_state_dict(shared, &kv_heads_from(&mha, h, dh, h, |r| r / group * group)).unwrap();
            let (_, k, _) = gqa.qkv(x.clone(), &Positions::span(0, 6, &dev));
            assert_eq!(k.dims(), [2, g, 6, dh]);
            assert!(max_diff(full(&gqa, x.clone()), full(&shared, x.clone())) < 1e-5, "g = {g}");
        }
    }
}
