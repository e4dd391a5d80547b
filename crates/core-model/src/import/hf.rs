//! Hugging Face model directories: `config.json` + `model.safetensors` (or sharded with an index) for
//! `GPT2LMHeadModel` and `LlamaForCausalLM`, mapped onto Ember's parameter names.

use std::path::{Component, Path};

use burn::tensor::TensorData;
use safetensors::tensor::Dtype;
use serde_json::Value;

use super::{ImportError, Tensors, concat_rows, transpose};
use crate::config::FfnKind;
use crate::{ModelConfig, files};

/// The model config and Ember-named tensors of a Hugging Face directory.
pub fn load(dir: &Path) -> Result<(ModelConfig, Tensors), ImportError> {
    let config_path = dir.join("config.json");
    let bad = |reason: String| ImportError::new(&config_path, reason);
    let text = files::read_to_string(&config_path).map_err(|e| bad(e.to_string()))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let model_type = json["model_type"].as_str().unwrap_or_default();
    let hf = read_safetensors(dir)?;
    let (config, tensors) = match model_type {
        "gpt2" => gpt2(&json, hf).map_err(bad)?,
        "llama" => llama(&json, hf).map_err(bad)?,
        other => return Err(bad(format!("model_type {other:?} is not supported (gpt2 and llama are)"))),
    };
    config.validate().map_err(|e| bad(e.to_string()))?;
    Ok((config, tensors))
}

fn usize_of(json: &Value, key: &str) -> Result<usize, String> {
    json[key].as_u64().map(|v| v as usize).ok_or_else(|| format!("{key} is missing or not an integer"))
}

fn f64_of(json: &Value, key: &str, default: f64) -> f64 {
    json[key].as_f64().unwrap_or(default)
}

fn take(hf: &mut Tensors, name: &str) -> Result<TensorData, String> {
    hf.remove(name).ok_or_else(|| format!("tensor {name} is missing from the safetensors"))
}

/// [`take`], checked against the shape the config implies.
fn take_shaped(hf: &mut Tensors, name: &str, shape: &[usize]) -> Result<TensorData, String> {
    let data = take(hf, name)?;
    match data.shape().as_slice() == shape {
        true => Ok(data),
        false => Err(format!("tensor {name} has shape {:?}; the config needs {shape:?}", data.shape().as_slice())),
    }
}

/// Fails when tensors are left that the model does not use (a config of fewer layers than the weights, say), other
/// than those `ignored` names: buffers that are no parameters, or a head tied to the embedding, which Hugging Face
/// ignores as well.
fn refuse_unused(hf: Tensors, ignored: impl Fn(&str) -> bool) -> Result<(), String> {
    let mut unused: Vec<String> = hf.into_keys().filter(|k| !ignored(k)).collect();
    unused.sort();
    match unused.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "{} tensor(s) are not part of the model config.json describes: {}",
            unused.len(),
            unused.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
        )),
    }
}

