//! A [`ModelConfig`] as the `config.json` transformers reads: GPT-2's layout as `gpt2`, the Llama layout as `llama`,
//! `qwen2` (biases on q, k, v), `qwen3` (per-head q and k norms), `mistral` (a window), `gemma2` and `gemma3_text`
//! (sandwich norms). What is written is read back with [`super::config`] and must describe the same model.

use serde_json::{Map, Value, json};

use crate::config::{AttentionKernel, AttentionKind, FfnKind, ModelConfig, NormKind, NormPlacement, PositionKind};
use crate::rope::RopeScaling;

use super::Family;

/// `config`'s `config.json` and the tensor layout it implies, or what of `config` transformers has no place for.
pub fn config_json(config: &ModelConfig) -> Result<(Family, String), String> {
    let (mut json, wanted) = match (config.norm, config.positions) {
        (NormKind::LayerNorm, PositionKind::Learned) => gpt2(config)?,
        (NormKind::RmsNorm, PositionKind::Rope) => llama(config)?,
        (norm, positions) => {
            return Err(format!(
                "{norm:?} with {positions:?} positions has no Hugging Face architecture (LayerNorm with learned \
                 positions is GPT-2's, RMSNorm with RoPE Llama's)"
            ));
        }
    };
    json.insert("torch_dtype".into(), json!("float32"));
    let text = serde_json::to_string_pretty(&Value::Object(json)).expect("JSON values serialize");
    let (family, read) =
        super::config(&text).map_err(|e| format!("the config.json written does not read back: {e}"))?;
    same_model(&wanted, &read)?;
    Ok((family, text))
}

/// `config` without what only training uses (dropout, the f16 passes), with its vocabulary size written out.
pub fn inference(config: &ModelConfig) -> ModelConfig {
    ModelConfig {
        vocab_size: Some(config.vocab()),
        dropout: 0.0,
        attention_dropout: 0.0,
        dtype: Default::default(),
        ..config.clone()
    }
}

/// Ok when `read` is `wanted`, else the first field where they differ.
pub fn same_model(wanted: &ModelConfig, read: &ModelConfig) -> Result<(), String> {
    let (Ok(Value::Object(a)), Ok(Value::Object(b))) = (serde_json::to_value(wanted), serde_json::to_value(read))
    else {
        unreachable!("a ModelConfig serializes to an object")
    };
    let keys = a.keys().chain(b.keys().filter(|k| !a.contains_key(*k)));
    match keys.map(|k| (k, a.get(k), b.get(k))).find(|(_, x, y)| x != y) {
        None => Ok(()),
        Some((key, x, y)) => {
            let show = |v: Option<&Value>| v.map_or("unset".to_string(), Value::to_string);
            Err(format!("model.{key} = {} cannot be written (it would read back as {})", show(x), show(y)))
        }
    }
}

/// GPT-2's config, and the model it describes.
fn gpt2(c: &ModelConfig) -> Result<(Map<String, Value>, ModelConfig), String> {
    let activation = match c.ffn {
        FfnKind::Gelu => "gelu",
        FfnKind::GeluTanh => "gelu_new",
        FfnKind::Relu => "relu",
        other => return Err(format!("model.ffn = {other:?} has no GPT-2 form (gelu, gelu_tanh and relu do)")),
    };
    // Without biases the model is GPT-2's with every bias zero, as the exported tensors have them.
    let wanted = ModelConfig { bias: true, ..inference(c) };
    let json = json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": wanted.vocab(),
        "n_layer": c.n_layers,
        "n_head": c.n_heads,
        "n_embd": c.d_model,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,
        "n_inner": c.d_ff,
        "activation_function": activation,
        "layer_norm_epsilon": c.norm_eps,
        "tie_word_embeddings": true,
    });
    let Value::Object(map) = json else { unreachable!() };
    Ok((map, wanted))
}

