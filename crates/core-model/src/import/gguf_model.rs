//! A GGUF file of the llama, qwen2, qwen3, phi3, gemma2, gemma3 or deepseek2 architecture as an Ember model: hyper-parameters and tokenizer
//! from the metadata, matrices kept in their blocks and renamed (q, k and v stacked into one projection), and, for
//! llama, llama.cpp's interleaved q/k row order turned back into the rotate-half order (the other architectures are
//! stored rotate-half, llama.cpp's NEOX RoPE).
//!
//! Qwen2 is the Llama layout with biases on q, k and v; Qwen3 has no biases but an RMSNorm of each query and key head
//! before RoPE, and its head width from `attention.key_length`; Phi-3 stores q, k and v as one `attn_qkv` and the
//! gate and up projections as one `ffn_up`, and slides a window of `attention.sliding_window` keys.
//!
//! Gemma 2 is Ember's decoder configured as: embeddings scaled by √d, sandwich norms (the file stores 1 + γ), GeGLU,
//! a sliding window on every other layer (`attention.sliding_window_pattern`, 2 by default), scores and logits
//! soft-capped by `attn_logit_softcapping` and `final_logit_softcapping`, and q kᵀ scaled as llama.cpp does: by
//! 1/√d_h, or 1/√(d/h) for the 46-layer 27B model, whose query_pre_attn_scalar the file does not store.
//!
//! DeepSeek-V2 (deepseek2, dense layers only) is Ember's MLA with its latent RMSNorm'd and queries through a
//! bottleneck where the file has one; its attention tensors are read as f32 ([`latent_weights`]).
//!
//! Gemma 3 is Ember's decoder configured as: embeddings scaled by √d, RMSNorm before and after each sub-layer
//! (`sandwich`; the file stores Gemma's 1 + γ as the gain), RMSNorm of each query and key head before RoPE, GeGLU,
//! head width 256 (not d / h), a sliding window of 512 on five layers of every six with RoPE base 10,000 there and
//! the file's base (10⁶) and RoPE scaling on the global sixth, q kᵀ scaled by 1/√(d/h) for the 27B model, and a tied
//! output projection.

use std::path::Path;

use burn::tensor::TensorData;
use ember_formats::chat::ChatFormat;
use tokenizers::Tokenizer;

use super::ImportError;
use super::gguf::{Array, Gguf, Value};
use super::mla::{self, MlaWeights, rotate_half_order};
use crate::weights::Weights;
use ember_formats::config::ModelConfig;
use ember_formats::config::{FfnKind, NormPlacement};
use ember_formats::packed::Packed;
use ember_formats::rope::{RopeScaling, yarn_magnitude};
use ember_formats::tokenizer;

/// Config, Ember-named weights, tokenizer and chat format of a llama GGUF file.
pub fn load(path: &Path) -> Result<(ModelConfig, Weights, Tokenizer, ChatFormat), ImportError> {
    let bad = |reason: String| ImportError::new(path, reason);
    let gguf = open(path)?;
    let config = full_config(&gguf).map_err(bad)?;
    let tensors = tensors(&gguf, &config).map_err(bad)?;
    let tokenizer = tokenizer(&gguf).map_err(bad)?;
    Ok((config, tensors, tokenizer, ChatFormat::from_gguf(&gguf)))
}

/// The file at `path` parsed: its header read, its tensors mapped but not read.
fn open(path: &Path) -> Result<Gguf, ImportError> {
    let bad = |reason: String| ImportError::new(path, reason);
    Gguf::parse(ember_formats::files::map(path).map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))
}

/// The model config of the GGUF file at `path`, from its metadata and RoPE factor tensors (no weight is read).
pub fn load_config(path: &Path) -> Result<ModelConfig, ImportError> {
    full_config(&open(path)?).map_err(|reason| ImportError::new(path, reason))
}

/// [`config`] with RoPE scaling stored as factor tensors ([`rope_factors`]).
fn full_config(gguf: &Gguf) -> Result<ModelConfig, String> {
    let mut config = config(gguf)?;
    if let Some(scaling) = rope_factors(gguf, &config)? {
        config.rope_scaling = Some(scaling);
        config.validate().map_err(|e| e.to_string())?;
    }
    Ok(config)
}

