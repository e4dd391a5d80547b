//! `[model]` of a run's TOML config.

use std::fmt::Display;

use serde::{Deserialize, Serialize};

pub use crate::invalid::{Invalid, require};
use crate::rope::RopeScaling;

/// LayerNorm γ ⊙ (x − μ)/σ + β, or RMSNorm γ ⊙ x / sqrt(mean(x²) + ε).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    #[default]
    LayerNorm,
    RmsNorm,
}

/// Where the norms sit around a sub-layer F.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormPlacement {
    /// LN(x + F(x)), the 2017 Transformer; no final norm.
    Post,
    /// x + F(LN(x)), GPT-2; a final norm before the output projection.
    #[default]
    Pre,
    /// x + LN_out(F(LN_in(x))) with normalised input embeddings and a final norm (Peri-LN).
    Peri,
    /// x + LN_out(F(LN_in(x))) and a final norm, the embeddings as they are (Gemma 2 and 3).
    Sandwich,
}

impl NormPlacement {
    /// Whether each sub-layer's output is normalised too (Peri-LN, sandwich).
    pub fn has_output_norms(self) -> bool {
        matches!(self, NormPlacement::Peri | NormPlacement::Sandwich)
    }
}

/// The position-wise feed-forward network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FfnKind {
    Relu,
    /// Exact GELU, x Φ(x).
    #[default]
    Gelu,
    /// GPT-2's tanh approximation of GELU ("gelu_new").
    GeluTanh,
    /// SiLU x σ(x), ungated (Marian's "swish").
    Silu,
    /// [SiLU(x W_g) ⊙ (x W_u)] W_d.
    Swiglu,
    /// GeGLU: [GELU-tanh(x W_g) ⊙ (x W_u)] W_d (Gemma).
    Geglu,
}

/// How token positions enter the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PositionKind {
    /// A trained table of `block_size` rows added to the embeddings.
    #[default]
    Learned,
    /// The 2017 sine/cosine table added to embeddings scaled by sqrt(d).
    Sinusoidal,
    /// Rotary embeddings of q and k.
    Rope,
    None,
}

/// Standard multi-head attention (MHA / GQA / MQA by `n_kv_heads`) or DeepSeek-V2's multi-head latent attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKind {
    #[default]
    Mha,
    Mla,
}

/// The similarity κ(q, k) attention weighs values by: y_i = Σ_j κ(q_i, k_j) v_j / Σ_j κ(q_i, k_j).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKernel {
    /// exp(⟨q, k⟩/√d): softmax attention.
    #[default]
    Softmax,
    /// φ(q)·φ(k) with the positive feature map `feature_map`: causal attention in O(T).
    Linear,
    /// FAVOR+: `favor_features` random positive features whose kernel estimates softmax's without bias.
    Favor,
}

/// φ of linear attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureMap {
    /// elu(x) + 1.
    #[default]
    Elu,
    /// max(x, 0).
    Relu,
}

/// The float type a model computes in: its weights, activations and KV store (f16 on wgpu adapters with
/// `SHADER_F16`; training keeps f32 master weights and optimizer state). Checkpoints are f32 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    F16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }
}

/// A unit variant of `T` by the name its config key takes (serde's), for command-line flags; an unknown name is
/// "unknown variant `x`, expected one of …".
pub fn from_name<T: serde::de::DeserializeOwned>(name: &str) -> Result<T, String> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(name)).map_err(|e| e.to_string())
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        from_name(s)
    }
}