/// The Llama family's config, and the model it describes.
fn llama(c: &ModelConfig) -> Result<(Map<String, Value>, ModelConfig), String> {
    if c.attention == AttentionKind::Mla {
        return Err("multi-head latent attention (model.attention = mla) is not written to Hugging Face".into());
    }
    if c.attention_kernel != AttentionKernel::Softmax {
        return Err(format!("model.attention_kernel = {:?} has no Hugging Face architecture", c.attention_kernel));
    }
    let sandwich = c.norm_placement == NormPlacement::Sandwich;
    let (model_type, architecture) = match (sandwich, c.qk_norm, c.qkv_bias(), c.window.is_some()) {
        (true, true, ..) => ("gemma3_text", "Gemma3ForCausalLM"),
        (true, false, ..) => ("gemma2", "Gemma2ForCausalLM"),
        (false, true, ..) => ("qwen3", "Qwen3ForCausalLM"),
        (false, false, true, _) => ("qwen2", "Qwen2ForCausalLM"),
        (false, false, false, true) => ("mistral", "MistralForCausalLM"),
        (false, false, false, false) => ("llama", "LlamaForCausalLM"),
    };
    let act = match c.ffn {
        FfnKind::Swiglu => "silu",
        FfnKind::Geglu => "gelu_pytorch_tanh",
        other => return Err(format!("model.ffn = {other:?} has no Llama form (swiglu and geglu do)")),
    };
    let mut json = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": c.vocab(),
        "hidden_size": c.d_model,
        "intermediate_size": c.ffn_dim(),
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.kv_heads(),
        "head_dim": c.head_dim(),
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "hidden_act": act,
        "attention_bias": c.qkv_bias(),
        "mlp_bias": false,
        "tie_word_embeddings": c.tie_embeddings,
    });
    if let Some(scaling) = &c.rope_scaling {
        json["rope_scaling"] = rope_scaling(scaling)?;
    }
    if let Some(window) = c.window {
        json["sliding_window"] = json!(window);
    }
    if sandwich {
        json["hidden_activation"] = json!(act);
        json["query_pre_attn_scalar"] = json!(c.attention_scale.map_or(c.head_dim() as f64, |s| 1.0 / (s * s)));
        json["attn_logit_softcapping"] = json!(c.attention_softcap);
        json["final_logit_softcapping"] = json!(c.logit_softcap);
        let global = |i: usize| c.window.is_none() || c.global_every.is_some_and(|n| (i + 1).is_multiple_of(n));
        let types: Vec<&str> =
            (0..c.n_layers).map(|i| if global(i) { "full_attention" } else { "sliding_attention" }).collect();
        json["layer_types"] = json!(types);
        if c.qk_norm {
            let mut full = json!({"rope_type": "default", "rope_theta": c.rope_theta});
            if let Some(scaling) = &c.rope_scaling {
                full = rope_scaling(scaling)?;
                full["rope_theta"] = json!(c.rope_theta);
            }
            let local = json!({"rope_type": "default", "rope_theta": c.rope_local_theta.unwrap_or(c.rope_theta)});
            json["rope_parameters"] = json!({"full_attention": full, "sliding_attention": local});
        }
    }
    let Value::Object(map) = json else { unreachable!() };
    let (h, d) = (c.n_heads, c.d_model);
    let head_dim = c.head_dim.filter(|&dh| dh.checked_mul(h) != Some(d));
    Ok((map, ModelConfig { qkv_bias: Some(c.qkv_bias()), head_dim, d_ff: Some(c.ffn_dim()), ..inference(c) }))
}

/// transformers' `rope_scaling` for `scaling`.
fn rope_scaling(scaling: &RopeScaling) -> Result<Value, String> {
    Ok(match scaling {
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_context } => json!({
            "rope_type": "llama3", "factor": factor, "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor, "original_max_position_embeddings": original_context,
        }),
        RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor } => json!({
            "rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original_context,
            "beta_fast": beta_fast, "beta_slow": beta_slow, "attention_factor": attention_factor,
        }),
        RopeScaling::LongRope { short, long, original_context, attention_factor } => json!({
            "rope_type": "longrope", "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": original_context, "attention_factor": attention_factor,
        }),
        RopeScaling::Dynamic { .. } | RopeScaling::Factors { .. } => {
            return Err("dynamic RoPE scaling and per-frequency factors are not written to Hugging Face".into());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_configs_read_back_as_the_same_model() {
        let gpt = ModelConfig::gpt(65, 4, 4, 128, 64);
        let llama = gpt.clone().llama_style(2);
        let qwen2 = ModelConfig { qkv_bias: Some(true), ..llama.clone() };
        let qwen3 = ModelConfig { qk_norm: true, head_dim: Some(64), ..llama.clone() };
        let mistral = ModelConfig { window: Some(16), ..llama.clone() };
        let scaled = ModelConfig { rope_scaling: Some(RopeScaling::yarn(4.0, 16, None, None, None)), ..llama.clone() };
        let gemma3 = ModelConfig {
            ffn: FfnKind::Geglu,
            norm_placement: NormPlacement::Sandwich,
            embedding_scale: true,
            qk_norm: true,
            window: Some(16),
            global_every: Some(2),
            rope_local_theta: Some(10_000.0),
            rope_theta: 1e6,
            ..llama.clone()
        };
        let cases = [("gpt2", gpt), ("llama", llama), ("qwen2", qwen2), ("qwen3", qwen3), ("mistral", mistral)];
        for (name, config) in cases.into_iter().chain([("llama", scaled), ("gemma3_text", gemma3)]) {
            let (_, text) = config_json(&config).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(text.contains(&format!("\"model_type\": \"{name}\"")), "{text}");
            let (_, read) = super::super::config(&text).unwrap();
            assert_eq!(
                (read.n_kv_heads, read.head_dim(), read.window),
                (config.n_kv_heads, config.head_dim(), config.window)
            );
        }
    }

    #[test]
    fn what_transformers_cannot_hold_is_named() {
        let llama = ModelConfig::gpt(65, 2, 4, 64, 32).llama_style(4);
        let linear = ModelConfig { attention_kernel: AttentionKernel::Linear, ..llama.clone() };
        assert!(config_json(&linear).unwrap_err().contains("attention_kernel"));
        let mla = llama.clone().mla_style(16, 8);
        assert!(config_json(&mla).unwrap_err().contains("latent"));
        let softcap_llama = ModelConfig { logit_softcap: Some(30.0), ..llama };
        assert_eq!(
            config_json(&softcap_llama).unwrap_err(),
            "model.logit_softcap = 30.0 cannot be written (it would read back as null)"
        );
    }
}