fn meta<'a>(gguf: &'a Gguf, key: &str) -> Result<&'a Value, String> {
    gguf.get(key).ok_or_else(|| format!("metadata {key} is missing"))
}

fn count(gguf: &Gguf, key: &str) -> Result<usize, String> {
    optional_count(gguf, key)?.ok_or_else(|| format!("metadata {key} is missing"))
}

/// The integer `key`, None where the file leaves it out; stored as another type it is an error, not a default.
fn optional_count(gguf: &Gguf, key: &str) -> Result<Option<usize>, String> {
    let Some(value) = gguf.get(key) else { return Ok(None) };
    let count = value.as_u64().and_then(|v| usize::try_from(v).ok());
    count.map(Some).ok_or_else(|| format!("metadata {key} is not an unsigned integer"))
}

/// The number `key`, None where the file leaves it out; stored as another type it is an error.
fn optional_number(gguf: &Gguf, key: &str) -> Result<Option<f64>, String> {
    let Some(value) = gguf.get(key) else { return Ok(None) };
    value.as_f64().map(Some).ok_or_else(|| format!("metadata {key} is not a number"))
}

/// The architectures Ember reads.
#[derive(Clone, Copy, PartialEq)]
enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Phi3,
    Gemma2,
    Gemma3,
    Deepseek2,
}

impl Arch {
    const ALL: [Arch; 7] =
        [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Phi3, Arch::Gemma2, Arch::Gemma3, Arch::Deepseek2];

    /// llama.cpp's name, which also prefixes the architecture's metadata keys.
    fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Deepseek2 => "deepseek2",
        }
    }
}

fn arch(gguf: &Gguf) -> Result<Arch, String> {
    let name = meta(gguf, "general.architecture")?.as_str().unwrap_or_default();
    Arch::ALL.into_iter().find(|a| a.name() == name).ok_or_else(|| {
        let known: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        format!("architecture {name:?} is not supported ({} are)", known.join(", "))
    })
}

/// Gemma 2's layers in a sliding window (every other one) where the file names no pattern, and the layer count of
/// its 27B model, whose queries are scaled by 1/√(d/h) instead of 1/√d_h.
const GEMMA2_GLOBAL_EVERY: usize = 2;
const GEMMA2_27B_LAYERS: usize = 46;

/// Gemma 3's sliding-window pattern (every sixth layer global) and local RoPE base where its file does not store them
/// (`attention.sliding_window_pattern`, `rope.freq_base_swa`), and the layer count of its 27B model, whose queries
/// are scaled by 1/√(d/h), as llama.cpp reads them.
const GEMMA3_GLOBAL_EVERY: usize = 6;
const GEMMA3_LOCAL_THETA: f64 = 10_000.0;
const GEMMA3_27B_LAYERS: usize = 62;