impl Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A decoder-only language model: GPT-2 and Llama styles are configs of one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Token vocabulary; taken from the tokenizer when absent.
    pub vocab_size: Option<usize>,
    pub n_layers: usize,
    pub n_heads: usize,
    pub d_model: usize,
    /// Width of each attention head; d_model / n_heads when absent (Gemma 3 and DeepSeek-V2 set their own).
    pub head_dim: Option<usize>,
    /// Context length (rows of the learned position table).
    pub block_size: usize,
    /// Dropout on residual branches and embeddings.
    #[serde(default)]
    pub dropout: f64,
    /// Dropout on attention probabilities (fairseq's `--attention-dropout`; 0 by default).
    #[serde(default)]
    pub attention_dropout: f64,
    /// Biases in the linear layers and LayerNorms.
    #[serde(default = "yes")]
    pub bias: bool,
    #[serde(default)]
    pub norm: NormKind,
    #[serde(default)]
    pub norm_placement: NormPlacement,
    #[serde(default = "default_eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub ffn: FfnKind,
    /// Hidden width of the feed-forward network; 4d, or 8/3·d rounded up to a multiple of 64 for SwiGLU.
    pub d_ff: Option<usize>,
    #[serde(default)]
    pub positions: PositionKind,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// RoPE's frequencies stretched to a longer context than the model was trained on.
    pub rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    pub attention: AttentionKind,
    /// Key/value heads g (GQA; g = n_heads is MHA, 1 is MQA); n_heads when absent.
    pub n_kv_heads: Option<usize>,
    /// Bias on the QKV projection; `bias` when absent.
    pub qkv_bias: Option<bool>,
    /// Sliding causal window w: query i sees keys i − w < j ≤ i.
    pub window: Option<usize>,
    /// With `window`: every n-th layer (layers n − 1, 2n − 1, …) attends to the whole context, the others in the
    /// window (Gemma 3: 6). Without it every layer has the window.
    pub global_every: Option<usize>,
    /// RoPE base of the windowed layers when `global_every` is set (`rope_theta` is the global layers'); those layers
    /// are not stretched by `rope_scaling`.
    pub rope_local_theta: Option<f64>,
    /// RMSNorm of each head's query and key (γ over d_h, shared by the heads) before RoPE (Gemma 3, OLMo 2).
    #[serde(default, skip_serializing_if = "is_default")]
    pub qk_norm: bool,
    /// Token embeddings scaled by √d before the first block (Gemma).
    #[serde(default, skip_serializing_if = "is_default")]
    pub embedding_scale: bool,
    /// Multiplies q kᵀ; 1/√d_h (MLA: 1/√(d_h + d_R)) when absent (Gemma 2 27B's query_pre_attn_scalar^(−1/2) =
    /// 1/√(d/h); DeepSeek-V2's YaRN mscale² / √(d_h + d_R)).
    pub attention_scale: Option<f64>,
    /// Soft-capping c of the attention scores, s ↦ c·tanh(s / c) (Gemma 2: 50).
    pub attention_softcap: Option<f64>,
    /// Soft-capping c of the output logits, z ↦ c·tanh(z / c) (Gemma 2: 30).
    pub logit_softcap: Option<f64>,
    /// MLA latent width d_c (cached per token per layer).
    pub mla_latent_dim: Option<usize>,
    /// MLA decoupled RoPE key width d_R, shared across heads.
    pub mla_rope_dim: Option<usize>,
    /// MLA queries through a rank-r_q bottleneck, RMSNorm'd (DeepSeek-V2's q_lora_rank); from x directly when absent.
    pub mla_q_rank: Option<usize>,
    /// MLA: RMSNorm of the latent c before it is cached and up-projected (DeepSeek-V2's kv_a_layernorm).
    #[serde(default, skip_serializing_if = "is_default")]
    pub mla_latent_norm: bool,
    /// Output projection tied to the token embedding.
    #[serde(default = "yes")]
    pub tie_embeddings: bool,
    #[serde(default, skip_serializing_if = "is_default")]
    pub attention_kernel: AttentionKernel,
    /// φ when `attention_kernel = "linear"`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub feature_map: FeatureMap,
    /// Random features r when `attention_kernel = "favor"`, drawn once per layer from the layer's index
    /// ([`DEFAULT_FAVOR_FEATURES`] by default).
    pub favor_features: Option<usize>,
    /// Optimizer steps between fresh draws of FAVOR+'s features while training (none: one draw for the whole run);
    /// inference keeps the draw the saved weights were last trained with.
    pub favor_redraw: Option<u64>,
    /// The float type of training's forward and backward passes (f16: mixed precision with dynamic loss scaling).
    #[serde(default, skip_serializing_if = "is_default")]
    pub dtype: Precision,
}

/// FAVOR+'s random features when a config names none.
pub const DEFAULT_FAVOR_FEATURES: usize = 256;

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

fn yes() -> bool {
    true
}

fn default_eps() -> f64 {
    1e-5
}

fn default_theta() -> f64 {
    10_000.0
}

