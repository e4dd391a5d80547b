//! Position information: the 2017 sinusoidal table and rotary embeddings (RoPE).

use burn::tensor::{Device, Tensor, TensorData};

/// Rows `offset..offset + t` of the 2017 table: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)).
pub fn sinusoidal(offset: usize, t: usize, d: usize, device: &Device) -> Tensor<2> {
    let mut table = Vec::with_capacity(t * d);
    for p in offset..offset + t {
        for c in 0..d {
            let angle = p as f64 / 10_000f64.powf((c - c % 2) as f64 / d as f64);
            table.push(if c % 2 == 0 { angle.sin() } else { angle.cos() } as f32);
        }
    }
    Tensor::from_data(TensorData::new(table, [t, d]), device)
}

/// cos and sin of the rotation angles p·θ_i, θ_i = theta^(−2i/d), with the d/2 frequencies repeated in both halves
/// (the rotate-half layout of Llama and Hugging Face), shaped to broadcast over x [B, H, T, d]: [1, 1, T, d] for
/// positions `offset..offset + t` of every row, or [B, 1, 1, d] for one position per row.
#[derive(Clone, Debug)]
pub struct Rope {
    cos: Tensor<4>,
    sin: Tensor<4>,
}

impl Rope {
    pub fn new(theta: f64, d: usize, offset: usize, t: usize, device: &Device) -> Self {
        let positions: Vec<usize> = (offset..offset + t).collect();
        Self::table(theta, d, &positions, [1, 1, t, d], device)
    }

    /// Row b of a batch at position `positions[b]` (one token per row).
    pub fn per_row(theta: f64, d: usize, positions: &[usize], device: &Device) -> Self {
        Self::table(theta, d, positions, [positions.len(), 1, 1, d], device)
    }

    fn table(theta: f64, d: usize, positions: &[usize], shape: [usize; 4], device: &Device) -> Self {
        let half = d / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * d), Vec::with_capacity(positions.len() * d));
        for &p in positions {
            for c in 0..d {
                let angle = p as f64 * theta.powf(-2.0 * (c % half) as f64 / d as f64);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, shape), device),
            sin: Tensor::from_data(TensorData::new(sin, shape), device),
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
        let q = Rope::new(10_000.0, 8, i, 1, &dev).apply(q.clone());
        let k = Rope::new(10_000.0, 8, j, 1, &dev).apply(k.clone());
        (q * k).sum().into_scalar()
    }

    #[test]
    fn rope_scores_depend_only_on_the_offset_j_minus_i() {
        let dev = Device::flex();
        let mut rng = crate::Rng::new(4);
        let q = crate::init::normal(&mut rng, [1, 1, 1, 8], 1.0, &dev).val();
        let k = crate::init::normal(&mut rng, [1, 1, 1, 8], 1.0, &dev).val();
        let base = score(&q, &k, 3, 7);
        for shift in [1, 10, 100] {
            assert!((score(&q, &k, 3 + shift, 7 + shift) - base).abs() < 1e-4);
        }
        assert!((score(&q, &k, 3, 8) - base).abs() > 1e-3, "a different offset must change the score");
    }

    #[test]
    fn sinusoidal_rows_are_sin_and_cos_of_the_position() {
        let row = sinusoidal(3, 1, 4, &Device::flex()).into_data().try_to_vec::<f32>().unwrap();
        let want = [3f64.sin(), 3f64.cos(), (3.0 / 100.0f64).sin(), (3.0 / 100.0f64).cos()];
        assert!(row.iter().zip(want).all(|(a, b)| (*a as f64 - b).abs() < 1e-6), "{row:?}");
    }
}
