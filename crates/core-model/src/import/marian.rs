//! MarianMT directories (`config.json` + `model.safetensors`, the OPUS-MT models) as Ember's encoder–decoder.
//!
//! Marian's sinusoidal table puts the sines of a position in the first half of each vector and the cosines in the
//! second; Ember's 2017 table interleaves them (sin at 2i, cos at 2i + 1). The two differ by a fixed permutation σ of
//! the model's width, σ(2i) = i, σ(2i + 1) = d/2 + i, and a Post-LN Transformer computes the same function with every
//! weight's width axis permuted alike (LayerNorm's mean and variance do not depend on the channels' order). So the
//! importer relabels the residual stream: embedding columns, the rows of every projection reading it, the rows and
//! biases of every projection writing to it, and LayerNorm's γ and β. Heads and the FFN's inner width are untouched.

use std::path::Path;

use burn::tensor::TensorData;
use ember_formats::{files, hf};

use super::hf::{read_safetensors, refuse_unused, take_shaped};
use super::{ImportError, Tensors, concat_rows, select_rows, transpose};
use crate::seq2seq::Seq2SeqConfig;

/// The encoder–decoder config, the Ember-named tensors and the token ids of a MarianMT directory.
pub fn load(dir: &Path) -> Result<(Seq2SeqConfig, Tensors, hf::Marian), ImportError> {
    let (config, marian) = config(dir)?;
    let bad = |reason: String| ImportError::new(&dir.join("config.json"), reason);
    let tensors = tensors(&config, read_safetensors(dir)?).map_err(bad)?;
    Ok((config, tensors, marian))
}

/// The encoder–decoder a MarianMT directory's `config.json` describes (nothing else is read).
pub fn config(dir: &Path) -> Result<(Seq2SeqConfig, hf::Marian), ImportError> {
    let config_path = dir.join("config.json");
    let bad = |reason: String| ImportError::new(&config_path, reason);
    let marian = hf::marian(&files::read_to_string(&config_path).map_err(|e| bad(e.to_string()))?).map_err(bad)?;
    let config = Seq2SeqConfig {
        model: marian.model.clone(),
        encoder_layers: marian.encoder_layers,
        decoder_layers: marian.decoder_layers,
        src_vocab: marian.src_vocab,
        tgt_vocab: marian.tgt_vocab,
        share_embeddings: marian.shared,
        logits_bias: true,
    };
    Ok((config, marian))
}

/// σ as a list: entry c is Marian's channel for Ember's channel c.
fn interleaving(d: usize) -> Vec<usize> {
    (0..d).map(|c| if c % 2 == 0 { c / 2 } else { d / 2 + c / 2 }).collect()
}

