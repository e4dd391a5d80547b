//! Hugging Face model directories: `config.json` as a [`ModelConfig`], and the shards `model.safetensors.index.json`
//! lists.

use std::path::{Component, Path};

use serde_json::Value;

use crate::config::{FfnKind, ModelConfig, NormPlacement};
use crate::rope::{RopeScaling, longrope_magnitude, yarn_magnitude};

pub mod written;

/// The tensor layouts Ember imports: GPT-2's, Llama's (which Qwen2, Qwen3 and Mistral share), Phi-3's (Llama's
/// with q, k, v in one `qkv_proj` and gate and up in one `gate_up_proj`) and Gemma 2's (Llama's with a norm after
/// each sub-layer too, every norm's gain stored as γ − 1) and DeepSeek-V2's (Llama's norms and MLP around multi-head
/// latent attention).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Family {
    Gpt2,
    Llama,
    Phi3,
    Gemma,
    DeepseekV2,
}

fn usize_of(json: &Value, key: &str) -> Result<usize, String> {
    let value = json[key].as_u64().ok_or_else(|| format!("{key} is missing or not an integer"))?;
    usize::try_from(value).map_err(|_| format!("{key} = {value} is too large"))
}

/// An integer that may be null or absent.
pub(crate) fn optional(json: &Value, key: &str) -> Result<Option<usize>, String> {
    match json.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => usize_of(json, key).map(Some),
    }
}

/// Qwen's `config`, refused where some layers slide a window (`use_sliding_window`, `layer_types`): Ember's window is
/// one for every layer.
fn full_attention(config: ModelConfig, json: &Value) -> Result<ModelConfig, String> {
    let sliding = json["layer_types"].as_array().is_some_and(|t| t.iter().any(|l| l != "full_attention"));
    if sliding || json["use_sliding_window"].as_bool() == Some(true) {
        return Err("sliding-window attention on some layers (use_sliding_window, layer_types) is not supported".into());
    }
    Ok(config)
}

fn f64_of(json: &Value, key: &str, default: f64) -> f64 {
    json[key].as_f64().unwrap_or(default)
}

/// The model `config.json` describes, validated.
pub fn config(text: &str) -> Result<(Family, ModelConfig), String> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let (family, config) = match json["model_type"].as_str().unwrap_or_default() {
        "gpt2" => (Family::Gpt2, gpt2(&json)?),
        "llama" => (Family::Llama, llama(&json)?),
        "qwen2" => (Family::Llama, ModelConfig { qkv_bias: Some(true), ..full_attention(llama(&json)?, &json)? }),
        "qwen3" => (Family::Llama, ModelConfig { qk_norm: true, ..full_attention(llama(&json)?, &json)? }),
        "mistral" => (Family::Llama, ModelConfig { window: optional(&json, "sliding_window")?, ..llama(&json)? }),
        "phi3" => (Family::Phi3, ModelConfig { window: optional(&json, "sliding_window")?, ..llama(&json)? }),
        "gemma2" => (Family::Gemma, gemma2(&json)?),
        "gemma3_text" => (Family::Gemma, gemma3(&json)?),
        "deepseek_v2" => (Family::DeepseekV2, deepseek_v2(&json)?),
        other => {
            return Err(format!(
                "model_type {other:?} is not supported (gpt2, llama, qwen2, qwen3, mistral, phi3, gemma2, gemma3_text and \
                 deepseek_v2 are)"
            ));
        }
    };
    config.validate().map_err(|e| e.to_string())?;
    Ok((family, config))
}

fn gpt2(json: &Value) -> Result<ModelConfig, String> {
    let mut config = ModelConfig::gpt(
        usize_of(json, "vocab_size")?,
        usize_of(json, "n_layer")?,
        usize_of(json, "n_head")?,
        usize_of(json, "n_embd")?,
        usize_of(json, "n_positions")?,
    );
    config.norm_eps = f64_of(json, "layer_norm_epsilon", 1e-5);
    config.d_ff = json["n_inner"].as_u64().and_then(|v| usize::try_from(v).ok());
    config.ffn = match json["activation_function"].as_str().unwrap_or("gelu_new") {
        "gelu_new" | "gelu_pytorch_tanh" => FfnKind::GeluTanh,
        "gelu" => FfnKind::Gelu,
        "relu" => FfnKind::Relu,
        other => return Err(format!("activation_function {other:?} is not supported")),
    };
    Ok(config)
}

