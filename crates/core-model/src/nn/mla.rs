//! Multi-head latent attention (DeepSeek-V2): keys and values come from a latent c = x W_DKV of width d_c through
//! per-head up-projections U_K, U_V; positions enter through a decoupled RoPE key k_R = RoPE(x W_KR) of width d_R
//! shared by every head. DeepSeek-V2 also RMSNorms the latent and may draw the queries from a normalised rank-r_q
//! bottleneck x W_DQ. Training uses the expanded form; inference attends against the cached latents directly
//! (the absorbed form), so expanded keys and values are never materialised.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::{FloatDType, Tensor};
use ember_kernels::{AttentionAlgorithm, AttentionSpec, GpuTuning, attention, linear};

use crate::cache::{Context, append_rows};
use crate::init::Init;
use crate::nn::norm::{Norm, NormConfig};
use crate::nn::position::{Positions, Rotary};
use crate::nn::projection::Projection;
use crate::nn::{linear_layer, projection};
use ember_formats::config::{ModelConfig, NormKind};

#[derive(Module, Debug)]
pub struct MlaAttention {
    /// W_DQ: d → r_q and its RMSNorm, the query bottleneck, when the config has one.
    pub w_dq: Option<Linear>,
    pub q_norm: Option<Norm>,
    /// W_Q: d (or r_q) → h·d_h, content queries.
    pub w_q: Linear,
    /// W_QR: d (or r_q) → h·d_R, rotary queries.
    pub w_qr: Linear,
    /// W_DKV: d → d_c, the latent.
    pub w_dkv: Linear,
    /// RMSNorm of the latent, when the config has one.
    pub c_norm: Option<Norm>,
    /// W_KR: d → d_R, the shared rotary key.
    pub w_kr: Linear,
    /// U_K: d_c → h·d_h, per-head content keys (no bias, so it can be absorbed into the query).
    pub u_k: Linear,
    /// U_V: d_c → h·d_h, per-head values.
    pub u_v: Linear,
    /// W_O: h·d_h → d.
    pub c_proj: Projection,
    resid_drop: Dropout,
    n_heads: usize,
    #[module(skip)]
    window: Option<usize>,
    #[module(skip)]
    attention_dropout: f64,
    /// The multiplier of the scores (None: 1/√(d_h + d_R)).
    #[module(skip)]
    scale: Option<f64>,
    /// RoPE of the decoupled query and key, width d_R.
    #[module(skip)]
    rope: Rotary,
    #[module(skip)]
    algorithm: AttentionAlgorithm,
    #[module(skip)]
    tuning: GpuTuning,
}

/// What a layer of MLA derives from its input: queries per head, and the per-token state a cache keeps.
pub struct MlaProjections {
    /// q_C [B, h, T, d_h].
    pub q_c: Tensor<4>,
    /// RoPE(x W_QR) [B, h, T, d_R].
    pub q_r: Tensor<4>,
    /// c [B, 1, T, d_c].
    pub c: Tensor<4>,
    /// RoPE(x W_KR) [B, 1, T, d_R].
    pub k_r: Tensor<4>,
}

/// Multi-head latent attention of width d: h heads of content width d_h, a latent of width d_c (RMSNorm'd with ε
/// `latent_norm_eps` when set), a decoupled RoPE key of width d_R, queries through a rank `q_rank` bottleneck when
/// set, the scale of its scores, its biases, window, dropout and the init scale of its output projection.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    pub d_model: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub latent_dim: usize,
    pub q_rank: Option<usize>,
    pub latent_norm_eps: Option<f64>,
    pub norm_eps: f64,
    pub scale: Option<f64>,
    pub rope: Rotary,
    pub qkv_bias: bool,
    pub bias: bool,
    pub window: Option<usize>,
    pub dropout: f64,
    pub attention_dropout: f64,
    /// σ of W_O's initial weights.
    pub residual_std: f64,
}

impl MlaConfig {
    /// The attention of every block of `model` (`attention = "mla"`).
    pub fn of(model: &ModelConfig) -> Self {
        let latent_dim = model.mla_latent_dim.expect("an MLA config sets mla_latent_dim (validate checks it)");
        let rope_dim = model.mla_rope_dim.expect("an MLA config sets mla_rope_dim (validate checks it)");
        Self {
            d_model: model.d_model,
            n_heads: model.n_heads,
            head_dim: model.head_dim(),
            latent_dim,
            q_rank: model.mla_q_rank,
            latent_norm_eps: model.mla_latent_norm.then_some(model.norm_eps),
            norm_eps: model.norm_eps,
            scale: model.attention_scale,
            rope: Rotary { theta: model.rope_theta, dim: rope_dim, scaling: model.rope_scaling.clone() },
            qkv_bias: model.qkv_bias(),
            bias: model.bias,
            window: model.window,
            dropout: model.dropout,
            attention_dropout: model.attention_dropout,
            residual_std: model.residual_std(),
        }
    }

