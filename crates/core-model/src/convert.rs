//! MHA / GQA → MLA conversion (the TransMLA route). Per layer, the key and value projections [W_K | W_V] — biases
//! as one more input row — are factored by truncated SVD into a shared latent W_DKV (d → d_L) and per-head
//! up-projections U_K, U_V, so that K = c U_K and V = c U_V with c = x W_DKV + b_DKV. RoPE models keep d_R/2 of each
//! head's frequency pairs (every (d_h/d_R)-th, the frequencies MLA's d_R-wide rotation has) as the decoupled RoPE
//! key: a pair of the g KV heads, seen as complex columns w_g, is fitted as w·c̄_g (a complex rank-1 fit, exact for
//! MQA), and since multiplying by c_g commutes with every rotation, each query head absorbs its group's c_g. The other
//! pairs become content dimensions without rotation. Queries are scaled by √((d_h + d_R)/d_h), as MLA's scores are
//! divided by √(d_h + d_R). Without RoPE and at full rank (d_L = rank of [W_K | W_V; b_K | b_V]) the converted model
//! computes the original's logits.

use std::collections::HashMap;

use crate::linalg::{low_rank, symmetric_eigen};
use burn::tensor::TensorData;

use crate::causal_lm::CausalLm;
use crate::init::Build;
use crate::params::{Mismatch, state_dict};
use ember_formats::config::ModelConfig;
use ember_formats::config::{AttentionKind, PositionKind};

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("the model's attention is already MLA")]
    AlreadyMla,
    #[error("--latent-dim {latent}: at least 1 and at most {rank}, the rank of a layer's [W_K | W_V] (and biases)")]
    Latent { latent: usize, rank: usize },
    #[error("--rope-dim {rope}: an even number from 2 to d_h = {head_dim} that divides it")]
    Rope { rope: usize, head_dim: usize },
    #[error(transparent)]
    Invalid(#[from] ember_formats::config::Invalid),
    #[error("the converted weights do not fit the MLA model: {0}")]
    Mismatch(Mismatch),
}

/// Not `#[from]`: the message holds the mismatch, which a chained report would print again as the source.
impl From<Mismatch> for ConvertError {
    fn from(mismatch: Mismatch) -> Self {
        Self::Mismatch(mismatch)
    }
}

/// The decoupled RoPE width a conversion uses unless told: d_h/2 for RoPE models (every other frequency pair keeps
/// its rotation), 2 (rotating nothing the original had) otherwise.
pub fn default_rope_dim(config: &ModelConfig) -> usize {
    if config.positions == PositionKind::Rope { config.head_dim() / 2 } else { 2 }
}

/// The largest latent width a conversion of `config` can use: the rank bound of one layer's factored matrix.
pub fn max_latent(config: &ModelConfig, rope: usize) -> usize {
    let (g, dh) = (config.kv_heads(), config.head_dim());
    let rows = config.d_model + usize::from(config.qkv_bias());
    let kept = if config.positions == PositionKind::Rope { rope } else { 0 };
    rows.min(g * (dh - kept) + g * dh)
}

/// `model` with every attention layer converted to MLA of latent width `latent` and decoupled RoPE width `rope`.
pub fn to_mla(model: &CausalLm, latent: usize, rope: usize) -> Result<CausalLm, ConvertError> {
    let config = model.config();
    if config.attention == AttentionKind::Mla {
        return Err(ConvertError::AlreadyMla);
    }
    let dh = config.head_dim();
    if rope < 2 || !rope.is_multiple_of(2) || rope > dh || !dh.is_multiple_of(rope) {
        return Err(ConvertError::Rope { rope, head_dim: dh });
    }
    let rank = max_latent(config, rope);
    if latent == 0 || latent > rank {
        return Err(ConvertError::Latent { latent, rank });
    }
    let mla = ModelConfig { n_kv_heads: None, ..config.clone().mla_style(latent, rope) };
    let mla = ModelConfig { positions: config.positions, ..mla };
    mla.validate()?;
    let mut tensors: HashMap<String, TensorData> = state_dict(model).into_iter().collect();
    for layer in 0..config.n_layers {
        let prefix = format!("blocks.{layer}.attn");
        let weight = tensors.remove(&format!("{prefix}.c_attn.weight")).expect("an MHA layer has c_attn");
        let bias = tensors.remove(&format!("{prefix}.c_attn.bias"));
        let fused = Fused::new(config, &weight, bias.as_ref());
        for (name, data) in fused.convert(latent, rope, config.positions == PositionKind::Rope) {
            tensors.insert(format!("{prefix}.{name}"), data);
        }
    }
    Ok(CausalLm::load(&mla, &tensors, &model.wte.device())?)
}