/// Marian's tensors under Ember's names, the width axis relabelled by σ.
fn tensors(config: &Seq2SeqConfig, mut hf: Tensors) -> Result<Tensors, String> {
    let (d, v, f) = (config.model.d_model, config.tgt_vocab, config.model.ffn_dim());
    let sigma = interleaving(d);
    let mut out = Tensors::new();
    // A projection reading the residual stream: [out, in] → [in, out] with its rows (the input channels) relabelled.
    let reads = |hf: &mut Tensors, names: &[&str], rows: usize| -> Result<TensorData, String> {
        let parts: Vec<TensorData> =
            names.iter().map(|n| take_shaped(hf, &format!("{n}.weight"), &[rows, d])).collect::<Result<_, _>>()?;
        Ok(select_rows(&transpose(&concat_rows(&parts)), &sigma))
    };
    let biases = |hf: &mut Tensors, names: &[&str], rows: usize| -> Result<TensorData, String> {
        let parts: Vec<TensorData> =
            names.iter().map(|n| take_shaped(hf, &format!("{n}.bias"), &[rows])).collect::<Result<_, _>>()?;
        Ok(concat_rows(&parts))
    };
    // A vector over the residual stream (a LayerNorm's γ or β, a bias written to it), relabelled.
    let relabel = |x: TensorData| -> TensorData {
        let x = x.as_slice::<f32>().expect("imported tensors are f32").to_vec();
        TensorData::new(sigma.iter().map(|&c| x[c]).collect::<Vec<f32>>(), [d])
    };
    // A projection writing to the residual stream: [d, in] → [in, d] with its columns relabelled, and its bias.
    let writes = |hf: &mut Tensors, name: &str, cols: usize, out: &mut Tensors, ember: &str| -> Result<(), String> {
        let w = take_shaped(hf, &format!("{name}.weight"), &[d, cols])?;
        out.insert(format!("{ember}.weight"), transpose(&select_rows(&w, &sigma)));
        out.insert(format!("{ember}.bias"), relabel(take_shaped(hf, &format!("{name}.bias"), &[d])?));
        Ok(())
    };
    let norm = |hf: &mut Tensors, name: &str, out: &mut Tensors, ember: &str| -> Result<(), String> {
        out.insert(format!("{ember}.gamma"), relabel(take_shaped(hf, &format!("{name}.weight"), &[d])?));
        out.insert(format!("{ember}.beta"), relabel(take_shaped(hf, &format!("{name}.bias"), &[d])?));
        Ok(())
    };
    // Embeddings [V, d] with their columns relabelled; an untied output head [V, d] reads the stream like W_Q.
    let columns = |m: TensorData| transpose(&select_rows(&transpose(&m), &sigma));
    let embeddings: &[(&str, &str, usize)] = match config.share_embeddings {
        true => &[("model.shared.weight", "src_emb.weight", v)],
        false => &[
            ("model.encoder.embed_tokens.weight", "src_emb.weight", config.src_vocab),
            ("model.decoder.embed_tokens.weight", "tgt_emb.weight", v),
        ],
    };
    for &(name, ember, rows) in embeddings {
        out.insert(ember.into(), columns(take_shaped(&mut hf, name, &[rows, d])?));
    }
    let tied = config.model.tie_embeddings;
    if !tied {
        out.insert(
            "out.weight".into(),
            select_rows(&transpose(&take_shaped(&mut hf, "lm_head.weight", &[v, d])?), &sigma),
        );
    }
    let bias = take_shaped(&mut hf, "final_logits_bias", &[1, v])?;
    out.insert("logits_bias".into(), TensorData::new(bias.try_to_vec::<f32>().map_err(|e| format!("{e:?}"))?, [v]));
    let stacks = [("encoder", config.encoder_layers), ("decoder", config.decoder_layers)];
    for (stack, layers) in stacks {
        for i in 0..layers {
            let (l, b) = (format!("model.{stack}.layers.{i}"), format!("{stack}.{i}"));
            let qkv = ["q_proj", "k_proj", "v_proj"].map(|p| format!("{l}.self_attn.{p}"));
            let qkv: Vec<&str> = qkv.iter().map(String::as_str).collect();
            out.insert(format!("{b}.self_attn.c_attn.weight"), reads(&mut hf, &qkv, d)?);
            out.insert(format!("{b}.self_attn.c_attn.bias"), biases(&mut hf, &qkv, d)?);
            writes(&mut hf, &format!("{l}.self_attn.out_proj"), d, &mut out, &format!("{b}.self_attn.c_proj"))?;
            norm(&mut hf, &format!("{l}.self_attn_layer_norm"), &mut out, &format!("{b}.ln_1"))?;
            // The decoder's cross-attention sits between its self-attention and its FFN (ln_2, ln_3 after it).
            let ffn_norm = match stack {
                "decoder" => {
                    let (q, k, v) = (
                        format!("{l}.encoder_attn.q_proj"),
                        format!("{l}.encoder_attn.k_proj"),
                        format!("{l}.encoder_attn.v_proj"),
                    );
                    out.insert(format!("{b}.cross.q_proj.weight"), reads(&mut hf, &[&q], d)?);
                    out.insert(format!("{b}.cross.q_proj.bias"), biases(&mut hf, &[&q], d)?);
                    out.insert(format!("{b}.cross.kv_proj.weight"), reads(&mut hf, &[&k, &v], d)?);
                    out.insert(format!("{b}.cross.kv_proj.bias"), biases(&mut hf, &[&k, &v], d)?);
                    writes(&mut hf, &format!("{l}.encoder_attn.out_proj"), d, &mut out, &format!("{b}.cross.c_proj"))?;
                    norm(&mut hf, &format!("{l}.encoder_attn_layer_norm"), &mut out, &format!("{b}.ln_2"))?;
                    "ln_3"
                }
                _ => "ln_2",
            };
            let fc1 = format!("{l}.fc1");
            out.insert(format!("{b}.mlp.c_fc.weight"), reads(&mut hf, &[&fc1], f)?);
            out.insert(format!("{b}.mlp.c_fc.bias"), biases(&mut hf, &[&fc1], f)?);
            writes(&mut hf, &format!("{l}.fc2"), f, &mut out, &format!("{b}.mlp.c_proj"))?;
            norm(&mut hf, &format!("{l}.final_layer_norm"), &mut out, &format!("{b}.{ffn_norm}"))?;
        }
    }
    // The sinusoidal tables (when saved), the encoder's and decoder's views of a shared embedding, and a tied head.
    let shared = config.share_embeddings;
    refuse_unused(hf, |k| {
        k.ends_with("embed_positions.weight")
            || (shared && matches!(k, "model.encoder.embed_tokens.weight" | "model.decoder.embed_tokens.weight"))
            || (tied && k == "lm_head.weight")
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_puts_each_sine_beside_its_cosine() {
        // Marian [s0 s1 s2 | c0 c1 c2] read in Ember's order [s0 c0 s1 c1 s2 c2].
        assert_eq!(interleaving(6), [0, 3, 1, 4, 2, 5]);
    }
}
