//! DeepSeek-V2's multi-head latent attention under Ember's MLA names, from Hugging Face's layout (nn.Linear
//! [out, in]), which llama.cpp's GGUF keeps too once its split k_b / v_b are put back together: queries [h·(d_h +
//! d_R), ·] with each head's content rows then its RoPE rows, `kv_a_proj_with_mqa` [d_c + d_R, d] (the latent's rows,
//! then the shared RoPE key's), `kv_b_proj` [h·(d_h + d_v), d_c] (each head's key rows, then its value rows). The RoPE
//! rows rotate interleaved pairs (DeepSeek's complex form); Ember rotates halves, so they are reordered.

use burn::tensor::TensorData;

use super::{Tensors, select_rows, transpose};
use ember_formats::config::ModelConfig;

/// One layer's attention weights in Hugging Face's layout.
pub struct MlaWeights {
    /// `q_a_proj` [r_q, d] and `q_a_layernorm` [r_q], when queries pass through a bottleneck.
    pub q_a: Option<(TensorData, TensorData)>,
    /// `q_proj` or `q_b_proj` [h·(d_h + d_R), d or r_q].
    pub q: TensorData,
    /// `kv_a_proj_with_mqa` [d_c + d_R, d].
    pub kv_a: TensorData,
    /// `kv_a_layernorm` [d_c].
    pub kv_norm: TensorData,
    /// `kv_b_proj` [h·(d_h + d_h), d_c].
    pub kv_b: TensorData,
    /// `o_proj` [d, h·d_h].
    pub o: TensorData,
}

/// Entry i is the stored row of rotate-half row i for `heads` heads of width `dh` stored as interleaved pairs
/// [d_h/2, 2] (llama.cpp's order, and DeepSeek's): row (head, half, i) comes from row (head, i, half).
pub fn rotate_half_order(heads: usize, dh: usize) -> Vec<usize> {
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

/// Rows `from..from + n` of each of `heads` blocks of `stride` rows, with `order` (indices into the n) applied.
fn per_head(heads: usize, stride: usize, from: usize, order: &[usize]) -> Vec<usize> {
    (0..heads).flat_map(|j| order.iter().map(move |&r| j * stride + from + r)).collect()
}

/// Inserts layer `block`'s attention (`blocks.{i}.attn`) as Ember's MLA parameters, each checked against the
/// config's shapes: W_DQ and its norm, W_Q, W_QR, W_DKV, the latent norm, W_KR, U_K, U_V and W_O.
pub fn insert(config: &ModelConfig, block: &str, w: MlaWeights, out: &mut Tensors) -> Result<(), String> {
    let (d, h, dh) = (config.d_model, config.n_heads, config.head_dim());
    let (dc, dr) = (config.mla_latent_dim.unwrap_or(0), config.mla_rope_dim.unwrap_or(0));
    let dq = config.mla_q_rank.unwrap_or(d);
    let check = |name: &str, m: &TensorData, shape: &[usize]| match m.shape().as_slice() == shape {
        true => Ok(()),
        false => Err(format!("{block}: {name} has shape {:?}; the config needs {shape:?}", m.shape().as_slice())),
    };
    if let Some((q_a, q_norm)) = w.q_a {
        check("the query bottleneck", &q_a, &[dq, d])?;
        check("the query norm", &q_norm, &[dq])?;
        out.insert(format!("{block}.attn.w_dq.weight"), transpose(&q_a));
        out.insert(format!("{block}.attn.q_norm.gamma"), q_norm);
    }
    check("the query projection", &w.q, &[h * (dh + dr), dq])?;
    check("kv_a_proj_with_mqa", &w.kv_a, &[dc + dr, d])?;
    check("kv_a_layernorm", &w.kv_norm, &[dc])?;
    check("kv_b_proj", &w.kv_b, &[h * 2 * dh, dc])?;
    check("o_proj", &w.o, &[d, h * dh])?;
    let content: Vec<usize> = (0..dh).collect();
    let rope = rotate_half_order(1, dr);
    let rows = |m: &TensorData, rows: Vec<usize>| transpose(&select_rows(m, &rows));
    let attn = format!("{block}.attn");
    out.insert(format!("{attn}.w_q.weight"), rows(&w.q, per_head(h, dh + dr, 0, &content)));
    out.insert(format!("{attn}.w_qr.weight"), rows(&w.q, per_head(h, dh + dr, dh, &rope)));
    out.insert(format!("{attn}.w_dkv.weight"), rows(&w.kv_a, (0..dc).collect()));
    out.insert(format!("{attn}.w_kr.weight"), rows(&w.kv_a, per_head(1, dr, dc, &rope)));
    out.insert(format!("{attn}.c_norm.gamma"), w.kv_norm);
    out.insert(format!("{attn}.u_k.weight"), rows(&w.kv_b, per_head(h, 2 * dh, 0, &content)));
    out.insert(format!("{attn}.u_v.weight"), rows(&w.kv_b, per_head(h, 2 * dh, dh, &content)));
    out.insert(format!("{attn}.c_proj.weight"), transpose(&w.o));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotate_half_order_undoes_interleaving() {
        // One head of width 4: rotate-half rows (a0, a1, b0, b1) are stored interleaved as (a0, b0, a1, b1).
        assert_eq!(rotate_half_order(1, 4), [0, 2, 1, 3]);
        assert_eq!(rotate_half_order(2, 4), [0, 2, 1, 3, 4, 6, 5, 7]);
    }

    #[test]
    fn per_head_rows_take_each_heads_slice_in_order() {
        // Two heads of 5 rows (3 content, 2 rope): the rope rows swapped within each head.
        assert_eq!(per_head(2, 5, 3, &[1, 0]), [4, 3, 9, 8]);
        assert_eq!(per_head(2, 5, 0, &[0, 1, 2]), [0, 1, 2, 5, 6, 7]);
    }
}