/// One layer's fused projection [W_Q | W_K | W_V] with its bias as row d (when it has one), in f64.
struct Fused {
    /// rows × width, row-major.
    w: Vec<f64>,
    rows: usize,
    d: usize,
    width: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Fused {
    fn new(config: &ModelConfig, weight: &TensorData, bias: Option<&TensorData>) -> Self {
        let values = |t: &TensorData| t.clone().convert::<f32>().try_into_vec::<f32>().expect("f32 weights");
        let mut w: Vec<f64> = values(weight).into_iter().map(f64::from).collect();
        w.extend(bias.map(values).unwrap_or_default().into_iter().map(f64::from));
        let width = weight.shape()[1];
        let (heads, kv_heads, head_dim) = (config.n_heads, config.kv_heads(), config.head_dim());
        Self { rows: w.len() / width, w, d: config.d_model, width, heads, kv_heads, head_dim }
    }

    /// Column `c` of the fused projection over every row (bias last).
    fn column(&self, c: usize) -> Vec<f64> {
        (0..self.rows).map(|r| self.w[r * self.width + c]).collect()
    }

    /// Query head r's column j, key head g's, value head g's.
    fn q(&self, r: usize, j: usize) -> Vec<f64> {
        self.column(r * self.head_dim + j)
    }
    fn k(&self, g: usize, j: usize) -> Vec<f64> {
        self.column((self.heads + g) * self.head_dim + j)
    }
    fn v(&self, g: usize, j: usize) -> Vec<f64> {
        self.column((self.heads + self.kv_heads + g) * self.head_dim + j)
    }

    /// The MLA layer's parameters by name: w_q, w_qr, w_dkv, w_kr (weights and, with a bias row, biases), u_k, u_v.
    fn convert(&self, latent: usize, rope: usize, rotary: bool) -> Vec<(String, TensorData)> {
        let (h, g, dh) = (self.heads, self.kv_heads, self.head_dim);
        let (half, stride) = (dh / 2, dh / rope);
        let group = h / g;
        // Rotated pairs kept as MLA's RoPE: pair i of the d_R-wide rotation has frequency θ^(−2i/d_R), pair i·stride
        // of the head's.
        let kept: Vec<usize> = if rotary { (0..rope / 2).map(|i| i * stride).collect() } else { Vec::new() };
        let content: Vec<usize> = (0..dh).filter(|&j| !kept.contains(&(j % half))).collect();
        let scale = ((dh + rope) as f64 / dh as f64).sqrt();

        // [K_content | V] per KV head as one rows × n matrix, factored to rank d_L.
        let mut columns: Vec<Vec<f64>> = Vec::new();
        let mut key_column = HashMap::new();
        let mut value_column = HashMap::new();
        for gi in 0..g {
            for &j in &content {
                key_column.insert((gi, j), columns.len());
                columns.push(self.k(gi, j));
            }
        }
        for gi in 0..g {
            for j in 0..dh {
                value_column.insert((gi, j), columns.len());
                columns.push(self.v(gi, j));
            }
        }
        let n = columns.len();
        let m: Vec<f64> = (0..self.rows * n).map(|ij| columns[ij % n][ij / n]).collect();
        let (down, up) = low_rank(&m, self.rows, n, latent);

        let mut w_q = Matrix::zeros(self.rows, h * dh);
        for r in 0..h {
            for &j in &content {
                w_q.set_column(r * dh + j, &self.q(r, j), scale);
            }
        }
        let up_per_head = |lookup: &HashMap<(usize, usize), usize>| {
            let mut u = Matrix::zeros(latent, h * dh);
            for r in 0..h {
                for j in 0..dh {
                    if let Some(&c) = lookup.get(&(r / group, j)) {
                        u.set_column(r * dh + j, &(0..latent).map(|l| up[l * n + c]).collect::<Vec<_>>(), 1.0);
                    }
                }
            }
            u
        };
        let (u_k, u_v) = (up_per_head(&key_column), up_per_head(&value_column));

        // The decoupled RoPE key: per kept pair, the KV heads' complex columns fitted as w·c̄_g.
        let (mut w_kr, mut w_qr) = (Matrix::zeros(self.rows, rope), Matrix::zeros(self.rows, h * rope));
        for (i, &j) in kept.iter().enumerate() {
            let heads: Vec<Complex> = (0..g).map(|gi| Complex::column(&self.k(gi, j), &self.k(gi, j + half))).collect();
            let (w, c) = rank_one(&heads);
            w_kr.set_column(i, &w.re, 1.0);
            w_kr.set_column(i + rope / 2, &w.im, 1.0);
            for r in 0..h {
                let q = Complex::column(&self.q(r, j), &self.q(r, j + half)).times(c[r / group]);
                w_qr.set_column(r * rope + i, &q.re, scale);
                w_qr.set_column(r * rope + i + rope / 2, &q.im, scale);
            }
        }
        let w_dkv = Matrix { cols: latent, data: down };
        let mut out = Vec::new();
        for (name, matrix) in [("w_q", w_q), ("w_qr", w_qr), ("w_dkv", w_dkv), ("w_kr", w_kr)] {
            out.push((format!("{name}.weight"), matrix.rows_data(0..self.d)));
            if self.rows > self.d {
                out.push((format!("{name}.bias"), matrix.row(self.d)));
            }
        }
        out.push(("u_k.weight".into(), u_k.rows_data(0..latent)));
        out.push(("u_v.weight".into(), u_v.rows_data(0..latent)));
        out
    }
}

/// A row-major f64 matrix being filled column by column.
struct Matrix {
    cols: usize,
    data: Vec<f64>,
}

impl Matrix {
    fn zeros(rows: usize, cols: usize) -> Self {
        Self { cols, data: vec![0.0; rows * cols] }
    }

