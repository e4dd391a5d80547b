//! Hugging Face model directories: `config.json` + `model.safetensors` (or sharded with an index) for
//! `GPT2LMHeadModel` and `LlamaForCausalLM`, mapped onto Ember's parameter names.

use std::path::Path;

use burn::tensor::TensorData;
use ember_formats::hf::{self, Family};
use ember_formats::safetensors;

use super::mla::{self, MlaWeights};
use super::{ImportError, Tensors, concat_rows, transpose};
use ember_formats::config::{AttentionKind, ModelConfig};
use ember_formats::files;

/// The model config and Ember-named tensors of a Hugging Face directory.
pub fn load(dir: &Path) -> Result<(ModelConfig, Tensors), ImportError> {
    let config_path = dir.join("config.json");
    let bad = |reason: String| ImportError::new(&config_path, reason);
    let text = files::read_to_string(&config_path).map_err(|e| bad(e.to_string()))?;
    let (family, config) = hf::config(&text).map_err(bad)?;
    let tensors = read_safetensors(dir)?;
    let tensors = match family {
        Family::Gpt2 => gpt2(&config, tensors).map_err(bad)?,
        Family::Llama => llama(&config, tensors, &LLAMA_NORMS).map_err(bad)?,
        Family::Phi3 => llama(&config, unfuse_phi3(&config, tensors).map_err(bad)?, &LLAMA_NORMS).map_err(bad)?,
        Family::Gemma => llama(&config, gemma_gains(tensors).map_err(bad)?, &GEMMA_NORMS).map_err(bad)?,
        Family::DeepseekV2 => llama(&config, tensors, &LLAMA_NORMS).map_err(bad)?,
    };
    Ok((config, tensors))
}

pub(super) fn take(hf: &mut Tensors, name: &str) -> Result<TensorData, String> {
    hf.remove(name).ok_or_else(|| format!("tensor {name} is missing from the safetensors"))
}

/// [`take`], checked against the shape the config implies.
pub(super) fn take_shaped(hf: &mut Tensors, name: &str, shape: &[usize]) -> Result<TensorData, String> {
    let data = take(hf, name)?;
    match data.shape().as_slice() == shape {
        true => Ok(data),
        false => Err(format!("tensor {name} has shape {:?}; the config needs {shape:?}", data.shape().as_slice())),
    }
}