    /// GPT-2 init: N(0, 0.02) weights, W_O N(0, `residual_std`), zero biases.
    pub fn init(&self, init: &mut Init) -> MlaAttention {
        let (d, h, dh, dc, dr) = (self.d_model, self.n_heads, self.head_dim, self.latent_dim, self.rope.dim);
        let bias = self.qkv_bias;
        let rms = |init: &mut Init, name: &str, d: usize, eps: f64| {
            init.scope(name, |init| NormConfig { kind: NormKind::RmsNorm, d, eps, bias: false }.init(init))
        };
        // With a bottleneck the bias is W_DQ's.
        let (dq, q_bias) = (self.q_rank.unwrap_or(d), bias && self.q_rank.is_none());
        MlaAttention {
            w_dq: self.q_rank.map(|r| linear_layer(init, "w_dq", d, r, 0.02, bias)),
            q_norm: self.q_rank.map(|r| rms(init, "q_norm", r, self.norm_eps)),
            w_q: linear_layer(init, "w_q", dq, h * dh, 0.02, q_bias),
            w_qr: linear_layer(init, "w_qr", dq, h * dr, 0.02, q_bias),
            w_dkv: linear_layer(init, "w_dkv", d, dc, 0.02, bias),
            c_norm: self.latent_norm_eps.map(|eps| rms(init, "c_norm", dc, eps)),
            w_kr: linear_layer(init, "w_kr", d, dr, 0.02, bias),
            u_k: linear_layer(init, "u_k", dc, h * dh, 0.02, false),
            u_v: linear_layer(init, "u_v", dc, h * dh, 0.02, false),
            c_proj: projection(init, "c_proj", h * dh, d, self.residual_std, self.bias),
            resid_drop: DropoutConfig::new(self.dropout).init(),
            n_heads: h,
            window: self.window,
            attention_dropout: self.attention_dropout,
            scale: self.scale,
            rope: self.rope.clone(),
            algorithm: AttentionAlgorithm::Ember,
            tuning: GpuTuning::default(),
        }
    }
}

impl MlaAttention {
    /// Computes attention with `algorithm`, tuned by `tuning` on a GPU, from now on.
    pub fn set_attention(&mut self, algorithm: AttentionAlgorithm, tuning: GpuTuning) {
        (self.algorithm, self.tuning) = (algorithm, tuning);
    }

    /// q_C = x_Q W_Q, q_R = RoPE(x_Q W_QR) with x_Q = x or RMSNorm(x W_DQ), c = x W_DKV (RMSNorm'd when the layer
    /// has a latent norm), k_R = RoPE(x W_KR) at `positions`, split into heads.
    pub fn project(&self, x: Tensor<3>, positions: &Positions) -> MlaProjections {
        let [b, t, _] = x.dims();
        let rope = positions.rope(&self.rope, FloatDType::from(x.dtype()));
        let heads = |z: Tensor<3>, n: usize| {
            let w = z.dims()[2] / n;
            z.reshape([b, t, n, w]).swap_dims(1, 2)
        };
        let x_q = match (&self.w_dq, &self.q_norm) {
            (Some(w_dq), Some(norm)) => norm.forward(linear(w_dq, x.clone())),
            _ => x.clone(),
        };
        let c = linear(&self.w_dkv, x.clone());
        let c = match &self.c_norm {
            Some(norm) => norm.forward(c),
            None => c,
        };
        MlaProjections {
            q_c: heads(linear(&self.w_q, x_q.clone()), self.n_heads),
            q_r: rope.apply(heads(linear(&self.w_qr, x_q), self.n_heads)),
            c: heads(c, 1),
            k_r: rope.apply(heads(linear(&self.w_kr, x), 1)),
        }
    }

    /// Causal attention of [q_C; q_R] against [k_C; k_R] scaled by the layer's scale or 1/√(d_h + d_R) (in this
    /// layer's window, with its dropout and algorithm), queries from `query_offset`.
    pub fn spec(&self, p: &MlaProjections, query_offset: usize) -> AttentionSpec {
        let (dh, dr) = (p.q_c.dims()[3], p.q_r.dims()[3]);
        let causal = AttentionSpec::causal(dh + dr);
        AttentionSpec {
            scale: self.scale.unwrap_or(causal.scale),
            query_offset,
            dropout: self.attention_dropout,
            ..causal.with_window(self.window).computed_by(self.algorithm, self.tuning)
        }
    }