    fn set_column(&mut self, c: usize, values: &[f64], scale: f64) {
        values.iter().enumerate().for_each(|(r, x)| self.data[r * self.cols + c] = x * scale);
    }

    /// Rows `range` as f32 tensor data [rows, cols].
    fn rows_data(&self, range: std::ops::Range<usize>) -> TensorData {
        let values = self.data[range.start * self.cols..range.end * self.cols].iter().map(|&x| x as f32).collect();
        TensorData::new::<f32, _>(values, [range.len(), self.cols])
    }

    /// Row `r` as f32 tensor data [cols] (a bias).
    fn row(&self, r: usize) -> TensorData {
        let values = self.data[r * self.cols..(r + 1) * self.cols].iter().map(|&x| x as f32).collect();
        TensorData::new::<f32, _>(values, [self.cols])
    }
}

/// A complex column (or scalar, at length 1): real and imaginary parts.
#[derive(Clone, Debug)]
struct Complex {
    re: Vec<f64>,
    im: Vec<f64>,
}

impl Complex {
    /// The rotate-half pair (x_j, x_{j+d/2}) of two columns as x_j + i·x_{j+d/2}: RoPE multiplies it by e^(iφ).
    fn column(re: &[f64], im: &[f64]) -> Self {
        Self { re: re.to_vec(), im: im.to_vec() }
    }

