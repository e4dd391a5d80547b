//! A GGUF file of the llama architecture as an Ember model: hyper-parameters and tokenizer from the metadata, tensors
//! dequantized and renamed, and llama.cpp's interleaved q/k row order turned back into the rotate-half order.

use std::path::Path;

use burn::tensor::TensorData;
use ember_formats::chat::ChatFormat;
use tokenizers::Tokenizer;

use super::gguf::{Array, Gguf, Value};
use super::{ImportError, Tensors, concat_rows, transpose};
use crate::ModelConfig;
use crate::tokenizer;

/// Config, Ember-named tensors, tokenizer and chat format of a llama GGUF file.
pub fn load(path: &Path) -> Result<(ModelConfig, Tensors, Tokenizer, ChatFormat), ImportError> {
    let bad = |reason: String| ImportError::new(path, reason);
    let bytes = crate::files::read(path).map_err(|e| bad(e.to_string()))?;
    let gguf = Gguf::parse(bytes).map_err(|e| bad(e.to_string()))?;
    let config = config(&gguf).map_err(bad)?;
    let tensors = tensors(&gguf, &config).map_err(bad)?;
    let tokenizer = tokenizer(&gguf).map_err(bad)?;
    Ok((config, tensors, tokenizer, ChatFormat::from_gguf(&gguf)))
}

fn meta<'a>(gguf: &'a Gguf, key: &str) -> Result<&'a Value, String> {
    gguf.get(key).ok_or_else(|| format!("metadata {key} is missing"))
}

fn count(gguf: &Gguf, key: &str) -> Result<usize, String> {
    meta(gguf, key)?.as_u64().map(|v| v as usize).ok_or_else(|| format!("metadata {key} is not an integer"))
}

fn config(gguf: &Gguf) -> Result<ModelConfig, String> {
    let arch = meta(gguf, "general.architecture")?.as_str().unwrap_or_default();
    if arch != "llama" {
        return Err(format!("architecture {arch:?} is not supported (llama is)"));
    }
    let tokens = meta(gguf, "tokenizer.ggml.tokens")?.as_array().ok_or("tokenizer.ggml.tokens is not an array")?;
    let h = count(gguf, "llama.attention.head_count")?;
    let d = count(gguf, "llama.embedding_length")?;
    let g = count(gguf, "llama.attention.head_count_kv").unwrap_or(h);
    let mut config =
        ModelConfig::gpt(tokens.len(), count(gguf, "llama.block_count")?, h, d, count(gguf, "llama.context_length")?)
            .llama_style(g);
    config.head_dim = count(gguf, "llama.attention.key_length").ok().filter(|&dh| dh.checked_mul(h) != Some(d));
    config.norm_eps =
        meta(gguf, "llama.attention.layer_norm_rms_epsilon")?.as_f64().ok_or("rms epsilon is not a number")?;
    config.d_ff = Some(count(gguf, "llama.feed_forward_length")?);
    config.rope_theta = gguf.get("llama.rope.freq_base").and_then(Value::as_f64).unwrap_or(10_000.0);
    config.tie_embeddings = gguf.info("output.weight").is_none();
    config.validate().map_err(|e| e.to_string())?;
    if let Ok(rope_dim) = count(gguf, "llama.rope.dimension_count")
        && rope_dim != config.head_dim()
    {
        return Err(format!("partial rotary embeddings ({rope_dim} of {} dims) are not supported", config.head_dim()));
    }
    Ok(config)
}