fn config(gguf: &Gguf) -> Result<ModelConfig, String> {
    let arch = arch(gguf)?;
    let key = |name: &str| format!("{}.{name}", arch.name());
    let tokens = meta(gguf, "tokenizer.ggml.tokens")?.as_array().ok_or("tokenizer.ggml.tokens is not an array")?;
    let h = count(gguf, &key("attention.head_count"))?;
    let d = count(gguf, &key("embedding_length"))?;
    let g = optional_count(gguf, &key("attention.head_count_kv"))?.unwrap_or(h);
    let layers = count(gguf, &key("block_count"))?;
    // DeepSeek-V2 files count experts even where every layer is dense (leading_dense_block_count).
    let dense = optional_count(gguf, &key("leading_dense_block_count"))?.unwrap_or(0);
    if let Some(experts) = optional_count(gguf, &key("expert_count"))?.filter(|&n| n > 0)
        && dense < layers
    {
        return Err(format!(
            "mixture-of-experts layers ({} of {layers} layers, {experts} experts) are not supported",
            layers - dense
        ));
    }
    let mut config = ModelConfig::gpt(tokens.len(), layers, h, d, count(gguf, &key("context_length"))?).llama_style(g);
    config.head_dim = optional_count(gguf, &key("attention.key_length"))?.filter(|&dh| dh.checked_mul(h) != Some(d));
    config.norm_eps =
        meta(gguf, &key("attention.layer_norm_rms_epsilon"))?.as_f64().ok_or("rms epsilon is not a number")?;
    config.d_ff = Some(count(gguf, &key("feed_forward_length"))?);
    config.rope_theta = optional_number(gguf, &key("rope.freq_base"))?.unwrap_or(10_000.0);
    config.tie_embeddings = gguf.info("output.weight").is_none();
    config.rope_scaling = rope_scaling(gguf, &key)?;
    config.qkv_bias = (arch == Arch::Qwen2).then_some(true);
    config.qk_norm = arch == Arch::Qwen3;
    if arch == Arch::Phi3 {
        config.window = optional_count(gguf, &key("attention.sliding_window"))?.filter(|&w| w > 0);
    }
    if matches!(arch, Arch::Gemma2 | Arch::Gemma3) {
        config.ffn = FfnKind::Geglu;
        config.norm_placement = NormPlacement::Sandwich;
        config.embedding_scale = true;
        config.window = Some(count(gguf, &key("attention.sliding_window"))?);
        if let Some(dv) = optional_count(gguf, &key("attention.value_length"))?
            && dv != config.head_dim()
        {
            return Err(format!("value heads of {dv} dims unlike the keys' {} are not supported", config.head_dim()));
        }
        // Every n-th layer global, and the 27B model's queries scaled by 1/√(d/h), as llama.cpp reads either.
        let (every, big) = match arch {
            Arch::Gemma2 => (GEMMA2_GLOBAL_EVERY, GEMMA2_27B_LAYERS),
            _ => (GEMMA3_GLOBAL_EVERY, GEMMA3_27B_LAYERS),
        };
        let pattern = optional_count(gguf, &key("attention.sliding_window_pattern"))?;
        config.global_every = Some(pattern.unwrap_or(every));
        if config.n_layers == big {
            config.attention_scale = Some(1.0 / ((d / h) as f64).sqrt());
        }
    }
    if arch == Arch::Gemma2 {
        config.attention_softcap = optional_number(gguf, &key("attn_logit_softcapping"))?;
        config.logit_softcap = optional_number(gguf, &key("final_logit_softcapping"))?;
    }
    if arch == Arch::Gemma3 {
        config.qk_norm = true;
        config.rope_local_theta =
            Some(optional_number(gguf, &key("rope.freq_base_swa"))?.unwrap_or(GEMMA3_LOCAL_THETA));
    }
    if arch == Arch::Deepseek2 {
        config = latent(gguf, config, &key)?;
    }
    config.validate().map_err(|e| e.to_string())?;
    let rotated = config.mla_rope_dim.unwrap_or(config.head_dim());
    if let Some(rope_dim) = optional_count(gguf, &key("rope.dimension_count"))?
        && rope_dim != rotated
    {
        return Err(format!("partial rotary embeddings ({rope_dim} of {} dims) are not supported", config.head_dim()));
    }
    Ok(config)
}

/// DeepSeek-V2's multi-head latent attention from `attention.kv_lora_rank` (d_c), `rope.dimension_count` (d_R),
/// `attention.key_length_mla` (d_h + d_R), `attention.value_length_mla` (d_h) and `attention.q_lora_rank`, with the
/// latent RMSNorm'd. With YaRN, llama.cpp keeps cos and sin unscaled and scales the scores by mscale² / √(d_h + d_R),
/// mscale = 0.1 · m · ln s + 1 with m from `rope.scaling.yarn_log_multiplier` (which the converter writes as 0.1 m).
fn latent(gguf: &Gguf, config: ModelConfig, key: &dyn Fn(&str) -> String) -> Result<ModelConfig, String> {
    let dr = count(gguf, &key("rope.dimension_count"))?;
    let dk = count(gguf, &key("attention.key_length_mla"))?;
    let dh =
        dk.checked_sub(dr).filter(|&dh| dh > 0).ok_or_else(|| format!("key_length_mla {dk} is not above d_R {dr}"))?;
    let dv = count(gguf, &key("attention.value_length_mla"))?;
    if dv != dh {
        return Err(format!("value heads of {dv} dims unlike the keys' {dh} content dims are not supported"));
    }
    let mut config = config.mla_style(count(gguf, &key("attention.kv_lora_rank"))?, dr);
    config.head_dim = Some(dh).filter(|&dh| dh.checked_mul(config.n_heads) != Some(config.d_model));
    config.mla_q_rank = optional_count(gguf, &key("attention.q_lora_rank"))?.filter(|&r| r > 0);
    config.mla_latent_norm = true;
    if let Some(RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, .. }) = config.rope_scaling {
        let m = optional_number(gguf, &key("rope.scaling.yarn_log_multiplier"))?.unwrap_or(0.0) / 0.1;
        config.rope_scaling =
            Some(RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor: 1.0 });
        config.attention_scale = Some(yarn_magnitude(factor, m).powi(2) / (dk as f64).sqrt());
    }
    Ok(config)
}