/// GPT-2: Conv1D weights are already [in, out], as Burn's Linear.
fn gpt2(json: &Value, mut hf: Tensors) -> Result<(ModelConfig, Tensors), String> {
    let d = usize_of(json, "n_embd")?;
    let mut config = ModelConfig::gpt(
        usize_of(json, "vocab_size")?,
        usize_of(json, "n_layer")?,
        usize_of(json, "n_head")?,
        d,
        usize_of(json, "n_positions")?,
    );
    config.norm_eps = f64_of(json, "layer_norm_epsilon", 1e-5);
    config.d_ff = json["n_inner"].as_u64().map(|v| v as usize);
    config.ffn = match json["activation_function"].as_str().unwrap_or("gelu_new") {
        "gelu_new" | "gelu_pytorch_tanh" => FfnKind::GeluTanh,
        "gelu" => FfnKind::Gelu,
        "relu" => FfnKind::Relu,
        other => return Err(format!("activation_function {other:?} is not supported")),
    };
    // Checkpoints saved from GPT2LMHeadModel prefix "transformer."; those of GPT2Model do not.
    hf = hf.into_iter().map(|(k, v)| (k.strip_prefix("transformer.").unwrap_or(&k).to_string(), v)).collect();
    let mut out = Tensors::new();
    for name in ["wte.weight", "wpe.weight"] {
        out.insert(name.into(), take(&mut hf, name)?);
    }
    for i in 0..config.n_layers {
        for (part, ember) in [("ln_1", "ln_1"), ("ln_2", "ln_2")] {
            out.insert(format!("blocks.{i}.{ember}.gamma"), take(&mut hf, &format!("h.{i}.{part}.weight"))?);
            out.insert(format!("blocks.{i}.{ember}.beta"), take(&mut hf, &format!("h.{i}.{part}.bias"))?);
        }
        for part in ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"] {
            for kind in ["weight", "bias"] {
                out.insert(format!("blocks.{i}.{part}.{kind}"), take(&mut hf, &format!("h.{i}.{part}.{kind}"))?);
            }
        }
    }
    out.insert("ln_f.gamma".into(), take(&mut hf, "ln_f.weight")?);
    out.insert("ln_f.beta".into(), take(&mut hf, "ln_f.bias")?);
    // GPT-2's causal-mask buffers, and its output head, which is always the embedding.
    refuse_unused(hf, |k| k.ends_with(".attn.bias") || k.ends_with(".attn.masked_bias") || k == "lm_head.weight")?;
    Ok((config, out))
}

/// Llama: nn.Linear weights are [out, in] and are transposed; q, k, v are fused into `c_attn`.
fn llama(json: &Value, mut hf: Tensors) -> Result<(ModelConfig, Tensors), String> {
    let (d, h) = (usize_of(json, "hidden_size")?, usize_of(json, "num_attention_heads")?);
    if !json["rope_scaling"].is_null() {
        return Err(format!("rope_scaling {} is not supported", json["rope_scaling"]));
    }
    if let Some(kind) = json["rope_parameters"]["rope_type"].as_str().filter(|&k| k != "default") {
        return Err(format!("rope_type {kind:?} is not supported (default RoPE is)"));
    }
    let theta = json["rope_theta"].as_f64().or_else(|| json["rope_parameters"]["rope_theta"].as_f64());
    let qkv_bias = json["attention_bias"].as_bool().unwrap_or(false);
    let g = json["num_key_value_heads"].as_u64().map_or(h, |g| g as usize);
    let mut config = ModelConfig::gpt(
        usize_of(json, "vocab_size")?,
        usize_of(json, "num_hidden_layers")?,
        h,
        d,
        usize_of(json, "max_position_embeddings")?,
    )
    .llama_style(g);
    config.head_dim = json["head_dim"].as_u64().map(|dh| dh as usize).filter(|&dh| dh.checked_mul(h) != Some(d));
    config.bias = json["mlp_bias"].as_bool().unwrap_or(false);
    config.qkv_bias = Some(qkv_bias);
    config.norm_eps = f64_of(json, "rms_norm_eps", 1e-6);
    config.d_ff = Some(usize_of(json, "intermediate_size")?);
    config.rope_theta = theta.unwrap_or(10_000.0);
    config.tie_embeddings = json["tie_word_embeddings"].as_bool().unwrap_or(false);
    if config.bias {
        return Err("mlp_bias = true is not supported".into());
    }
    config.validate().map_err(|e| e.to_string())?;

    // Every tensor is checked against the shape the config implies before it is transposed or fused.
    let (v, f, dh, g) = (config.vocab(), config.ffn_dim(), config.head_dim(), config.kv_heads());
    let (Some(hd), Some(gd)) = (h.checked_mul(dh), g.checked_mul(dh)) else {
        return Err(format!("{h} heads of {dh} dimensions overflow"));
    };
    let mut out = Tensors::new();
    out.insert("wte.weight".into(), take_shaped(&mut hf, "model.embed_tokens.weight", &[v, d])?);
    let linear = |hf: &mut Tensors, name: &str, out_in: [usize; 2]| {
        take_shaped(hf, &format!("{name}.weight"), &out_in).map(|w| transpose(&w))
    };
    let projections = [("q_proj", hd), ("k_proj", gd), ("v_proj", gd)];
    for i in 0..config.n_layers {
        let l = format!("model.layers.{i}");
        let b = format!("blocks.{i}");
        out.insert(format!("{b}.ln_1.gamma"), take_shaped(&mut hf, &format!("{l}.input_layernorm.weight"), &[d])?);
        let post = format!("{l}.post_attention_layernorm.weight");
        out.insert(format!("{b}.ln_2.gamma"), take_shaped(&mut hf, &post, &[d])?);
        let qkv: Vec<TensorData> = projections
            .iter()
            .map(|&(p, rows)| take_shaped(&mut hf, &format!("{l}.self_attn.{p}.weight"), &[rows, d]))
            .collect::<Result<_, _>>()?;
        out.insert(format!("{b}.attn.c_attn.weight"), transpose(&concat_rows(&qkv)));
        if qkv_bias {
            let biases: Vec<TensorData> = projections
                .iter()
                .map(|&(p, rows)| take_shaped(&mut hf, &format!("{l}.self_attn.{p}.bias"), &[rows]))
                .collect::<Result<_, _>>()?;
            out.insert(format!("{b}.attn.c_attn.bias"), concat_rows(&biases));
        }
        out.insert(format!("{b}.attn.c_proj.weight"), linear(&mut hf, &format!("{l}.self_attn.o_proj"), [d, hd])?);
        out.insert(format!("{b}.mlp.c_gate.weight"), linear(&mut hf, &format!("{l}.mlp.gate_proj"), [f, d])?);
        out.insert(format!("{b}.mlp.c_fc.weight"), linear(&mut hf, &format!("{l}.mlp.up_proj"), [f, d])?);
        out.insert(format!("{b}.mlp.c_proj.weight"), linear(&mut hf, &format!("{l}.mlp.down_proj"), [d, f])?);
    }
    out.insert("ln_f.gamma".into(), take_shaped(&mut hf, "model.norm.weight", &[d])?);
    if !config.tie_embeddings {
        out.insert("lm_head.weight".into(), linear(&mut hf, "lm_head", [v, d])?);
    }
    // Rotary frequency buffers, and a head tied to the embedding (tie_word_embeddings), which transformers ignores.
    let tied = config.tie_embeddings;
    refuse_unused(hf, |k| k.ends_with("rotary_emb.inv_freq") || (tied && k == "lm_head.weight"))?;
    Ok((config, out))
}

