//! A model as a GGUF file llama.cpp runs: the llama, qwen2, qwen3, gemma2 and gemma3 architectures, the matrices in
//! their stored ggml blocks (or converted to the format asked for), q and k rows put back into llama.cpp's
//! interleaved order for llama, the tokenizer and chat template in `tokenizer.*` (copied from a GGUF source as they
//! are, else written from a byte-level BPE). The file is read back with the importer, which must find the same model.

use std::path::Path;

use ember_formats::config::{AttentionKind, ModelConfig, NormPlacement};
use ember_formats::ggml;
use ember_formats::gguf::writer::Writer;
use ember_formats::gguf::{Array, Gguf, Value};
use ember_formats::hf::written::{inference, same_model};
use ember_formats::packed::Packed;
use ember_formats::rope::{RopeScaling, yarn_magnitude};
use ember_formats::{chat::ChatFormat, files, tokenizer};
use tokenizers::Tokenizer;

use super::{ExportError, inverse, matrix, vector};
use crate::import::{self, Source, gguf_model, mla::rotate_half_order};
use crate::weights::{WeightFormat, Weights};

/// What was written: the architecture, the tensors and the file's bytes.
#[derive(Debug)]
pub struct Written {
    pub arch: &'static str,
    pub tensors: usize,
    pub bytes: u64,
}

/// Writes the model at `source` to the GGUF file `out`, its matrices as `format` asks (Native: as stored).
pub fn export(source: &Path, out: &Path, format: WeightFormat) -> Result<Written, ExportError> {
    let (config, weights, tokenizer, chat) =
        import::read(source).map_err(|e| ExportError::new(source, e.to_string()))?;
    let weights = weights.convert(format).map_err(|e| ExportError::new(source, e.to_string()))?;
    let bad = |reason: String| ExportError::new(out, reason);
    let arch = arch(&config).map_err(bad)?;
    let mut w = Writer::default();
    w.set("general.architecture", Value::Str(arch.into()));
    let name = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    w.set("general.name", Value::Str(name));
    hyper_parameters(&mut w, arch, &config).map_err(bad)?;
    match Source::of(source).map_err(|e| ExportError::new(source, e.to_string()))? {
        Source::Gguf => copy_tokenizer(&mut w, source)?,
        _ => write_tokenizer(&mut w, &tokenizer, &chat).map_err(bad)?,
    }
    let tensors = tensors(&mut w, arch, &config, &weights).map_err(bad)?;
    files::replace(out, |file| w.write_to(&mut std::io::BufWriter::new(file))).map_err(|e| bad(e.to_string()))?;
    // The file must describe the model it was written from.
    let read =
        gguf_model::load_config(out).map_err(|e| e.to_string()).and_then(|read| same_model(&stored(&config), &read));
    if let Err(reason) = read {
        let _ = std::fs::remove_file(out);
        return Err(bad(format!("written but not read back as the same model: {reason}")));
    }
    let bytes = std::fs::metadata(out).map_err(|e| bad(e.to_string()))?.len();
    Ok(Written { arch, tensors, bytes })
}

/// llama.cpp's architecture for `config`: Gemma 3 and 2 (sandwich norms, with and without q and k norms), Qwen3 (q
/// and k norms), Qwen2 (q, k, v biases), Llama otherwise.
fn arch(config: &ModelConfig) -> Result<&'static str, String> {
    if config.attention == AttentionKind::Mla {
        return Err("multi-head latent attention is not written to GGUF".into());
    }
    if config.norm != ember_formats::config::NormKind::RmsNorm {
        return Err("GPT-2's layout (LayerNorm, learned positions) is written to Hugging Face only (--to hf)".into());
    }
    Ok(match (config.norm_placement == NormPlacement::Sandwich, config.qk_norm, config.qkv_bias()) {
        (true, true, _) => "gemma3",
        (true, false, _) => "gemma2",
        (false, true, _) => "qwen3",
        (false, false, true) => "qwen2",
        (false, false, false) => "llama",
    })
}

