//! Hugging Face model directories: `config.json` as a [`ModelConfig`], and the shards `model.safetensors.index.json`
//! lists.

use std::path::{Component, Path};

use serde_json::Value;

use crate::config::FfnKind;
use crate::config::ModelConfig;

/// The architectures Ember imports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Family {
    Gpt2,
    Llama,
}

fn usize_of(json: &Value, key: &str) -> Result<usize, String> {
    let value = json[key].as_u64().ok_or_else(|| format!("{key} is missing or not an integer"))?;
    usize::try_from(value).map_err(|_| format!("{key} = {value} is too large"))
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
        other => return Err(format!("model_type {other:?} is not supported (gpt2 and llama are)")),
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
    if !json["rope_scaling"].is_null() {
        return Err(format!("rope_scaling {} is not supported", json["rope_scaling"]));
    }
    if let Some(kind) = json["rope_parameters"]["rope_type"].as_str().filter(|&k| k != "default") {
        return Err(format!("rope_type {kind:?} is not supported (default RoPE is)"));
    }
    let theta = json["rope_theta"].as_f64().or_else(|| json["rope_parameters"]["rope_theta"].as_f64());
    let g = match json.get("num_key_value_heads") {
        None | Some(Value::Null) => h,
        Some(_) => usize_of(json, "num_key_value_heads")?,
    };
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
    config.tie_embeddings = json["tie_word_embeddings"].as_bool().unwrap_or(false);
    if config.bias {
        return Err("mlp_bias = true is not supported".into());
    }
    Ok(config)
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