impl ModelConfig {
    /// A GPT-2 style model (LayerNorm, Pre-LN, GELU, learned positions, MHA, tied output) of the given shape.
    pub fn gpt(vocab_size: usize, n_layers: usize, n_heads: usize, d_model: usize, block_size: usize) -> Self {
        Self {
            vocab_size: Some(vocab_size),
            n_layers,
            n_heads,
            d_model,
            head_dim: None,
            block_size,
            dropout: 0.0,
            attention_dropout: 0.0,
            bias: true,
            norm: NormKind::default(),
            norm_placement: NormPlacement::default(),
            norm_eps: default_eps(),
            ffn: FfnKind::default(),
            d_ff: None,
            positions: PositionKind::default(),
            rope_theta: default_theta(),
            rope_scaling: None,
            attention: AttentionKind::default(),
            n_kv_heads: None,
            qkv_bias: None,
            window: None,
            global_every: None,
            rope_local_theta: None,
            qk_norm: false,
            embedding_scale: false,
            attention_scale: None,
            attention_softcap: None,
            logit_softcap: None,
            mla_latent_dim: None,
            mla_rope_dim: None,
            mla_q_rank: None,
            mla_latent_norm: false,
            tie_embeddings: true,
            attention_kernel: AttentionKernel::Softmax,
            feature_map: FeatureMap::Elu,
            favor_features: None,
            favor_redraw: None,
            dtype: Precision::F32,
        }
    }

    /// The same model Llama-style: RMSNorm, SwiGLU, RoPE, no biases, and `n_kv_heads` key/value heads.
    pub fn llama_style(self, n_kv_heads: usize) -> Self {
        Self {
            norm: NormKind::RmsNorm,
            ffn: FfnKind::Swiglu,
            positions: PositionKind::Rope,
            n_kv_heads: Some(n_kv_heads),
            bias: false,
            ..self
        }
    }

    /// The same model in the 2017 Transformer's layout: Post-LN, ReLU feed-forward, sinusoidal positions.
    pub fn paper_style(self) -> Self {
        Self { norm_placement: NormPlacement::Post, ffn: FfnKind::Relu, positions: PositionKind::Sinusoidal, ..self }
    }

