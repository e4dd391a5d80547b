//! A GGUF file of the llama architecture as an Ember model: hyper-parameters and tokenizer from the metadata, matrices
//! kept in their blocks and renamed (q, k and v stacked into one projection), and llama.cpp's interleaved q/k row
//! order turned back into the rotate-half order.

use std::path::Path;

use burn::tensor::TensorData;
use ember_formats::chat::ChatFormat;
use tokenizers::Tokenizer;

use super::ImportError;
use super::gguf::{Array, Gguf, Value};
use crate::ModelConfig;
use crate::tokenizer;
use crate::weights::Weights;
use ember_formats::packed::Packed;

/// Config, Ember-named weights, tokenizer and chat format of a llama GGUF file.
pub fn load(path: &Path) -> Result<(ModelConfig, Weights, Tokenizer, ChatFormat), ImportError> {
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
fn tensors(gguf: &Gguf, config: &ModelConfig) -> Result<Weights, String> {
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
        let q = matrix(&format!("{l}.attn_q.weight"), [hd, d])?.reorder_rows(&rotate_half_order(h, dh));
        let k = matrix(&format!("{l}.attn_k.weight"), [gd, d])?.reorder_rows(&rotate_half_order(g, dh));
        let v = matrix(&format!("{l}.attn_v.weight"), [gd, d])?;
        let qkv = Packed::stack(vec![q, k, v]).map_err(|e| e.to_string())?;
        out.packed.insert(format!("{b}.attn.c_attn.weight"), qkv);
        for (part, ember, shape) in [
            ("attn_output", "attn.c_proj", [d, hd]),
            ("ffn_gate", "mlp.c_gate", [f, d]),
            ("ffn_up", "mlp.c_fc", [f, d]),
            ("ffn_down", "mlp.c_proj", [d, f]),
        ] {
            out.packed.insert(format!("{b}.{ember}.weight"), matrix(&format!("{l}.{part}.weight"), shape)?);
        }
    }
    out.dense.insert("ln_f.gamma".into(), get("output_norm.weight", &[d])?);
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

/// llama.cpp stores each head's q/k rows as [d_h/2, 2] (interleaved pairs); Hugging Face and Ember use [2, d_h/2]
/// (rotate-half): row (head, half, i) comes from row (head, i, half). Entry `to` is the stored row it comes from.
fn rotate_half_order(heads: usize, dh: usize) -> Vec<usize> {
    let mut order = vec![0; heads * dh];
    for head in 0..heads {
        for i in 0..dh / 2 {
            for half in 0..2 {
                order[head * dh + half * dh / 2 + i] = head * dh + i * 2 + half;
            }
        }
    }
    order
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
    fn rotate_half_order_undoes_llama_cpp_interleaving() {
        // One head of width 4: HF rows (a0, a1, b0, b1) are stored by llama.cpp as (a0, b0, a1, b1).
        assert_eq!(rotate_half_order(1, 4), [0, 2, 1, 3]);
        assert_eq!(rotate_half_order(2, 4), [0, 2, 1, 3, 4, 6, 5, 7]);
    }
}
