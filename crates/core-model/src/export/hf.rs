//! A model as a Hugging Face directory transformers loads: `config.json` ([`config_json`]), `model.safetensors` in f32
//! under transformers' names (GPT-2's Conv1D weights [in, out] as Ember keeps them, the Llama family's nn.Linear
//! weights [out, in], q, k and v split, Gemma's gains stored as γ − 1), `tokenizer.json`, and `tokenizer_config.json`
//! with the chat template. The directory is read back with the importer, which must find the same config.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::TensorData;
use ember_formats::config::{ModelConfig, NormPlacement};
use ember_formats::hf::Family;
use ember_formats::hf::written::config_json;
use ember_formats::tokenizer;

use super::{ExportError, matrix, vector};
use crate::bundle::{self, save_tensors, write_atomic};
use crate::import::{
    self,
    hf::{GEMMA_NORMS, LLAMA_NORMS},
};
use crate::weights::{WeightFormat, Weights};

/// Writes the model at `source` as a Hugging Face directory `out`; returns its `model_type`.
pub fn export(source: &Path, out: &Path) -> Result<String, ExportError> {
    let (config, weights, tokenizer, chat) =
        import::read(source).map_err(|e| ExportError::new(source, e.to_string()))?;
    let weights = weights.convert(WeightFormat::F32).map_err(|e| ExportError::new(source, e.to_string()))?;
    let bad = |reason: String| ExportError::new(out, reason);
    let (family, text) = config_json(&config).map_err(bad)?;
    let tensors = match family {
        Family::Gpt2 => gpt2(&config, &weights),
        _ => llama(&config, &weights),
    }
    .map_err(bad)?;
    std::fs::create_dir_all(out).map_err(|e| bad(e.to_string()))?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    save_tensors(&out.join("model.safetensors"), &tensors, metadata).map_err(|e| bad(e.to_string()))?;
    let tok_path = out.join(bundle::TOKENIZER);
    tokenizer::save(&tokenizer, &tok_path).map_err(|e| bad(e.to_string()))?;
    bundle::write_chat(out, &chat, config.block_size).map_err(|e| bad(e.to_string()))?;
    write_atomic(&out.join("config.json"), text.as_bytes()).map_err(|e| bad(e.to_string()))?;
    let model_type = serde_json::from_str::<serde_json::Value>(&text).ok();
    Ok(model_type.and_then(|j| j["model_type"].as_str().map(String::from)).unwrap_or_default())
}

type Named = Vec<(String, TensorData)>;

fn dense(weights: &Weights, path: &str) -> Result<TensorData, String> {
    weights.dense.get(path).cloned().ok_or_else(|| format!("the model has no tensor {path}"))
}

/// The tensor at `path`, or zeros of `shape` where the model has none (a GPT-2 trained without biases).
fn or_zeros(weights: &Weights, path: &str, shape: usize) -> TensorData {
    weights.dense.get(path).cloned().unwrap_or_else(|| TensorData::new(vec![0.0f32; shape], [shape]))
}

/// GPT-2 as `GPT2LMHeadModel` saves it: Conv1D weights [in, out] under `transformer.`, biases zero where the model
/// has none.
fn gpt2(c: &ModelConfig, weights: &Weights) -> Result<Named, String> {
    let (d, f) = (c.d_model, c.ffn_dim());
    let mut out: Named = vec![
        ("transformer.wte.weight".into(), dense(weights, "wte.weight")?),
        ("transformer.wpe.weight".into(), dense(weights, "wpe.weight")?),
    ];
    for i in 0..c.n_layers {
        let (h, b) = (format!("transformer.h.{i}"), format!("blocks.{i}"));
        for norm in ["ln_1", "ln_2"] {
            out.push((format!("{h}.{norm}.weight"), dense(weights, &format!("{b}.{norm}.gamma"))?));
            out.push((format!("{h}.{norm}.bias"), or_zeros(weights, &format!("{b}.{norm}.beta"), d)));
        }
        for (part, width) in [("attn.c_attn", 3 * d), ("attn.c_proj", d), ("mlp.c_fc", f), ("mlp.c_proj", d)] {
            out.push((format!("{h}.{part}.weight"), dense(weights, &format!("{b}.{part}.weight"))?));
            out.push((format!("{h}.{part}.bias"), or_zeros(weights, &format!("{b}.{part}.bias"), width)));
        }
    }
    out.push(("transformer.ln_f.weight".into(), dense(weights, "ln_f.gamma")?));
    out.push(("transformer.ln_f.bias".into(), or_zeros(weights, "ln_f.beta", d)));
    Ok(out)
}