    /// The same model with multi-head latent attention: latent width d_c = `latent_dim`, decoupled RoPE key width
    /// d_R = `rope_dim` (one shared latent, so no separate key/value heads).
    pub fn mla_style(self, latent_dim: usize, rope_dim: usize) -> Self {
        Self {
            attention: AttentionKind::Mla,
            mla_latent_dim: Some(latent_dim),
            mla_rope_dim: Some(rope_dim),
            n_kv_heads: None,
            positions: PositionKind::Rope,
            ..self
        }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        self.check_sizes()?;
        if let Some(v) = self.vocab_size {
            require(v >= 1, "model.vocab_size", v, "at least 1")?;
        }
        require(self.n_layers >= 1, "model.n_layers", self.n_layers, "at least 1")?;
        require(self.n_heads >= 1, "model.n_heads", self.n_heads, "at least 1")?;
        require(self.d_model >= 1, "model.d_model", self.d_model, "at least 1")?;
        match self.head_dim {
            Some(dh) => require(dh >= 1, "model.head_dim", dh, "at least 1")?,
            None => require(
                self.d_model.is_multiple_of(self.n_heads),
                "model.d_model",
                self.d_model,
                format!("must be a multiple of model.n_heads = {} (or set model.head_dim)", self.n_heads),
            )?,
        }
        require(self.block_size >= 1, "model.block_size", self.block_size, "at least 1")?;
        require((0.0..1.0).contains(&self.dropout), "model.dropout", self.dropout, "in [0, 1)")?;
        require(
            (0.0..1.0).contains(&self.attention_dropout),
            "model.attention_dropout",
            self.attention_dropout,
            "in [0, 1)",
        )?;
        require(self.norm_eps > 0.0 && self.norm_eps < 1.0, "model.norm_eps", self.norm_eps, "in (0, 1)")?;
        if let Some(f) = self.d_ff {
            require(f >= 1, "model.d_ff", f, "at least 1")?;
        }
        require(
            self.rope_theta > 1.0 && self.rope_theta.is_finite(),
            "model.rope_theta",
            self.rope_theta,
            "a finite number greater than 1",
        )?;
        if let Some(scaling) = &self.rope_scaling {
            // The rotated width: MLA's decoupled key, else the whole head.
            let rotated =
                if self.attention == AttentionKind::Mla { self.mla_rope_dim.unwrap_or(0) } else { self.head_dim() };
            scaling.check(rotated / 2)?;
        }
        if self.positions == PositionKind::Rope && self.attention == AttentionKind::Mha {
            let d = self.head_dim();
            require(d.is_multiple_of(2), "model.positions", "\"rope\"", format!("needs an even head width, not {d}"))?;
        }
        if let Some(g) = self.n_kv_heads {
            let h = self.n_heads;
            require(g >= 1 && h.is_multiple_of(g), "model.n_kv_heads", g, format!("must divide model.n_heads = {h}"))?;
        }
        if let Some(w) = self.window {
            require(w >= 1, "model.window", w, "at least 1")?;
        }
        if let Some(n) = self.global_every {
            require(n >= 1, "model.global_every", n, "at least 1")?;
            require(self.window.is_some(), "model.global_every", n, "needs model.window")?;
        }
        if let Some(theta) = self.rope_local_theta {
            require(theta > 1.0, "model.rope_local_theta", theta, "greater than 1")?;
            require(self.global_every.is_some(), "model.rope_local_theta", theta, "needs model.global_every")?;
        }
        for (key, value) in [
            ("model.attention_scale", self.attention_scale),
            ("model.attention_softcap", self.attention_softcap),
            ("model.logit_softcap", self.logit_softcap),
        ] {
            if let Some(x) = value {
                require(x.is_finite() && x > 0.0, key, x, "a finite number > 0")?;
                let mha = self.attention == AttentionKind::Mha;
                require(mha || key != "model.attention_softcap", key, x, "needs attention = \"mha\"")?;
            }
        }
        if self.attention_kernel != AttentionKernel::Softmax {
            let kernel = format!("{:?}", self.attention_kernel).to_lowercase();
            let needs = |ok: bool, what: &str| {
                require(ok, "model.attention_kernel", format!("\"{kernel}\""), format!("{what} (softmax has it)"))
            };
            needs(self.window.is_none(), "has no sliding window")?;
            needs(self.attention == AttentionKind::Mha, "needs attention = \"mha\"")?;
            needs(self.attention_dropout == 0.0, "has no attention dropout")?;
            needs(self.attention_softcap.is_none(), "has no score soft-capping")?;
        }
        if let Some(r) = self.favor_features {
            require(r >= 1, "model.favor_features", r, "at least 1")?;
            require(
                self.attention_kernel == AttentionKernel::Favor,
                "model.favor_features",
                r,
                "only for attention_kernel = \"favor\"",
            )?;
        }
        if let Some(n) = self.favor_redraw {
            require(n >= 1, "model.favor_redraw", n, "at least 1 step")?;
            let favor = self.attention_kernel == AttentionKernel::Favor;
            require(favor, "model.favor_redraw", n, "only for attention_kernel = \"favor\"")?;
        }
        match self.attention {
            AttentionKind::Mha => {
                let stray = self.mla_latent_dim.is_some()
                    || self.mla_rope_dim.is_some()
                    || self.mla_q_rank.is_some()
                    || self.mla_latent_norm;
                require(
                    !stray,
                    "model.attention",
                    "\"mha\"",
                    "mla_latent_dim, mla_rope_dim, mla_q_rank and mla_latent_norm need attention = \"mla\"",
                )
            }
            AttentionKind::Mla => {
                let dc = self.mla_latent_dim.unwrap_or(0);
                require(dc >= 1, "model.mla_latent_dim", dc, "at least 1 (required when attention = \"mla\")")?;
                let dr = self.mla_rope_dim.unwrap_or(0);
                require(
                    dr >= 2 && dr.is_multiple_of(2),
                    "model.mla_rope_dim",
                    dr,
                    "an even number ≥ 2 (required for MLA)",
                )?;
                if let Some(r) = self.mla_q_rank {
                    require(r >= 1, "model.mla_q_rank", r, "at least 1")?;
                }
                require(self.n_kv_heads.is_none(), "model.n_kv_heads", self.kv_heads(), "not used by MLA")
            }
        }
    }