fn llama(json: &Value) -> Result<ModelConfig, String> {
    let (d, h) = (usize_of(json, "hidden_size")?, usize_of(json, "num_attention_heads")?);
    // RoPE on part of each head (`partial_rotary_factor` < 1, Phi-4-mini's 0.75) is refused.
    let partial = json["partial_rotary_factor"].as_f64().or(json["rope_parameters"]["partial_rotary_factor"].as_f64());
    if let Some(f) = partial.filter(|&f| f != 1.0) {
        return Err(format!("partial rotary embeddings (partial_rotary_factor = {f}) are not supported"));
    }
    let theta = json["rope_theta"].as_f64().or_else(|| json["rope_parameters"]["rope_theta"].as_f64());
    let g = optional(json, "num_key_value_heads")?.unwrap_or(h);
    let mut config = ModelConfig::gpt(
        usize_of(json, "vocab_size")?,
        usize_of(json, "num_hidden_layers")?,
        h,
        d,
        usize_of(json, "max_position_embeddings")?,
    )
    .llama_style(g);
    config.head_dim =
        json["head_dim"].as_u64().and_then(|dh| usize::try_from(dh).ok()).filter(|&dh| dh.checked_mul(h) != Some(d));
    config.bias = json["mlp_bias"].as_bool().unwrap_or(false);
    config.qkv_bias = Some(json["attention_bias"].as_bool().unwrap_or(false));
    config.norm_eps = f64_of(json, "rms_norm_eps", 1e-6);
    config.d_ff = Some(usize_of(json, "intermediate_size")?);
    config.rope_theta = theta.unwrap_or(10_000.0);
    config.rope_scaling = rope_scaling(json)?;
    // Dynamic NTK stretches max_position_embeddings, the original context, by its factor: the context it serves.
    if let Some(RopeScaling::Dynamic { factor, original_context }) = config.rope_scaling {
        config.block_size = (original_context as f64 * factor.max(1.0)).min(1e9) as usize;
    }
    config.tie_embeddings = json["tie_word_embeddings"].as_bool().unwrap_or(false);
    // The gate's activation: SiLU (SwiGLU, Llama's), or GELU's tanh form (GeGLU); exact GELU has no gated form here.
    config.ffn = match json["hidden_act"].as_str().or(json["hidden_activation"].as_str()).unwrap_or("silu") {
        "silu" | "swish" => FfnKind::Swiglu,
        "gelu_pytorch_tanh" | "gelu_new" => FfnKind::Geglu,
        other => return Err(format!("hidden_act {other:?} is not supported (silu and gelu_pytorch_tanh are)")),
    };
    if config.bias {
        return Err("mlp_bias = true is not supported".into());
    }
    Ok(config)
}

/// Gemma 2: Llama's config with GeGLU, embeddings scaled by √d, sandwich norms, sliding-window and global layers as
/// `layer_types` alternates them, q kᵀ scaled by `query_pre_attn_scalar`^(−1/2), and soft-capped scores and logits.
fn gemma2(json: &Value) -> Result<ModelConfig, String> {
    let mut config = llama(json)?;
    config.norm_placement = NormPlacement::Sandwich;
    config.embedding_scale = true;
    config.tie_embeddings = json["tie_word_embeddings"].as_bool().unwrap_or(true);
    (config.window, config.global_every) = layer_pattern(json, config.n_layers)?;
    let scalar = json["query_pre_attn_scalar"].as_f64().filter(|&s| s != config.head_dim() as f64);
    config.attention_scale = scalar.map(|s| 1.0 / s.sqrt());
    config.attention_softcap = json["attn_logit_softcapping"].as_f64();
    config.logit_softcap = json["final_logit_softcapping"].as_f64();
    Ok(config)
}

/// Gemma 3's text model: Gemma 2's config with RMSNorm of each query and key head, and RoPE by layer type: the base
/// and scaling of `rope_parameters.full_attention` on the global layers, the base of `sliding_attention` (unscaled)
/// on the windowed ones.
fn gemma3(json: &Value) -> Result<ModelConfig, String> {
    let mut config = ModelConfig { qk_norm: true, ..gemma2(json)? };
    let (global, local) = (&json["rope_parameters"]["full_attention"], &json["rope_parameters"]["sliding_attention"]);
    if global.is_object() {
        config.rope_theta = f64_of(global, "rope_theta", 1_000_000.0);
        config.rope_scaling = scaling_of(global, json)?;
    }
    if local.is_object() && config.window.is_some() {
        let theta = f64_of(local, "rope_theta", 10_000.0);
        match config.global_every {
            Some(_) if scaling_of(local, json)?.is_some() => {
                return Err("RoPE scaling on the sliding-window layers is not supported".into());
            }
            Some(_) => config.rope_local_theta = Some(theta),
            // Every layer slides its window: the sliding layers' RoPE is the model's.
            None => (config.rope_theta, config.rope_scaling) = (theta, scaling_of(local, json)?),
        }
    }
    Ok(config)
}