/// A matrix with rows as outputs, as nn.Linear keeps it.
fn linear(weights: &Weights, path: &str) -> Result<TensorData, String> {
    let m = matrix(weights, path)?;
    Ok(TensorData::new(m.dequantize(), [m.rows(), m.cols]))
}

/// The Llama family under transformers' names; Gemma's norms as γ − 1 (its RMSNorm multiplies by 1 + w).
fn llama(c: &ModelConfig, weights: &Weights) -> Result<Named, String> {
    let sandwich = c.norm_placement == NormPlacement::Sandwich;
    let gain = |path: &str| -> Result<TensorData, String> {
        let v = vector(weights, path)?;
        let shift = if sandwich { 1.0 } else { 0.0 };
        Ok(TensorData::new(v.iter().map(|g| g - shift).collect::<Vec<f32>>(), [v.len()]))
    };
    let (h, g, dh) = (c.n_heads, c.kv_heads(), c.head_dim());
    let (hd, gd) = (h * dh, g * dh);
    let mut out: Named = vec![("model.embed_tokens.weight".into(), linear(weights, "wte.weight")?)];
    for i in 0..c.n_layers {
        let (l, b) = (format!("model.layers.{i}"), format!("blocks.{i}"));
        let norms: &[(&str, &str)] = if sandwich { &GEMMA_NORMS } else { &LLAMA_NORMS };
        for (name, ember) in norms {
            out.push((format!("{l}.{name}.weight"), gain(&format!("{b}.{ember}.gamma"))?));
        }
        let qkv = matrix(weights, &format!("{b}.attn.c_attn.weight"))?;
        let parts = [("q_proj", 0..hd), ("k_proj", hd..hd + gd), ("v_proj", hd + gd..hd + 2 * gd)];
        for (name, rows) in parts.clone() {
            let part = qkv.row_range(rows);
            out.push((
                format!("{l}.self_attn.{name}.weight"),
                TensorData::new(part.dequantize(), [part.rows(), part.cols]),
            ));
        }
        if c.qkv_bias() {
            let bias = vector(weights, &format!("{b}.attn.c_attn.bias"))?;
            for (name, rows) in parts {
                let n = rows.len();
                out.push((format!("{l}.self_attn.{name}.bias"), TensorData::new(bias[rows].to_vec(), [n])));
            }
        }
        if c.qk_norm {
            for norm in ["q_norm", "k_norm"] {
                out.push((format!("{l}.self_attn.{norm}.weight"), gain(&format!("{b}.attn.{norm}.gamma"))?));
            }
        }
        out.push((format!("{l}.self_attn.o_proj.weight"), linear(weights, &format!("{b}.attn.c_proj.weight"))?));
        for (name, ember) in [("gate_proj", "c_gate"), ("up_proj", "c_fc"), ("down_proj", "c_proj")] {
            out.push((format!("{l}.mlp.{name}.weight"), linear(weights, &format!("{b}.mlp.{ember}.weight"))?));
        }
    }
    out.push(("model.norm.weight".into(), gain("ln_f.gamma")?));
    if !c.tie_embeddings {
        out.push(("lm_head.weight".into(), linear(weights, "lm_head.weight")?));
    }
    Ok(out)
}