/// The model's tensors, each checked against the shape the metadata implies before it is used; a tensor of the file
/// that the model does not use is an error (the metadata and the weights disagree), not a silent smaller model.
fn tensors(gguf: &Gguf, config: &ModelConfig) -> Result<Tensors, String> {
    let (d, v, f) = (config.d_model, config.vocab(), config.ffn_dim());
    let (h, g, dh) = (config.n_heads, config.kv_heads(), config.head_dim());
    let (Some(hd), Some(gd)) = (h.checked_mul(dh), g.checked_mul(dh)) else {
        return Err(format!("{h} heads of {dh} dimensions overflow"));
    };
    let used = std::cell::RefCell::new(std::collections::HashSet::new());
    let get = |name: &str, shape: &[usize]| -> Result<TensorData, String> {
        let info = gguf.info(name).ok_or_else(|| format!("no tensor named {name}"))?;
        if info.shape() != shape {
            return Err(format!("tensor {name} has shape {:?}; the metadata needs {shape:?}", info.shape()));
        }
        used.borrow_mut().insert(name.to_string());
        gguf.tensor(name).map(|(shape, values)| TensorData::new(values, shape)).map_err(|e| e.to_string())
    };
    let mut out = Tensors::new();
    out.insert("wte.weight".into(), get("token_embd.weight", &[v, d])?);
    for i in 0..config.n_layers {
        let (l, b) = (format!("blk.{i}"), format!("blocks.{i}"));
        out.insert(format!("{b}.ln_1.gamma"), get(&format!("{l}.attn_norm.weight"), &[d])?);
        out.insert(format!("{b}.ln_2.gamma"), get(&format!("{l}.ffn_norm.weight"), &[d])?);
        let q = unpermute(&get(&format!("{l}.attn_q.weight"), &[hd, d])?, h, dh);
        let k = unpermute(&get(&format!("{l}.attn_k.weight"), &[gd, d])?, g, dh);
        let v = get(&format!("{l}.attn_v.weight"), &[gd, d])?;
        out.insert(format!("{b}.attn.c_attn.weight"), transpose(&concat_rows(&[q, k, v])));
        for (part, ember, shape) in [
            ("attn_output", "attn.c_proj", [d, hd]),
            ("ffn_gate", "mlp.c_gate", [f, d]),
            ("ffn_up", "mlp.c_fc", [f, d]),
        ] {
            out.insert(format!("{b}.{ember}.weight"), transpose(&get(&format!("{l}.{part}.weight"), &shape)?));
        }
        out.insert(format!("{b}.mlp.c_proj.weight"), transpose(&get(&format!("{l}.ffn_down.weight"), &[d, f])?));
    }
    out.insert("ln_f.gamma".into(), get("output_norm.weight", &[d])?);
    if !config.tie_embeddings {
        out.insert("lm_head.weight".into(), transpose(&get("output.weight", &[v, d])?));
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

/// llama.cpp stores each head's q/k rows as [d_h/2, 2] (interleaved pairs); Hugging Face and Ember use [2, d_h/2]
/// (rotate-half). Row (head, i, half) moves to (head, half, i).
fn unpermute(w: &TensorData, heads: usize, dh: usize) -> TensorData {
    let cols = w.shape()[1];
    let v = w.as_slice::<f32>().expect("dequantized tensors are f32");
    let mut out = vec![0.0f32; v.len()];
    for head in 0..heads {
        for i in 0..dh / 2 {
            for half in 0..2 {
                let from = head * dh + i * 2 + half;
                let to = head * dh + half * dh / 2 + i;
                out[to * cols..(to + 1) * cols].copy_from_slice(&v[from * cols..(from + 1) * cols]);
            }
        }
    }
    TensorData::new(out, w.shape().to_vec())
}

/// The GPT-2 style byte-level BPE of `tokenizer.ggml.*`: tokens, merges, control tokens as special tokens.
fn tokenizer(gguf: &Gguf) -> Result<Tokenizer, String> {
    let model = meta(gguf, "tokenizer.ggml.model")?.as_str().unwrap_or_default();
    if model != "gpt2" {
        return Err(format!("tokenizer {model:?} is not supported (GPT-2 style byte-level BPE, \"gpt2\", is)"));
    }
    let strings = |key: &str| -> Result<Vec<String>, String> {
        let values = meta(gguf, key)?.as_array().ok_or_else(|| format!("{key} is not an array"))?;
        let strings = values.strings().ok_or_else(|| format!("{key} is not an array of strings"))?;
        Ok(strings.iter().map(String::from).collect())
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let types: Vec<i64> =
        gguf.get("tokenizer.ggml.token_type").and_then(Value::as_array).and_then(Array::integers).unwrap_or_default();
    // Token type 3 is "control" (<|im_start|>, <|endoftext|>, ...).
    let specials: Vec<u32> = types.iter().enumerate().filter(|&(_, &t)| t == 3).map(|(i, _)| i as u32).collect();
    let pre = gguf.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default");
    let digits = matches!(pre, "smollm" | "qwen2" | "llama3" | "deepseek-llm");
    tokenizer::from_bpe(&tokens, &merges, &specials, digits).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_undoes_llama_cpp_interleaving() {
        // One head of width 4, one column: HF rows (a0, a1, b0, b1) are stored by llama.cpp as (a0, b0, a1, b1).
        let stored = TensorData::new(vec![0.0f32, 2.0, 1.0, 3.0], [4, 1]);
        assert_eq!(unpermute(&stored, 1, 4).as_slice::<f32>().unwrap(), &[0.0, 1.0, 2.0, 3.0]);
    }
}