/// `config` as the importer reads it back from a GGUF file: numbers at f32 precision, the feed-forward width and
/// head width as the file states them.
fn stored(config: &ModelConfig) -> ModelConfig {
    let f32 = |x: f64| x as f32 as f64;
    let c = inference(config);
    let (h, d) = (c.n_heads, c.d_model);
    ModelConfig {
        norm_eps: f32(c.norm_eps),
        rope_theta: f32(c.rope_theta),
        rope_local_theta: c.rope_local_theta.map(f32),
        attention_softcap: c.attention_softcap.map(f32),
        logit_softcap: c.logit_softcap.map(f32),
        d_ff: Some(c.ffn_dim()),
        head_dim: c.head_dim.filter(|&dh| dh.checked_mul(h) != Some(d)),
        qkv_bias: c.qkv_bias().then_some(true),
        rope_scaling: match c.rope_scaling {
            Some(RopeScaling::Linear { factor }) => Some(RopeScaling::Linear { factor: f32(factor) }),
            Some(RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor }) => {
                let default = attention_factor == yarn_magnitude(factor, 1.0);
                Some(RopeScaling::Yarn {
                    factor: f32(factor),
                    original_context,
                    beta_fast: f32(beta_fast),
                    beta_slow: f32(beta_slow),
                    attention_factor: if default { yarn_magnitude(f32(factor), 1.0) } else { f32(attention_factor) },
                })
            }
            Some(RopeScaling::Factors { factors }) => {
                Some(RopeScaling::Factors { factors: factors.into_iter().map(f32).collect() })
            }
            other => other,
        },
        ..c
    }
}

fn hyper_parameters(w: &mut Writer, arch: &str, c: &ModelConfig) -> Result<(), String> {
    let mut set = |key: &str, value: Value| w.set(&format!("{arch}.{key}"), value);
    let count = |n: usize| Value::Uint(n as u64);
    set("context_length", count(c.block_size));
    set("embedding_length", count(c.d_model));
    set("block_count", count(c.n_layers));
    set("feed_forward_length", count(c.ffn_dim()));
    set("attention.head_count", count(c.n_heads));
    set("attention.head_count_kv", count(c.kv_heads()));
    set("attention.key_length", count(c.head_dim()));
    set("attention.value_length", count(c.head_dim()));
    set("attention.layer_norm_rms_epsilon", Value::Float(c.norm_eps));
    set("rope.freq_base", Value::Float(c.rope_theta));
    set("rope.dimension_count", count(c.head_dim()));
    match &c.rope_scaling {
        None | Some(RopeScaling::Factors { .. }) => {}
        Some(RopeScaling::Linear { factor }) => {
            set("rope.scaling.type", Value::Str("linear".into()));
            set("rope.scaling.factor", Value::Float(*factor));
        }
        Some(RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor }) => {
            set("rope.scaling.type", Value::Str("yarn".into()));
            set("rope.scaling.factor", Value::Float(*factor));
            set("rope.scaling.original_context_length", count(*original_context));
            set("rope.scaling.yarn_beta_fast", Value::Float(*beta_fast));
            set("rope.scaling.yarn_beta_slow", Value::Float(*beta_slow));
            // YaRN's own magnitude is left to the reader, which computes it in f64.
            if *attention_factor != yarn_magnitude(*factor, 1.0) {
                set("rope.scaling.attn_factor", Value::Float(*attention_factor));
            }
        }
        Some(other) => {
            return Err(format!(
                "RoPE scaling {other:?} is not written to GGUF (linear, YaRN and per-frequency factors are)"
            ));
        }
    }
    if let Some(window) = c.window {
        set("attention.sliding_window", count(window));
    }
    if let Some(every) = c.global_every {
        set("attention.sliding_window_pattern", count(every));
    }
    if let Some(theta) = c.rope_local_theta {
        set("rope.freq_base_swa", Value::Float(theta));
    }
    if let Some(cap) = c.attention_softcap {
        set("attn_logit_softcapping", Value::Float(cap));
    }
    if let Some(cap) = c.logit_softcap {
        set("final_logit_softcapping", Value::Float(cap));
    }
    Ok(())
}

/// Every `tokenizer.*` key of the GGUF file `source`, as it is.
fn copy_tokenizer(w: &mut Writer, source: &Path) -> Result<(), ExportError> {
    let bad = |reason: String| ExportError::new(source, reason);
    let gguf = Gguf::parse(files::map(source).map_err(|e| bad(e.to_string()))?).map_err(|e| bad(e.to_string()))?;
    let mut keys: Vec<&String> = gguf.metadata.keys().filter(|k| k.starts_with("tokenizer.")).collect();
    keys.sort();
    for key in keys {
        w.set(key, gguf.metadata[key].clone());
    }
    Ok(())
}