/// Fails when tensors are left that the model does not use (a config of fewer layers than the weights, say), other
/// than those `ignored` names: buffers that are no parameters, or a head tied to the embedding, which Hugging Face
/// ignores as well.
pub(super) fn refuse_unused(hf: Tensors, ignored: impl Fn(&str) -> bool) -> Result<(), String> {
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
fn gpt2(config: &ModelConfig, mut hf: Tensors) -> Result<Tensors, String> {
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
    refuse_unused(hf, |k| is_mask(k) || k == "lm_head.weight")?;
    Ok(out)
}

/// Each layer's norms, Hugging Face's name and Ember's: Llama's before attention and before the MLP, Gemma 2's after
/// each too (its `post_attention_layernorm` is the attention's output norm, not the MLP's input norm).
pub(crate) const LLAMA_NORMS: [(&str, &str); 2] = [("input_layernorm", "ln_1"), ("post_attention_layernorm", "ln_2")];
pub(crate) const GEMMA_NORMS: [(&str, &str); 4] = [
    ("input_layernorm", "ln_1"),
    ("post_attention_layernorm", "ln_1_out"),
    ("pre_feedforward_layernorm", "ln_2"),
    ("post_feedforward_layernorm", "ln_2_out"),
];

/// Gemma's RMSNorm multiplies by 1 + w: every norm weight w becomes Ember's gain γ = 1 + w.
fn gemma_gains(mut hf: Tensors) -> Result<Tensors, String> {
    for (name, data) in hf.iter_mut().filter(|(name, _)| name.ends_with("norm.weight")) {
        data.as_mut_slice::<f32>().map_err(|e| format!("{name}: {e:?}"))?.iter_mut().for_each(|w| *w += 1.0);
    }
    Ok(hf)
}

/// Llama (and Qwen2, Qwen3, Mistral, Gemma 2, DeepSeek-V2): nn.Linear weights are [out, in] and are transposed; each
/// layer's `norms` as they name them, its attention ([`self_attention`] or [`latent_attention`]) and SwiGLU / GeGLU.
fn llama(config: &ModelConfig, mut hf: Tensors, norms: &[(&str, &str)]) -> Result<Tensors, String> {
    let (d, v, f) = (config.d_model, config.vocab(), config.ffn_dim());
    let mut out = Tensors::new();
    out.insert("wte.weight".into(), take_shaped(&mut hf, "model.embed_tokens.weight", &[v, d])?);
    for i in 0..config.n_layers {
        let l = format!("model.layers.{i}");
        let b = format!("blocks.{i}");
        for (norm, ember) in norms {
            out.insert(format!("{b}.{ember}.gamma"), take_shaped(&mut hf, &format!("{l}.{norm}.weight"), &[d])?);
        }
        match config.attention {
            AttentionKind::Mha => self_attention(config, &mut hf, &l, &b, &mut out)?,
            AttentionKind::Mla => latent_attention(config, &mut hf, &l, &b, &mut out)?,
        }
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
    Ok(out)
}

/// nn.Linear `name`'s weight [out, in], checked and transposed to [in, out].
fn linear(hf: &mut Tensors, name: &str, out_in: [usize; 2]) -> Result<TensorData, String> {
    take_shaped(hf, &format!("{name}.weight"), &out_in).map(|w| transpose(&w))
}

/// Layer `l`'s q, k, v (and their biases where the config has them) fused into `c_attn`, Qwen3's per-head q and k
/// norms as they are, and o_proj.
fn self_attention(config: &ModelConfig, hf: &mut Tensors, l: &str, b: &str, out: &mut Tensors) -> Result<(), String> {
    let (d, h, dh, g) = (config.d_model, config.n_heads, config.head_dim(), config.kv_heads());
    let (Some(hd), Some(gd)) = (h.checked_mul(dh), g.checked_mul(dh)) else {
        return Err(format!("{h} heads of {dh} dimensions overflow"));
    };
    let projections = [("q_proj", hd), ("k_proj", gd), ("v_proj", gd)];
    let qkv: Vec<TensorData> = projections
        .iter()
        .map(|&(p, rows)| take_shaped(hf, &format!("{l}.self_attn.{p}.weight"), &[rows, d]))
        .collect::<Result<_, _>>()?;
    out.insert(format!("{b}.attn.c_attn.weight"), transpose(&concat_rows(&qkv)));
    if config.qkv_bias.unwrap_or(false) {
        let biases: Vec<TensorData> = projections
            .iter()
            .map(|&(p, rows)| take_shaped(hf, &format!("{l}.self_attn.{p}.bias"), &[rows]))
            .collect::<Result<_, _>>()?;
        out.insert(format!("{b}.attn.c_attn.bias"), concat_rows(&biases));
    }
    if config.qk_norm {
        for part in ["q_norm", "k_norm"] {
            out.insert(
                format!("{b}.attn.{part}.gamma"),
                take_shaped(hf, &format!("{l}.self_attn.{part}.weight"), &[dh])?,
            );
        }
    }
    out.insert(format!("{b}.attn.c_proj.weight"), linear(hf, &format!("{l}.self_attn.o_proj"), [d, hd])?);
    Ok(())
}

/// Layer `l`'s DeepSeek-V2 attention as Ember's MLA ([`mla::insert`]).
fn latent_attention(config: &ModelConfig, hf: &mut Tensors, l: &str, b: &str, out: &mut Tensors) -> Result<(), String> {
    let mut weight = |name: &str| take(hf, &format!("{l}.self_attn.{name}.weight"));
    let (q_a, q) = match config.mla_q_rank {
        Some(_) => (Some((weight("q_a_proj")?, weight("q_a_layernorm")?)), weight("q_b_proj")?),
        None => (None, weight("q_proj")?),
    };
    let (kv_a, kv_norm, kv_b, o) =
        (weight("kv_a_proj_with_mqa")?, weight("kv_a_layernorm")?, weight("kv_b_proj")?, weight("o_proj")?);
    mla::insert(config, b, MlaWeights { q_a, q, kv_a, kv_norm, kv_b, o }, out)
}

/// Phi-3's fused projections under Llama's names: `qkv_proj` [(h + 2g)·d_h, d] as q_proj, k_proj and v_proj, and
/// `gate_up_proj` [2f, d] as gate_proj and up_proj (gate first, as transformers' `chunk(2)` reads it).
fn unfuse_phi3(config: &ModelConfig, mut hf: Tensors) -> Result<Tensors, String> {
    let (d, f, dh) = (config.d_model, config.ffn_dim(), config.head_dim());
    let (hd, gd) = (config.n_heads * dh, config.kv_heads() * dh);
    for i in 0..config.n_layers {
        let l = format!("model.layers.{i}");
        for (fused, parts) in [
            ("self_attn.qkv_proj", vec![("self_attn.q_proj", hd), ("self_attn.k_proj", gd), ("self_attn.v_proj", gd)]),
            ("mlp.gate_up_proj", vec![("mlp.gate_proj", f), ("mlp.up_proj", f)]),
        ] {
            let rows: usize = parts.iter().map(|p| p.1).sum();
            let values = take_shaped(&mut hf, &format!("{l}.{fused}.weight"), &[rows, d])?.try_to_vec::<f32>();
            let mut values = values.map_err(|e| format!("{l}.{fused}.weight: {e:?}"))?.into_iter();
            for (name, n) in parts {
                let part: Vec<f32> = values.by_ref().take(n * d).collect();
                hf.insert(format!("{l}.{name}.weight"), TensorData::new(part, [n, d]));
            }
        }
    }
    Ok(hf)
}

/// GPT-2's causal-mask buffers (booleans or integers in some checkpoints), which are no parameters.
fn is_mask(name: &str) -> bool {
    name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
}

/// Every tensor of `model.safetensors`, or of the shards `model.safetensors.index.json` lists, as f32. A tensor
/// stored as integers is an error naming its dtype, except GPT-2's mask buffers.
pub(super) fn read_safetensors(dir: &Path) -> Result<Tensors, ImportError> {
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<String> = if index.exists() {
        let bad = |reason: String| ImportError::new(&index, reason);
        hf::shards(&files::read_to_string(&index).map_err(|e| bad(e.to_string()))?).map_err(bad)?
    } else {
        vec!["model.safetensors".into()]
    };
    let mut tensors = Tensors::new();
    for file in files {
        let path = dir.join(file);
        let bad = |reason: String| ImportError::new(&path, reason);
        let bytes = files::map(&path).map_err(|e| bad(e.to_string()))?;
        let (read, _) = safetensors::read(&bytes, is_mask).map_err(|e| bad(format!("not valid safetensors: {e}")))?;
        for t in read {
            tensors.insert(t.name, TensorData::new(t.values, t.shape));
        }
    }
    Ok(tensors)
}
