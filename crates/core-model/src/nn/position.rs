//! Position information: the 2017 sinusoidal table and rotary embeddings (RoPE), at the positions of a forward
//! pass's new tokens.

use std::cell::OnceCell;

use burn::tensor::{DType, Device, FloatDType, Int, Tensor, TensorData};
use ember_formats::rope::RopeScaling;

/// Rows of the 2017 table at `positions`, [n, d], in `dtype`: PE(p, 2i) = sin(p / 10000^(2i/d)),
/// PE(p, 2i+1) = cos(p / 10000^(2i/d)).
pub fn sinusoidal(positions: &[usize], d: usize, device: &Device, dtype: FloatDType) -> Tensor<2> {
    let mut table = Vec::with_capacity(positions.len() * d);
    for &p in positions {
        for c in 0..d {
            let angle = p as f64 / 10_000f64.powf((c - c % 2) as f64 / d as f64);
            table.push(if c % 2 == 0 { angle.sin() } else { angle.cos() } as f32);
        }
    }
    Tensor::from_data(TensorData::new(table, [positions.len(), d]), (device, DType::from(dtype)))
}

/// RoPE's base θ, the width d of the vectors it rotates, and how its frequencies are scaled.
#[derive(Clone, Debug, PartialEq)]
pub struct Rotary {
    pub theta: f64,
    pub dim: usize,
    pub scaling: Option<RopeScaling>,
}

/// Where the new tokens of a forward pass sit, with the RoPE tables for them (built on first use, then shared by every
/// layer that rotates the same way in the same float type).
#[derive(Debug)]
pub struct Positions {
    rows: Rows,
    device: Device,
    rope: OnceCell<(Rotary, FloatDType, Rope)>,
}

#[derive(Debug)]
enum Rows {
    /// Every row's tokens at `start..start + len`.
    Span { start: usize, len: usize },
    /// Row b's one token at `positions[b]`.
    PerRow(Vec<usize>),
}

impl Positions {
    /// Positions `start..start + len`, the same in every row.
    pub fn span(start: usize, len: usize, device: &Device) -> Self {
        Self { rows: Rows::Span { start, len }, device: device.clone(), rope: OnceCell::new() }
    }

    /// One token per row, row b's at `positions[b]`.
    pub fn per_row(positions: Vec<usize>, device: &Device) -> Self {
        Self { rows: Rows::PerRow(positions), device: device.clone(), rope: OnceCell::new() }
    }

    /// The absolute position of the first query against keys shared by every row: `start` of a span; 0 per row, whose
    /// keys are each row's own and masked by length instead.
    pub fn query_offset(&self) -> usize {
        match self.rows {
            Rows::Span { start, .. } => start,
            Rows::PerRow(_) => 0,
        }
    }

    /// The positions listed, and the shape [rows, tokens] they broadcast as: [1, T] for a span, [B, 1] per row.
    fn listed(&self) -> (Vec<usize>, [usize; 2]) {
        match &self.rows {
            Rows::Span { start, len } => ((*start..start + len).collect(), [1, *len]),
            Rows::PerRow(positions) => (positions.clone(), [positions.len(), 1]),
        }
    }

    /// The positions as ids, [1, T] or [B, 1] (rows of a learned position table).
    pub fn ids(&self) -> Tensor<2, Int> {
        match &self.rows {
            Rows::Span { start, len } => {
                Tensor::<1, Int>::arange(*start as i64..(start + len) as i64, &self.device).reshape([1, *len])
            }
            Rows::PerRow(positions) => {
                let ids: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
                Tensor::from_data(TensorData::new(ids, [positions.len(), 1]), &self.device)
            }
        }
    }

    /// The 2017 table at these positions, [1, T, d] or [B, 1, d], in `dtype`.
    pub fn sinusoidal(&self, d: usize, dtype: FloatDType) -> Tensor<3> {
        let (positions, [rows, tokens]) = self.listed();
        sinusoidal(&positions, d, &self.device, dtype).reshape([rows, tokens, d])
    }

    /// The rotation tables of `rotary` at these positions, in `dtype` (that of the vectors they rotate).
    pub fn rope(&self, rotary: &Rotary, dtype: FloatDType) -> Rope {
        match self.rope.get() {
            Some((built, in_dtype, rope)) if built == rotary && *in_dtype == dtype => rope.clone(),
            _ => {
                let (positions, [rows, tokens]) = self.listed();
                let shape = [rows, 1, tokens, rotary.dim];
                let span_end = match self.rows {
                    Rows::Span { start, len } => Some(start + len),
                    Rows::PerRow(_) => None,
                };
                let rope = Rope::table(rotary, &positions, span_end, shape, (&self.device, DType::from(dtype)));
                let _ = self.rope.set((rotary.clone(), dtype, rope.clone()));
                rope
            }
        }
    }
}