/// A byte-level BPE as llama.cpp's "gpt2" tokenizer: tokens, merges, special tokens as control tokens (type 3), the
/// split by name, and the chat template with its BOS and EOS.
fn write_tokenizer(w: &mut Writer, tok: &Tokenizer, chat: &ChatFormat) -> Result<(), String> {
    let parts = tokenizer::bpe_parts(tok).map_err(|e| e.to_string())?;
    let strings = |v: &[String]| Value::Array(Array::Str(Box::new(v.iter().map(String::as_str).collect())));
    let types = (0..parts.tokens.len() as u32).map(|id| if parts.specials.contains(&id) { 3 } else { 1 });
    w.set("tokenizer.ggml.model", Value::Str("gpt2".into()));
    w.set("tokenizer.ggml.pre", Value::Str(parts.pre.into()));
    w.set("tokenizer.ggml.tokens", strings(&parts.tokens));
    w.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types.collect())));
    w.set("tokenizer.ggml.merges", strings(&parts.merges));
    for (key, token) in [("bos", &chat.bos_token), ("eos", &chat.eos_token)] {
        if let Some(id) = tok.token_to_id(token) {
            w.set(&format!("tokenizer.ggml.{key}_token_id"), Value::Uint(id.into()));
        }
    }
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
    if let Some(template) = &chat.template {
        w.set("tokenizer.chat_template", Value::Str(template.clone()));
    }
    Ok(())
}

/// A matrix of one format as the tensor `name`.
fn put(w: &mut Writer, name: &str, m: Packed) -> Result<(), String> {
    let [part] = m.parts[..] else { return Err(format!("{name} mixes formats ({})", m.describe())) };
    w.tensor(name, &[part.rows, m.cols], part.format, m.bytes);
    Ok(())
}

/// A vector (a gain, a bias) as the F32 tensor `name`.
fn put_vector(w: &mut Writer, name: &str, v: &[f32]) {
    let f32 = ggml::by_name("f32").expect("F32 is a ggml format");
    w.tensor(name, &[v.len()], f32, v.iter().flat_map(|x| x.to_le_bytes()).collect());
}

/// The model's tensors under llama.cpp's names; returns how many.
fn tensors(w: &mut Writer, arch: &str, c: &ModelConfig, weights: &Weights) -> Result<usize, String> {
    put(w, "token_embd.weight", matrix(weights, "wte.weight")?)?;
    let (h, g, dh) = (c.n_heads, c.kv_heads(), c.head_dim());
    let (hd, gd) = (h * dh, g * dh);
    for i in 0..c.n_layers {
        let (l, b) = (format!("blk.{i}"), format!("blocks.{i}"));
        let mut norms = vec![("attn_norm", "ln_1"), ("ffn_norm", "ln_2")];
        if c.norm_placement == NormPlacement::Sandwich {
            norms.extend([("post_attention_norm", "ln_1_out"), ("post_ffw_norm", "ln_2_out")]);
        }
        if c.qk_norm {
            norms.extend([("attn_q_norm", "attn.q_norm"), ("attn_k_norm", "attn.k_norm")]);
        }
        for (file, ember) in norms {
            put_vector(w, &format!("{l}.{file}.weight"), vector(weights, &format!("{b}.{ember}.gamma"))?);
        }
        let qkv = matrix(weights, &format!("{b}.attn.c_attn.weight"))?;
        let (mut q, mut k, v) = (qkv.row_range(0..hd), qkv.row_range(hd..hd + gd), qkv.row_range(hd + gd..hd + 2 * gd));
        if arch == "llama" {
            for (m, heads) in [(&mut q, h), (&mut k, g)] {
                if m.parts.len() != 1 {
                    return Err(format!("{b}.attn.c_attn.weight mixes formats within q or k ({})", m.describe()));
                }
                *m = m.reorder_rows(&inverse(&rotate_half_order(heads, dh)));
            }
        }
        for (part, m) in [("attn_q", q), ("attn_k", k), ("attn_v", v)] {
            put(w, &format!("{l}.{part}.weight"), m)?;
        }
        if c.qkv_bias() {
            let bias = vector(weights, &format!("{b}.attn.c_attn.bias"))?;
            for (part, range) in [("attn_q", 0..hd), ("attn_k", hd..hd + gd), ("attn_v", hd + gd..hd + 2 * gd)] {
                put_vector(w, &format!("{l}.{part}.bias"), &bias[range]);
            }
        }
        for (file, ember) in [
            ("attn_output", "attn.c_proj"),
            ("ffn_gate", "mlp.c_gate"),
            ("ffn_up", "mlp.c_fc"),
            ("ffn_down", "mlp.c_proj"),
        ] {
            put(w, &format!("{l}.{file}.weight"), matrix(weights, &format!("{b}.{ember}.weight"))?)?;
        }
    }
    put_vector(w, "output_norm.weight", vector(weights, "ln_f.gamma")?);
    if let Some(RopeScaling::Factors { factors }) = &c.rope_scaling {
        let factors: Vec<f32> = factors.iter().map(|&f| f as f32).collect();
        put_vector(w, "rope_freqs.weight", &factors);
    }
    if !c.tie_embeddings {
        put(w, "output.weight", matrix(weights, "lm_head.weight")?)?;
    }
    Ok(w.tensor_count())
}