/// DeepSeek-V2 with dense layers: multi-head latent attention (a latent of `kv_lora_rank`, RMSNorm'd; a decoupled
/// RoPE key of `qk_rope_head_dim`; queries through `q_lora_rank` where set), content heads of `qk_nope_head_dim`, the
/// scores scaled by YaRN's mscale(s, `mscale_all_dim`)² / √(d_h + d_R). Mixture-of-experts layers are refused.
fn deepseek_v2(json: &Value) -> Result<ModelConfig, String> {
    let n_layers = usize_of(json, "num_hidden_layers")?;
    let dense = optional(json, "first_k_dense_replace")?.unwrap_or(0);
    if let Some(experts) = json["n_routed_experts"].as_u64().filter(|&e| e > 0)
        && dense < n_layers
    {
        return Err(format!(
            "mixture-of-experts layers ({} of {n_layers} layers, {experts} routed experts) are not supported",
            n_layers - dense
        ));
    }
    let (nope, rope, dv) =
        (usize_of(json, "qk_nope_head_dim")?, usize_of(json, "qk_rope_head_dim")?, usize_of(json, "v_head_dim")?);
    if dv != nope {
        return Err(format!("value heads of {dv} dims unlike the keys' {nope} content dims are not supported"));
    }
    if json["attention_bias"].as_bool() == Some(true) {
        return Err("attention_bias = true is not supported for DeepSeek-V2".into());
    }
    let mut config = llama(json)?.mla_style(usize_of(json, "kv_lora_rank")?, rope);
    config.head_dim = Some(nope).filter(|&dh| dh.checked_mul(config.n_heads) != Some(config.d_model));
    config.mla_q_rank = optional(json, "q_lora_rank")?;
    config.mla_latent_norm = true;
    let params = if json["rope_scaling"].is_null() { &json["rope_parameters"] } else { &json["rope_scaling"] };
    if let (Some(RopeScaling::Yarn { factor, .. }), Some(all)) =
        (&config.rope_scaling, params["mscale_all_dim"].as_f64())
        && all != 0.0
    {
        config.attention_scale = Some(yarn_magnitude(*factor, all).powi(2) / ((nope + rope) as f64).sqrt());
    }
    Ok(config)
}

/// The window and the global layers of `layer_types` ("sliding_attention" or "full_attention" per layer): every
/// layer global (no window), every layer in `sliding_window`, or every n-th layer global (`global_every`).
fn layer_pattern(json: &Value, n_layers: usize) -> Result<(Option<usize>, Option<usize>), String> {
    let window = optional(json, "sliding_window")?;
    let Some(types) = json["layer_types"].as_array() else {
        return Ok((window, None));
    };
    let global: Vec<bool> = types.iter().map(|t| t == "full_attention").collect();
    let unknown = types.iter().find(|t| !matches!(t.as_str(), Some("full_attention" | "sliding_attention")));
    if let Some(t) = unknown {
        return Err(format!("layer type {t} is not supported (full_attention and sliding_attention are)"));
    }
    if global.len() != n_layers {
        return Err(format!("layer_types lists {} layers, not num_hidden_layers = {n_layers}", global.len()));
    }
    let Some(n) = global.iter().position(|&g| g).map(|i| i + 1) else {
        return Ok((Some(window.ok_or("sliding_attention layers without a sliding_window")?), None));
    };
    if n == 1 && global.iter().all(|&g| g) {
        return Ok((None, None));
    }
    if let Some(i) = (0..n_layers).find(|&i| global[i] != (i + 1).is_multiple_of(n)) {
        return Err(format!(
            "layer_types: layer {i} breaks the pattern of every {n}th layer global (none other is supported)"
        ));
    }
    Ok((Some(window.ok_or("sliding_attention layers without a sliding_window")?), Some(n)))
}

/// RoPE scaling from `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5): `linear`, `dynamic` (over
/// `max_position_embeddings`, as transformers reads it), `llama3`, `yarn` and `longrope` (Phi-3's, also called `su`).
fn rope_scaling(json: &Value) -> Result<Option<RopeScaling>, String> {
    let params = if json["rope_scaling"].is_null() { &json["rope_parameters"] } else { &json["rope_scaling"] };
    scaling_of(params, json)
}

