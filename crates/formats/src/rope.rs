//! RoPE scaling: how a model trained on a shorter context stretches its rotation frequencies θ_i = base^(−2i/d) to a
//! longer one (`[model.rope_scaling]`; Hugging Face's `rope_scaling` / `rope_parameters`).

use serde::{Deserialize, Serialize};

/// A frequency scaling, applied to every θ_i when the RoPE tables are built.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Position interpolation (Chen et al. 2023): θ_i / s.
    Linear { factor: f64 },
    /// Llama 3.1's: wavelengths λ_i = 2π/θ_i shorter than L/β (`high_freq_factor` β) keep θ_i, longer than L/α
    /// (`low_freq_factor` α) take θ_i / s, and between them (1 − t) θ_i / s + t θ_i with t = (L/λ_i − α) / (β − α),
    /// L the original context.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_context: usize },
}

impl RopeScaling {
    /// θ_i as scaled.
    pub fn frequency(&self, theta: f64) -> f64 {
        match *self {
            RopeScaling::Linear { factor } => theta / factor,
            RopeScaling::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, original_context } => {
                let context = original_context as f64;
                let wavelength = 2.0 * std::f64::consts::PI / theta;
                if wavelength < context / high {
                    theta
                } else if wavelength > context / low {
                    theta / factor
                } else {
                    let t = (context / wavelength - low) / (high - low);
                    (1.0 - t) * theta / factor + t * theta
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_frequencies_divides_low_ones_and_blends_between() {
        let s =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192 };
        // λ = 2π/θ: 6.3 (< 8192/4) kept; 62,832 (> 8192) divided by 8; 4,096 between them, t = (2 − 1)/3.
        assert_eq!(s.frequency(1.0), 1.0);
        assert_eq!(s.frequency(1e-4), 1e-4 / 8.0);
        let theta = 2.0 * std::f64::consts::PI / 4096.0;
        let t = (8192.0 / 4096.0 - 1.0) / 3.0;
        assert!((s.frequency(theta) - ((1.0 - t) * theta / 8.0 + t * theta)).abs() < 1e-15);
        assert_eq!(RopeScaling::Linear { factor: 4.0 }.frequency(1.0), 0.25);
    }
}