    /// Expanded: k_C = c U_K, v = c U_V per head, scores (q_C·k_C + q_R·k_R) / sqrt(d_h + d_R).
    pub fn attend_expanded(&self, p: MlaProjections, query_offset: usize) -> Tensor<3> {
        let spec = self.spec(&p, query_offset);
        let [b, h, _, _] = p.q_c.dims();
        let [_, _, tk, dc] = p.c.dims();
        let latent = p.c.reshape([b, tk, dc]);
        let heads = |z: Tensor<3>| {
            let w = z.dims()[2] / h;
            z.reshape([b, tk, h, w]).swap_dims(1, 2)
        };
        let k_c = heads(linear(&self.u_k, latent.clone()));
        let v = heads(linear(&self.u_v, latent));
        let dr = p.k_r.dims()[3];
        let q = Tensor::cat(vec![p.q_c, p.q_r], 3);
        let k = Tensor::cat(vec![k_c, p.k_r.expand([b, h, tk, dr])], 3);
        self.output(attention(q, k, v, &spec))
    }

    /// Absorbed: q̂ = q_C U_Kᵀ per head scores against the latents, o = softmax(q̂ cᵀ + q_R k_Rᵀ) c is summed in latent
    /// space, then U_V per head; one shared "KV head" [c | k_R] serves every query head; `spec` masks the latents.
    pub fn attend_absorbed(&self, p: MlaProjections, spec: &AttentionSpec) -> Tensor<3> {
        let [b, h, t, dh] = p.q_c.dims();
        let dc = p.c.dims()[3];
        // U_K as [h, d_h, d_c] and U_V as [h, d_c, d_h].
        let u_k = self.u_k.weight.val().reshape([dc, h, dh]).permute([1, 2, 0]).unsqueeze::<4>().expand([b, h, dh, dc]);
        let u_v = self.u_v.weight.val().reshape([dc, h, dh]).swap_dims(0, 1).unsqueeze::<4>().expand([b, h, dc, dh]);
        let q = Tensor::cat(vec![p.q_c.matmul(u_k), p.q_r], 3);
        let k = Tensor::cat(vec![p.c.clone(), p.k_r], 3);
        let o_latent = attention(q, k, p.c, spec);
        let o = o_latent.matmul(u_v);
        debug_assert_eq!(o.dims(), [b, h, t, dh]);
        self.output(o)
    }

    /// Heads [B, h, T, d_h] concatenated, then W_O.
    fn output(&self, o: Tensor<4>) -> Tensor<3> {
        let [b, h, t, dh] = o.dims();
        self.resid_drop.forward(self.c_proj.forward(o.swap_dims(1, 2).reshape([b, t, h * dh])))
    }

    /// Attention for x at `positions`: expanded over this pass's tokens, absorbed against the latents
    /// `context` holds for `layer` (this pass's appended to it).
    pub fn forward(&self, x: Tensor<3>, positions: &Positions, layer: usize, context: &mut Context) -> Tensor<3> {
        let p = self.project(x, positions);
        match context {
            Context::Full => self.attend_expanded(p, 0),
            Context::Cached(cache) => {
                let spec = self.spec(&p, positions.query_offset());
                let [c, k_r] = cache.append(layer, [p.c, p.k_r]);
                self.attend_absorbed(MlaProjections { c, k_r, ..p }, &spec)
            }
            Context::Batched(caches) => {
                // Each row against its own latents, padded to the longest row and masked by length.
                let ([c, k_r], lengths) = append_rows(caches, layer, [p.c.clone(), p.k_r.clone()], self.window);
                let spec =
                    AttentionSpec { causal: false, window: None, key_lengths: Some(lengths), ..self.spec(&p, 0) };
                self.attend_absorbed(MlaProjections { c, k_r, ..p }, &spec)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{load_state_dict, state_dict};
    use burn::tensor::Device;
    use ember_formats::Rng;

    #[test]
    fn absorbed_inference_equals_the_expanded_computation() {
        let dev = Device::flex();
        let config = ModelConfig { bias: false, ..ModelConfig::gpt(10, 1, 4, 64, 32).mla_style(24, 8) };
        // Weights of std 0.1 rather than 0.02, so the outputs are O(1) and 1e-5 is a real bound.
        let mla = MlaConfig::of(&config).init(&mut Init::draw(&mut Rng::new(5), &dev));
        let scaled = state_dict(&mla).into_iter().map(|(k, v)| {
            let t = Tensor::<2>::from_data(v, &dev) * 5.0;
            (k, t.into_data())
        });
        let mla = load_state_dict(mla, &scaled.collect()).unwrap();
        let mut rng = Rng::new(6);
        let x = Init::draw(&mut rng, &dev).normal("x", [2, 11, 64], 1.0).val();
        let positions = Positions::span(0, 11, &dev);
        let expanded = mla.attend_expanded(mla.project(x.clone(), &positions), 0);
        let p = mla.project(x, &positions);
        let spec = mla.spec(&p, 0);
        let absorbed = mla.attend_absorbed(p, &spec);
        let diff: f32 = (expanded.clone() - absorbed).abs().max().into_scalar();
        let scale: f32 = expanded.abs().max().into_scalar();
        assert!(scale > 0.1, "outputs are O(1): {scale}");
        assert!(diff <= 1e-5, "max |expanded − absorbed| = {diff} (outputs up to {scale})");
    }
}