/// The RoPE scaling `params` describe, in a model whose `config.json` is `json`.
fn scaling_of(params: &Value, json: &Value) -> Result<Option<RopeScaling>, String> {
    let factor = || params["factor"].as_f64().ok_or("rope scaling without a numeric factor");
    match params["rope_type"].as_str().or(params["type"].as_str()) {
        None if params.is_null() || params.get("factor").is_none() => Ok(None),
        Some("default") => Ok(None),
        Some("linear") => Ok(Some(RopeScaling::Linear { factor: factor()? })),
        Some("llama3") => Ok(Some(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: f64_of(params, "low_freq_factor", 1.0),
            high_freq_factor: f64_of(params, "high_freq_factor", 4.0),
            original_context: usize_of(params, "original_max_position_embeddings")?,
        })),
        Some("yarn") => {
            if params["truncate"].as_bool() == Some(false) {
                return Err("YaRN with truncate = false is not supported".into());
            }
            let factor = factor()?;
            // Without attention_factor, DeepSeek's mscale and mscale_all_dim give the ratio of two default factors.
            let attention = params["attention_factor"].as_f64().or(
                match (params["mscale"].as_f64(), params["mscale_all_dim"].as_f64()) {
                    (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        Some(yarn_magnitude(factor, m) / yarn_magnitude(factor, all))
                    }
                    _ => None,
                },
            );
            let original_context = usize_of(params, "original_max_position_embeddings")?;
            let (fast, slow) = (params["beta_fast"].as_f64(), params["beta_slow"].as_f64());
            Ok(Some(RopeScaling::yarn(factor, original_context, fast, slow, attention)))
        }
        Some("dynamic") => Ok(Some(RopeScaling::Dynamic {
            factor: factor()?,
            original_context: usize_of(json, "max_position_embeddings")?,
        })),
        Some("longrope" | "su") => {
            let original_context = usize_of(params, "original_max_position_embeddings")
                .or_else(|_| usize_of(json, "original_max_position_embeddings"))?;
            let factor = match params["factor"].as_f64() {
                Some(factor) => factor,
                None => usize_of(json, "max_position_embeddings")? as f64 / original_context as f64,
            };
            let list = |key: &str| -> Result<Vec<f64>, String> {
                let values = params[key].as_array().ok_or_else(|| format!("longrope scaling without a {key} list"))?;
                values.iter().map(|v| v.as_f64().ok_or_else(|| format!("{key} holds {v}, not a number"))).collect()
            };
            Ok(Some(RopeScaling::LongRope {
                short: list("short_factor")?,
                long: list("long_factor")?,
                original_context,
                attention_factor: params["attention_factor"]
                    .as_f64()
                    .unwrap_or_else(|| longrope_magnitude(factor, original_context)),
            }))
        }
        other => Err(format!(
            "RoPE scaling {} is not supported (linear, dynamic, llama3, yarn and longrope are)",
            other.map_or_else(|| params.to_string(), |k| format!("{k:?}"))
        )),
    }
}

/// A MarianMT `config.json` (OPUS-MT): the encoder–decoder's layer shape as a [`ModelConfig`] (Post-LN, sinusoidal
/// positions, embeddings scaled by √d, the output tied to the target embedding or not), its stack depths, each side's
/// vocabulary (one embedding for both when `shared`), and the ids its decoding starts, ends and pads with.
#[derive(Clone, Debug, PartialEq)]
pub struct Marian {
    pub model: ModelConfig,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub src_vocab: usize,
    pub tgt_vocab: usize,
    pub shared: bool,
    pub decoder_start: u32,
    pub eos: u32,
    pub pad: u32,
}