/// Every tensor of `model.safetensors`, or of the shards `model.safetensors.index.json` lists, as f32.
fn read_safetensors(dir: &Path) -> Result<Tensors, ImportError> {
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<String> = if index.exists() {
        let bad = |reason: String| ImportError::new(&index, reason);
        let json: Value = serde_json::from_str(&files::read_to_string(&index).map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let map = json["weight_map"].as_object().ok_or_else(|| bad("no weight_map".into()))?;
        let mut files: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
        files.sort();
        files.dedup();
        // Shards are files of this directory: no absolute paths, no `..`.
        let inside = |file: &String| Path::new(file).components().all(|c| matches!(c, Component::Normal(_)));
        if let Some(outside) = files.iter().find(|file| !inside(file)) {
            return Err(bad(format!("shard {outside:?} is outside the model directory")));
        }
        files
    } else {
        vec!["model.safetensors".into()]
    };
    let mut tensors = Tensors::new();
    for file in files {
        let path = dir.join(file);
        let bad = |reason: String| ImportError::new(&path, reason);
        let bytes = files::read(&path).map_err(|e| bad(e.to_string()))?;
        let st =
            safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("not valid safetensors: {e}")))?;
        for (name, view) in st.tensors() {
            let raw = view.data();
            let values: Vec<f32> = match view.dtype() {
                Dtype::F32 => raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
                Dtype::F16 => raw.chunks_exact(2).map(|b| super::gguf::f16(u16::from_le_bytes([b[0], b[1]]))).collect(),
                Dtype::BF16 => raw
                    .chunks_exact(2)
                    .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                    .collect(),
                // Integer buffers (GPT-2's attention masks) are not parameters.
                _ => continue,
            };
            tensors.insert(name, TensorData::new(values, view.shape().to_vec()));
        }
    }
    Ok(tensors)
}