/// RoPE scaling from `{arch}.rope.scaling.*`, as llama.cpp's converter writes it: `linear` (factor) and `yarn`
/// (factor, original context, and β_fast, β_slow and the attention factor where given, else [`RopeScaling::yarn`]'s
/// defaults). Llama 3's scaling is a `rope_freqs` tensor instead ([`rope_factors`]).
fn rope_scaling(gguf: &Gguf, key: &dyn Fn(&str) -> String) -> Result<Option<RopeScaling>, String> {
    let number = |name: &str| optional_number(gguf, &key(name));
    let kind = gguf.get(&key("rope.scaling.type")).map(|v| v.as_str().unwrap_or_default());
    let factor =
        || number("rope.scaling.factor")?.ok_or_else(|| format!("metadata {} is missing", key("rope.scaling.factor")));
    match kind {
        // LongRoPE's factors are tensors, read by rope_factors.
        None | Some("none" | "longrope") => Ok(None),
        Some("linear") => Ok(Some(RopeScaling::Linear { factor: factor()? })),
        Some("yarn") => {
            let factor = factor()?;
            if let Some(ext) = number("rope.scaling.yarn_ext_factor")?.filter(|&e| e != 1.0) {
                return Err(format!("YaRN with an extrapolation factor of {ext} (not 1) is not supported"));
            }
            let attention = number("rope.scaling.yarn_attn_factor")?.or(number("rope.scaling.attn_factor")?);
            let original_context = count(gguf, &key("rope.scaling.original_context_length"))?;
            let (fast, slow) = (number("rope.scaling.yarn_beta_fast")?, number("rope.scaling.yarn_beta_slow")?);
            Ok(Some(RopeScaling::yarn(factor, original_context, fast, slow, attention)))
        }
        Some(other) => Err(format!("RoPE scaling {other:?} is not supported (linear, yarn and longrope are)")),
    }
}

/// RoPE scaling stored as tensors of per-pair frequency factors, None without them: Llama 3's one `rope_freqs`, or
/// Phi-3's LongRoPE `rope_factors_short` and `rope_factors_long` (with the original context and the attention factor
/// in the metadata, as llama.cpp's converter writes them). With RoPE scaling in the metadata too it is an error.
fn rope_factors(gguf: &Gguf, config: &ModelConfig) -> Result<Option<RopeScaling>, String> {
    let factors = |name: &str| -> Result<Option<Vec<f64>>, String> {
        if gguf.info(name).is_none() {
            return Ok(None);
        }
        if config.rope_scaling.is_some() {
            return Err(format!("both {name} and rope.scaling metadata scale RoPE"));
        }
        let (_, values) = gguf.tensor(name).map_err(|e| e.to_string())?;
        Ok(Some(values.into_iter().map(f64::from).collect()))
    };
    let arch = arch(gguf)?;
    let key = |name: &str| format!("{}.{name}", arch.name());
    match (factors(ROPE_FREQS)?, factors(ROPE_SHORT)?, factors(ROPE_LONG)?) {
        (Some(factors), None, None) => Ok(Some(RopeScaling::Factors { factors })),
        (None, Some(short), Some(long)) => {
            let original_context = count(gguf, &key("rope.scaling.original_context_length"))?;
            let attention_factor = optional_number(gguf, &key("rope.scaling.attn_factor"))?.unwrap_or(1.0);
            Ok(Some(RopeScaling::LongRope { short, long, original_context, attention_factor }))
        }
        (None, None, None) if gguf.get(&key("rope.scaling.type")).and_then(Value::as_str) == Some("longrope") => {
            Err(format!("LongRoPE scaling without its {ROPE_SHORT} and {ROPE_LONG} tensors"))
        }
        (None, None, None) => Ok(None),
        _ => Err(format!("RoPE factors: either {ROPE_FREQS} alone or both {ROPE_SHORT} and {ROPE_LONG}")),
    }
}