/// The Marian model `config.json` describes; what Ember's encoder–decoder cannot run is refused by name.
pub fn marian(text: &str) -> Result<Marian, String> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    if json["model_type"].as_str() != Some("marian") {
        return Err(format!("model_type {} is not marian", json["model_type"]));
    }
    let refuse = |key: &str, value: bool| match json[key].as_bool() == Some(value) {
        true => Err(format!("{key} = {value} is not supported")),
        false => Ok(()),
    };
    refuse("normalize_before", true)?;
    refuse("scale_embedding", false)?;
    let (d, heads, ffn) =
        (usize_of(&json, "d_model")?, usize_of(&json, "encoder_attention_heads")?, usize_of(&json, "encoder_ffn_dim")?);
    for (key, encoder) in [("decoder_attention_heads", heads), ("decoder_ffn_dim", ffn)] {
        if usize_of(&json, key)? != encoder {
            return Err(format!("{key} unlike the encoder's {encoder} is not supported"));
        }
    }
    let shared = json["share_encoder_decoder_embeddings"].as_bool().unwrap_or(true);
    let src_vocab = usize_of(&json, "vocab_size")?;
    let tgt_vocab = optional(&json, "decoder_vocab_size")?.unwrap_or(src_vocab);
    if shared && tgt_vocab != src_vocab {
        return Err(format!("decoder_vocab_size {tgt_vocab} unlike vocab_size {src_vocab} with shared embeddings"));
    }
    let decoder_layers = usize_of(&json, "decoder_layers")?;
    let mut model = ModelConfig::gpt(tgt_vocab, decoder_layers, heads, d, usize_of(&json, "max_position_embeddings")?)
        .paper_style();
    model.d_ff = Some(ffn);
    model.dropout = 0.0;
    model.tie_embeddings = json["tie_word_embeddings"].as_bool().unwrap_or(true);
    model.ffn = match json["activation_function"].as_str().unwrap_or("gelu") {
        "swish" | "silu" => FfnKind::Silu,
        "relu" => FfnKind::Relu,
        "gelu" => FfnKind::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" => FfnKind::GeluTanh,
        other => return Err(format!("activation_function {other:?} is not supported")),
    };
    model.validate().map_err(|e| e.to_string())?;
    // The decoder's tokens, and the pad id the source is padded with too.
    let id = |key: &str| -> Result<u32, String> {
        let id = usize_of(&json, key)?;
        let fits = id < tgt_vocab.min(src_vocab);
        u32::try_from(id).ok().filter(|_| fits).ok_or_else(|| format!("{key} = {id} is past the vocabulary"))
    };
    let pad = id("pad_token_id")?;
    let decoder_start = match json.get("decoder_start_token_id") {
        None | Some(Value::Null) => pad,
        Some(_) => id("decoder_start_token_id")?,
    };
    let (encoder_layers, eos) = (usize_of(&json, "encoder_layers")?, id("eos_token_id")?);
    Ok(Marian { model, encoder_layers, decoder_layers, src_vocab, tgt_vocab, shared, decoder_start, eos, pad })
}

/// The shard files a `model.safetensors.index.json` names, sorted and each once; every one must be a file of the
/// model's directory (no absolute path, no `..`).
pub fn shards(index: &str) -> Result<Vec<String>, String> {
    let json: Value = serde_json::from_str(index).map_err(|e| format!("not valid JSON: {e}"))?;
    let map = json["weight_map"].as_object().ok_or("no weight_map")?;
    let mut files: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
    files.sort();
    files.dedup();
    let inside = |file: &String| Path::new(file).components().all(|c| matches!(c, Component::Normal(_)));
    match files.iter().find(|file| !inside(file)) {
        Some(outside) => Err(format!("shard {outside:?} is outside the model directory")),
        None => Ok(files),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny llama's config.json with `edit` applied.
    fn llama_json(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
        let mut json = serde_json::json!({
            "model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2, "intermediate_size": 64, "max_position_embeddings": 64, "vocab_size": 96,
        });
        edit(json.as_object_mut().unwrap());
        json.to_string()
    }

    /// The gate's activation is read, not assumed: GELU's tanh form gives GeGLU, an activation Ember lacks is
    /// refused by name instead of running as SiLU.
    #[test]
    fn the_hidden_activation_is_honoured_or_refused() {
        assert_eq!(config(&llama_json(|_| {})).unwrap().1.ffn, FfnKind::Swiglu);
        let tanh = llama_json(|j| _ = j.insert("hidden_act".into(), "gelu_pytorch_tanh".into()));
        assert_eq!(config(&tanh).unwrap().1.ffn, FfnKind::Geglu);
        let exact = llama_json(|j| _ = j.insert("hidden_act".into(), "gelu".into()));
        assert_eq!(
            config(&exact).unwrap_err(),
            "hidden_act \"gelu\" is not supported (silu and gelu_pytorch_tanh are)"
        );
    }

    /// Absurd sizes are refused with the key named, before any size derived from them can overflow.
    #[test]
    fn absurd_sizes_are_refused_not_overflowed() {
        let huge = llama_json(|j| _ = j.insert("hidden_size".into(), (1u64 << 62).into()));
        let err = config(&huge).unwrap_err();
        assert!(err.contains("model.d_model") && err.contains("at most 1048576"), "{err}");
        let gpt2 = r#"{"model_type": "gpt2", "vocab_size": 50, "n_layer": 1, "n_head": 1, "n_embd": 4611686018427387904,
            "n_positions": 8}"#;
        assert!(config(gpt2).unwrap_err().contains("model.d_model"));
    }
}