/// cos and sin of the rotation angles p·θ_i, θ_i = theta^(−2i/d) (as `scaling` stretches it), with the d/2 frequencies repeated in both halves
/// (the rotate-half layout of Llama and Hugging Face), shaped to broadcast over x [B, H, T, d]: [1, 1, T, d] for a
/// span of positions shared by every row, or [B, 1, 1, d] for one position per row.
#[derive(Clone, Debug)]
pub struct Rope {
    cos: Tensor<4>,
    sin: Tensor<4>,
}

impl Rope {
    /// The tables at `positions`, [`Positions::listed`] in `shape`: the tokens of a span ending at `span_end` all take
    /// the frequencies of the sequence up to its last one, a row's one token those of the sequence it ends.
    fn table(
        rotary: &Rotary,
        positions: &[usize],
        span_end: Option<usize>,
        shape: [usize; 4],
        options: (&Device, DType),
    ) -> Self {
        let Rotary { theta, dim: d, ref scaling } = *rotary;
        let half = d / 2;
        let span_length = span_end.unwrap_or(0);
        let magnitude = scaling.as_ref().map_or(1.0, |s| s.magnitude());
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * d), Vec::with_capacity(positions.len() * d));
        for &p in positions {
            let length = span_length.max(p + 1);
            let frequency: Vec<f64> = (0..half)
                .map(|i| match scaling {
                    Some(s) => s.frequency(i, d, theta, length),
                    None => theta.powf(-2.0 * i as f64 / d as f64),
                })
                .collect();
            for c in 0..d {
                let angle = p as f64 * frequency[c % half];
                cos.push((angle.cos() * magnitude) as f32);
                sin.push((angle.sin() * magnitude) as f32);
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, shape), options),
            sin: Tensor::from_data(TensorData::new(sin, shape), options),
        }
    }

    /// RoPE(x) = x ⊙ cos + rotate_half(x) ⊙ sin, rotate_half(x₁, x₂) = (−x₂, x₁), for x [B, H, T, d].
    pub fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        let [b, h, t, d] = x.dims();
        let x1 = x.clone().slice([0..b, 0..h, 0..t, 0..d / 2]);
        let x2 = x.clone().slice([0..b, 0..h, 0..t, d / 2..d]);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * self.cos.clone() + rotated * self.sin.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// q at position i against k at position j, after rotation.
    fn score(q: &Tensor<4>, k: &Tensor<4>, i: usize, j: usize) -> f32 {
        let dev = Device::flex();
        let rotary = Rotary { theta: 10_000.0, dim: 8, scaling: None };
        let q = Positions::span(i, 1, &dev).rope(&rotary, FloatDType::F32).apply(q.clone());
        let k = Positions::span(j, 1, &dev).rope(&rotary, FloatDType::F32).apply(k.clone());
        (q * k).sum().into_scalar()
    }

    #[test]
    fn rope_scores_depend_only_on_the_offset_j_minus_i() {
        let dev = Device::flex();
        let mut rng = ember_formats::Rng::new(4);
        let mut init = crate::init::Init::draw(&mut rng, &dev);
        let q = init.normal("q", [1, 1, 1, 8], 1.0).val();
        let k = init.normal("k", [1, 1, 1, 8], 1.0).val();
        let base = score(&q, &k, 3, 7);
        for shift in [1, 10, 100] {
            assert!((score(&q, &k, 3 + shift, 7 + shift) - base).abs() < 1e-4);
        }
        assert!((score(&q, &k, 3, 8) - base).abs() > 1e-3, "a different offset must change the score");
    }

    /// Rotate-half RoPE by its definition: pair i = (x_i, x_{i+d/2}) turns by p·θ_i, θ_i = theta^(−2i/d).
    #[test]
    fn rope_turns_each_pair_of_halves_by_its_angle() {
        let dev = Device::flex();
        let x = [0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75];
        let rotary = Rotary { theta: 100.0, dim: 6, scaling: None };
        let input = Tensor::<4>::from_data(TensorData::new(x.to_vec(), [1, 1, 1, 6]), &dev);
        let y = Positions::span(5, 1, &dev)
            .rope(&rotary, FloatDType::F32)
            .apply(input)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for i in 0..3 {
            let angle = 5.0 * 100f64.powf(-2.0 * i as f64 / 6.0);
            let (a, b) = (x[i] as f64, x[i + 3] as f64);
            let want = [a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()];
            for (got, want) in [y[i], y[i + 3]].into_iter().zip(want) {
                assert!((got as f64 - want).abs() < 1e-5, "pair {i}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn sinusoidal_rows_are_sin_and_cos_of_the_position() {
        let row = sinusoidal(&[3], 4, &Device::flex(), FloatDType::F32).into_data().try_to_vec::<f32>().unwrap();
        let want = [3f64.sin(), 3f64.cos(), (3.0 / 100.0f64).sin(), (3.0 / 100.0f64).cos()];
        assert!(row.iter().zip(want).all(|(a, b)| (*a as f64 - b).abs() < 1e-6), "{row:?}");
    }
}