const ROPE_FREQS: &str = "rope_freqs.weight";
const ROPE_SHORT: &str = "rope_factors_short.weight";
const ROPE_LONG: &str = "rope_factors_long.weight";

/// The model's tensors, each checked against the shape the metadata implies before it is used; a tensor of the file
/// that the model does not use is an error (the metadata and the weights disagree), not a silent smaller model.
fn tensors(gguf: &Gguf, config: &ModelConfig) -> Result<Weights, String> {
    let arch = arch(gguf)?;
    let (d, v, f) = (config.d_model, config.vocab(), config.ffn_dim());
    let (h, g, dh) = (config.n_heads, config.kv_heads(), config.head_dim());
    let (Some(hd), Some(gd)) = (h.checked_mul(dh), g.checked_mul(dh)) else {
        return Err(format!("{h} heads of {dh} dimensions overflow"));
    };
    let used = std::cell::RefCell::new(std::collections::HashSet::new());
    let check = |name: &str, shape: &[usize]| -> Result<(), String> {
        let info = gguf.info(name).ok_or_else(|| format!("no tensor named {name}"))?;
        if info.shape() != shape {
            return Err(format!("tensor {name} has shape {:?}; the metadata needs {shape:?}", info.shape()));
        }
        used.borrow_mut().insert(name.to_string());
        Ok(())
    };
    let get = |name: &str, shape: &[usize]| -> Result<TensorData, String> {
        check(name, shape)?;
        gguf.tensor(name).map(|(shape, values)| TensorData::new(values, shape)).map_err(|e| e.to_string())
    };
    let matrix = |name: &str, shape: [usize; 2]| -> Result<Packed, String> {
        check(name, &shape)?;
        gguf.packed(name).map_err(|e| e.to_string())
    };
    let mut out = Weights::default();
    out.packed.insert("wte.weight".into(), matrix("token_embd.weight", [v, d])?);
    for i in 0..config.n_layers {
        let (l, b) = (format!("blk.{i}"), format!("blocks.{i}"));
        out.dense.insert(format!("{b}.ln_1.gamma"), get(&format!("{l}.attn_norm.weight"), &[d])?);
        out.dense.insert(format!("{b}.ln_2.gamma"), get(&format!("{l}.ffn_norm.weight"), &[d])?);
        let qkv = match arch {
            Arch::Deepseek2 => {
                mla::insert(config, &b, latent_weights(&get, &l, config)?, &mut out.dense)?;
                None
            }
            Arch::Phi3 => Some(matrix(&format!("{l}.attn_qkv.weight"), [hd + 2 * gd, d])?),
            _ => {
                let mut q = matrix(&format!("{l}.attn_q.weight"), [hd, d])?;
                let mut k = matrix(&format!("{l}.attn_k.weight"), [gd, d])?;
                if arch == Arch::Llama {
                    (q, k) = (q.reorder_rows(&rotate_half_order(h, dh)), k.reorder_rows(&rotate_half_order(g, dh)));
                }
                let v = matrix(&format!("{l}.attn_v.weight"), [gd, d])?;
                Some(Packed::stack(vec![q, k, v]).map_err(|e| e.to_string())?)
            }
        };
        if let Some(qkv) = qkv {
            out.packed.insert(format!("{b}.attn.c_attn.weight"), qkv);
        }
        let sandwich = [("post_attention_norm", "ln_1_out", d), ("post_ffw_norm", "ln_2_out", d)];
        let head_norms = [("attn_q_norm", "attn.q_norm", dh), ("attn_k_norm", "attn.k_norm", dh)];
        let norms = match arch {
            Arch::Gemma3 => [&sandwich[..], &head_norms].concat(),
            Arch::Gemma2 => sandwich.to_vec(),
            Arch::Qwen3 => head_norms.to_vec(),
            Arch::Llama | Arch::Qwen2 | Arch::Phi3 | Arch::Deepseek2 => Vec::new(),
        };
        for (file, ember, width) in norms {
            out.dense.insert(format!("{b}.{ember}.gamma"), get(&format!("{l}.{file}.weight"), &[width])?);
        }
        if config.qkv_bias() {
            let mut values = Vec::with_capacity(hd + 2 * gd);
            for (part, rows) in [("attn_q", hd), ("attn_k", gd), ("attn_v", gd)] {
                values.extend(get(&format!("{l}.{part}.bias"), &[rows])?.iter::<f32>());
            }
            out.dense.insert(format!("{b}.attn.c_attn.bias"), TensorData::new(values, [hd + 2 * gd]));
        }
        if arch == Arch::Phi3 {
            // Phi-3's ffn_up holds the gate's rows, then the up projection's.
            let gate_up = matrix(&format!("{l}.ffn_up.weight"), [2 * f, d])?;
            let rows = |from: usize| (from..from + f).collect::<Vec<_>>();
            out.packed.insert(format!("{b}.mlp.c_gate.weight"), gate_up.reorder_rows(&rows(0)));
            out.packed.insert(format!("{b}.mlp.c_fc.weight"), gate_up.reorder_rows(&rows(f)));
        }
        let ffn =
            [("ffn_gate", "mlp.c_gate", [f, d]), ("ffn_up", "mlp.c_fc", [f, d]), ("ffn_down", "mlp.c_proj", [d, f])];
        let projections = match arch {
            Arch::Phi3 => vec![("attn_output", "attn.c_proj", [d, hd]), ffn[2]],
            Arch::Deepseek2 => ffn.to_vec(),
            _ => [&[("attn_output", "attn.c_proj", [d, hd])][..], &ffn].concat(),
        };
        for (part, ember, shape) in projections {
            out.packed.insert(format!("{b}.{ember}.weight"), matrix(&format!("{l}.{part}.weight"), shape)?);
        }
    }
    out.dense.insert("ln_f.gamma".into(), get("output_norm.weight", &[d])?);
    match &config.rope_scaling {
        Some(RopeScaling::Factors { factors }) => check(ROPE_FREQS, &[factors.len()])?,
        Some(RopeScaling::LongRope { short, long, .. }) => {
            check(ROPE_SHORT, &[short.len()])?;
            check(ROPE_LONG, &[long.len()])?;
        }
        _ => {}
    }
    if !config.tie_embeddings {
        out.packed.insert("lm_head.weight".into(), matrix("output.weight", [v, d])?);
    }
    let used = used.into_inner();
    let unused: Vec<&str> = gguf.tensors.iter().map(|t| t.name.as_str()).filter(|n| !used.contains(*n)).collect();
    if !unused.is_empty() {
        return Err(format!(
            "{} tensor(s) are not part of the {}-layer model the metadata describes: {}",
            unused.len(),
            config.n_layers,
            unused.iter().take(5).copied().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(out)
}

/// Layer `l`'s DeepSeek-V2 attention as llama.cpp's converter stores it, in Hugging Face's layout: `attn_q` (or
/// `attn_q_a`, its norm and `attn_q_b`), `attn_kv_a_mqa`, `attn_kv_a_norm`, `attn_output`, and `kv_b_proj` put back
/// together from `attn_k_b` [h, d_c, d_h] (each head's key rows transposed) and `attn_v_b` [h, d_h, d_c], or read
/// whole from an older file's `attn_kv_b`.
fn latent_weights(get: &Getter, l: &str, config: &ModelConfig) -> Result<MlaWeights, String> {
    let (d, h, dh) = (config.d_model, config.n_heads, config.head_dim());
    let (dc, dr) = (config.mla_latent_dim.unwrap_or(0), config.mla_rope_dim.unwrap_or(0));
    let t = |part: &str, shape: &[usize]| get(&format!("{l}.{part}.weight"), shape);
    let (q_a, q) = match config.mla_q_rank {
        Some(r) => (Some((t("attn_q_a", &[r, d])?, t("attn_q_a_norm", &[r])?)), t("attn_q_b", &[h * (dh + dr), r])?),
        None => (None, t("attn_q", &[h * (dh + dr), d])?),
    };
    let kv_b = match get(&format!("{l}.attn_kv_b.weight"), &[h * 2 * dh, dc]) {
        Ok(kv_b) => kv_b,
        Err(_) => {
            let k_b = t("attn_k_b", &[h, dc, dh])?;
            let v_b = t("attn_v_b", &[h, dh, dc])?;
            let (k_b, v_b) = (
                k_b.as_slice::<f32>().map_err(|e| format!("{e:?}"))?,
                v_b.as_slice::<f32>().map_err(|e| format!("{e:?}"))?,
            );
            let mut rows = Vec::with_capacity(h * 2 * dh * dc);
            for j in 0..h {
                let head = &k_b[j * dc * dh..(j + 1) * dc * dh];
                rows.extend((0..dh).flat_map(|r| (0..dc).map(move |c| head[c * dh + r])));
                rows.extend_from_slice(&v_b[j * dh * dc..(j + 1) * dh * dc]);
            }
            TensorData::new(rows, [h * 2 * dh, dc])
        }
    };
    Ok(MlaWeights {
        q_a,
        q,
        kv_a: t("attn_kv_a_mqa", &[dc + dr, d])?,
        kv_norm: t("attn_kv_a_norm", &[dc])?,
        kv_b,
        o: t("attn_output", &[d, h * dh])?,
    })
}

/// Reads a tensor as f32, checked against a shape.
type Getter<'a> = dyn Fn(&str, &[usize]) -> Result<TensorData, String> + 'a;

/// The tokenizer of `tokenizer.ggml.*`: GPT-2 style byte-level BPE ("gpt2": tokens, merges) or SentencePiece BPE
/// ("llama": tokens and scores, merges rebuilt from them); control tokens as special tokens.
fn tokenizer(gguf: &Gguf) -> Result<Tokenizer, String> {
    let model = meta(gguf, "tokenizer.ggml.model")?.as_str().unwrap_or_default();
    let strings = |key: &str| -> Result<Vec<String>, String> {
        let values = meta(gguf, key)?.as_array().ok_or_else(|| format!("{key} is not an array"))?;
        let strings = values.strings().ok_or_else(|| format!("{key} is not an array of strings"))?;
        Ok(strings.iter().map(String::from).collect())
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let types: Vec<i64> =
        gguf.get("tokenizer.ggml.token_type").and_then(Value::as_array).and_then(Array::integers).unwrap_or_default();
    // Token type 3 is "control" (<|im_start|>, <|endoftext|>, <start_of_turn>, ...), 4 "user-defined".
    let of_type = |kind: i64| -> Vec<u32> {
        types.iter().enumerate().filter(|&(_, &t)| t == kind).map(|(i, _)| i as u32).collect()
    };
    let specials = of_type(3);
    if model == "llama" {
        // Gemma's merges follow the file's order of its tokens, not their scores.
        let order: Vec<f64> = match arch(gguf)? {
            Arch::Gemma2 | Arch::Gemma3 => (0..tokens.len()).map(|i| -(i as f64)).collect(),
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 | Arch::Deepseek2 => {
                meta(gguf, "tokenizer.ggml.scores")?
                    .as_array()
                    .and_then(Array::floats)
                    .ok_or("tokenizer.ggml.scores is not an array of numbers")?
            }
        };
        if order.len() != tokens.len() {
            return Err(format!("{} scores for {} tokens", order.len(), tokens.len()));
        }
        let add_bos = gguf.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool).unwrap_or(true);
        let bos = gguf.get("tokenizer.ggml.bos_token_id").and_then(Value::as_u64).map(|id| id as u32);
        return tokenizer::from_spm(&tokens, &order, &specials, &of_type(4), bos.filter(|_| add_bos))
            .map_err(|e| e.to_string());
    }
    if model != "gpt2" {
        return Err(format!(
            "tokenizer {model:?} is not supported (GPT-2 style byte-level BPE, \"gpt2\", and SentencePiece, \"llama\", are)"
        ));
    }
    let merges = strings("tokenizer.ggml.merges")?;
    let pre = gguf.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
    tokenizer::from_bpe(&tokens, &merges, &specials, pre).map_err(|e| e.to_string())
}