    /// This column times the complex scalar (a, b).
    fn times(&self, (a, b): (f64, f64)) -> Self {
        let re = self.re.iter().zip(&self.im).map(|(x, y)| x * a - y * b).collect();
        let im = self.re.iter().zip(&self.im).map(|(x, y)| x * b + y * a).collect();
        Self { re, im }
    }
}

/// The best fit of complex columns w_g as w·c̄_g with Σ|c_g|² = 1: c is the top eigenvector of AᴴA (through its real
/// form [[Re, −Im], [Im, Re]]), w = A c. Returns w and each c_g as (re, im).
fn rank_one(columns: &[Complex]) -> (Complex, Vec<(f64, f64)>) {
    let g = columns.len();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    // H = AᴴA: H_ab = Σ conj(A_ka) A_kb.
    let mut real = vec![0.0; 4 * g * g];
    for a in 0..g {
        for b in 0..g {
            let (x, y) = (&columns[a], &columns[b]);
            let re = dot(&x.re, &y.re) + dot(&x.im, &y.im);
            let im = dot(&x.re, &y.im) - dot(&x.im, &y.re);
            real[a * 2 * g + b] = re;
            real[a * 2 * g + g + b] = -im;
            real[(g + a) * 2 * g + b] = im;
            real[(g + a) * 2 * g + g + b] = re;
        }
    }
    let (_, vectors) = symmetric_eigen(real, 2 * g);
    let c: Vec<(f64, f64)> = (0..g).map(|a| (vectors[0][a], vectors[0][g + a])).collect();
    let rows = columns[0].re.len();
    let mut w = Complex { re: vec![0.0; rows], im: vec![0.0; rows] };
    for (column, &(a, b)) in columns.iter().zip(&c) {
        let scaled = column.times((a, b));
        w.re.iter_mut().zip(&scaled.re).for_each(|(s, x)| *s += x);
        w.im.iter_mut().zip(&scaled.im).for_each(|(s, x)| *s += x);
    }
    (w, c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Int, Tensor};
    use ember_formats::Rng;
    use ember_test_support::max_abs_diff_tensors as max_diff;

    fn logits(model: &CausalLm) -> Tensor<3> {
        let ids: Vec<i64> = (0..20).map(|i| (i * 7 % 50) as i64).collect();
        model.forward(Tensor::<2, Int>::from_data(TensorData::new(ids, [1, 20]), &Device::flex()))
    }

    /// A model whose fused QKV weights are drawn 8× wider than GPT-2's 0.02, so that attention is peaked and the
    /// comparison sharp.
    fn sharpened(config: &ModelConfig) -> CausalLm {
        let model = CausalLm::new(config, &mut Rng::new(3), &Device::flex());
        let mut tensors: HashMap<String, TensorData> = state_dict(&model).into_iter().collect();
        for (path, data) in tensors.iter_mut().filter(|(path, _)| path.contains("c_attn")) {
            let wide: Vec<f32> = data.as_slice::<f32>().unwrap().iter().map(|x| x * 8.0).collect();
            *data = TensorData::new(wide, data.shape().to_vec());
            debug_assert!(path.ends_with("weight") || path.ends_with("bias"));
        }
        crate::params::load_state_dict(model, &tensors).unwrap()
    }

    /// Without RoPE (GPT-2 with biases, learned positions) and at full rank, MLA computes the original logits; RoPE
    /// with one KV head (MQA) and d_R = d_h keeps every pair, and is exact too.
    #[test]
    fn full_rank_conversion_without_rope_or_with_mqa_equals_the_original() {
        let gpt = ModelConfig::gpt(50, 2, 4, 32, 24);
        let mqa = ModelConfig { n_kv_heads: Some(1), ..gpt.clone().llama_style(1) };
        for (config, rope) in [(gpt, 2), (mqa, 8)] {
            let model = sharpened(&config);
            let full = max_latent(&config, rope);
            let mla = to_mla(&model, full, rope).unwrap();
            assert_eq!(mla.config().attention, AttentionKind::Mla);
            let (a, b) = (logits(&model), logits(&mla));
            let scale: f32 = a.clone().abs().max().into_scalar();
            let d = max_diff(a, b);
            assert!(d <= 1e-5 * scale, "{:?}: max |Δ| {d}, logits up to {scale}", config.positions);
        }
    }

    /// Lower ranks approximate: the logit error grows as d_L shrinks; GQA with RoPE converts with a bounded error.
    #[test]
    fn lower_ranks_and_shared_rope_keys_approximate_the_original() {
        let gqa = ModelConfig::gpt(50, 2, 4, 32, 24).llama_style(2);
        let model = sharpened(&gqa);
        let error = |latent: usize| max_diff(logits(&model), logits(&to_mla(&model, latent, 4).unwrap()));
        let (full, half, low) = (error(max_latent(&gqa, 4)), error(16), error(4));
        assert!(full < half && half < low, "{full} < {half} < {low}");
    }

    #[test]
    fn impossible_shapes_are_refused_with_the_bound() {
        let model = CausalLm::new(&ModelConfig::gpt(50, 1, 4, 32, 24), &mut Rng::new(3), &Device::flex());
        assert_eq!(
            to_mla(&model, 34, 2).unwrap_err().to_string().split(',').next(),
            Some("--latent-dim 34: at least 1 and at most 33")
        );
        assert!(matches!(to_mla(&model, 8, 3), Err(ConvertError::Rope { .. })));
    }
}