    /// Bounds on every size, far above any model's (Llama 3 405B: d 16,384, FFN 53,248, 126 layers, 128 heads), so
    /// that the sizes derived from them (the FFN width, parameter counts, memory estimates) cannot overflow.
    fn check_sizes(&self) -> Result<(), Invalid> {
        const WIDTH: usize = 1 << 20;
        const COUNT: usize = 1 << 16;
        const TOKENS: usize = 1 << 30;
        let sizes = [
            ("model.vocab_size", self.vocab_size, TOKENS),
            ("model.block_size", Some(self.block_size), TOKENS),
            ("model.n_layers", Some(self.n_layers), COUNT),
            ("model.n_heads", Some(self.n_heads), COUNT),
            ("model.n_kv_heads", self.n_kv_heads, COUNT),
            ("model.d_model", Some(self.d_model), WIDTH),
            ("model.head_dim", self.head_dim, WIDTH),
            ("model.d_ff", self.d_ff, WIDTH),
            ("model.mla_latent_dim", self.mla_latent_dim, WIDTH),
            ("model.mla_rope_dim", self.mla_rope_dim, WIDTH),
            ("model.mla_q_rank", self.mla_q_rank, WIDTH),
            ("model.favor_features", self.favor_features, WIDTH),
            ("model.window", self.window, TOKENS),
        ];
        for (key, value, most) in sizes {
            if let Some(value) = value {
                require(value <= most, key, value, format!("at most {most}"))?;
            }
        }
        Ok(())
    }

    /// The vocabulary, which training fills in from the tokenizer before a model is built.
    pub fn vocab(&self) -> usize {
        self.vocab_size.expect("vocab_size is set from the tokenizer before a model is built")
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_heads)
    }

    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    pub fn qkv_bias(&self) -> bool {
        self.qkv_bias.unwrap_or(self.bias)
    }

    /// Layer `layer`'s sliding window: `window`, except on the global layers of `global_every`.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        match self.global_every {
            Some(n) if (layer + 1).is_multiple_of(n) => None,
            _ => self.window,
        }
    }

    /// Layer `layer`'s RoPE base: `rope_local_theta` on a windowed layer of a `global_every` pattern, else
    /// `rope_theta`.
    pub fn layer_rope_theta(&self, layer: usize) -> f64 {
        match (self.layer_window(layer), self.rope_local_theta) {
            (Some(_), Some(local)) => local,
            _ => self.rope_theta,
        }
    }

    /// Layer `layer`'s RoPE scaling: none on a windowed layer with a `rope_local_theta` of its own (Gemma 3 stretches
    /// its global layers only), else `rope_scaling`.
    pub fn layer_rope_scaling(&self, layer: usize) -> Option<&RopeScaling> {
        match (self.layer_window(layer), self.rope_local_theta) {
            (Some(_), Some(_)) => None,
            _ => self.rope_scaling.as_ref(),
        }
    }

    /// σ of the initial weights of the projections into the residual stream, 0.02/√(2L) (GPT-2's scaling).
    pub fn residual_std(&self) -> f64 {
        0.02 / (2.0 * self.n_layers as f64).sqrt()
    }

    /// The feed-forward width: configured, else 4d, or 8/3·d rounded up to 64 for SwiGLU (same parameter count).
    pub fn ffn_dim(&self) -> usize {
        match (self.d_ff, self.ffn) {
            (Some(f), _) => f,
            (None, FfnKind::Swiglu | FfnKind::Geglu) => (8 * self.d_model / 3).div_ceil(64) * 64,
            (None, _) => 4 * self.d_model,
        }
    }
}

/// What is wrong with the `[model]` table of a run directory's `config.toml`.
#[derive(Debug, thiserror::Error)]
pub enum RunConfigError {
    /// Not TOML, no `[model]` table, a key of the wrong type, or no vocabulary size.
    #[error("{0}")]
    Syntax(String),
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// The `[model]` table of a run directory's `config.toml`, validated; a run's model states its vocabulary size.
pub fn model_from_run_toml(text: &str) -> Result<ModelConfig, RunConfigError> {
    let syntax = |reason: &str| RunConfigError::Syntax(reason.to_string());
    let table: toml::Table = toml::from_str(text).map_err(|e| syntax(e.message()))?;
    let model = table.get("model").cloned().ok_or_else(|| syntax("no [model] table"))?;
    let config: ModelConfig = model.try_into().map_err(|e: toml::de::Error| syntax(e.message()))?;
    config.validate()?;
    if config.vocab_size.is_none() {
        return Err(syntax("model.vocab_size is missing"));
    }
    Ok(config)
}
