//! RoPE scaling: how a model trained on a shorter context stretches its rotation frequencies θ_i = base^(−2i/d) to a
//! longer one (`[model.rope_scaling]`; Hugging Face's `rope_scaling` / `rope_parameters`).

use serde::{Deserialize, Serialize};

use crate::invalid::{Invalid, require};

/// A frequency scaling, applied to every θ_i when the RoPE tables are built.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Position interpolation (Chen et al. 2023): θ_i / s.
    Linear { factor: f64 },
    /// Llama 3.1's: wavelengths λ_i = 2π/θ_i shorter than L/β (`high_freq_factor` β) keep θ_i, longer than L/α
    /// (`low_freq_factor` α) take θ_i / s, and between them (1 − t) θ_i / s + t θ_i with t = (L/λ_i − α) / (β − α),
    /// L the original context.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_context: usize },
    /// YaRN (Peng et al. 2023): θ_i / s where a rotation of θ_i over the original context L turns fewer than
    /// `beta_slow` times, θ_i where more than `beta_fast`, a linear ramp in i between (its ends at the dimensions
    /// d ln(L / 2πβ) / 2 ln base, floored and ceiled); cos and sin scaled by `attention_factor` (0.1 ln s + 1).
    Yarn { factor: f64, original_context: usize, beta_fast: f64, beta_slow: f64, attention_factor: f64 },
    /// θ_i / f_i for each rotation pair's own factor: llama.cpp's `rope_freqs` tensor, as which its converter writes
    /// Llama 3's scaling into GGUF files.
    Factors { factors: Vec<f64> },
    /// Dynamic NTK scaling (bloc97, emozilla): for a sequence of n > L tokens (L the original context) the base
    /// becomes base · (s n / L − (s − 1))^(d / (d − 2)); up to L it is unchanged.
    Dynamic { factor: f64, original_context: usize },
    /// LongRoPE (Phi-3): θ_i / f_i with each pair's `short` factor for sequences up to the original context L, its
    /// `long` one past it; cos and sin scaled by `attention_factor` (√(1 + ln s / ln L), s the context's growth).
    LongRope { short: Vec<f64>, long: Vec<f64>, original_context: usize, attention_factor: f64 },
}

impl RopeScaling {
    /// YaRN with transformers' defaults for what a checkpoint leaves out: β_fast 32, β_slow 1 and the attention
    /// factor 0.1 ln s + 1.
    pub fn yarn(
        factor: f64,
        original_context: usize,
        beta_fast: Option<f64>,
        beta_slow: Option<f64>,
        attention_factor: Option<f64>,
    ) -> Self {
        RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast: beta_fast.unwrap_or(32.0),
            beta_slow: beta_slow.unwrap_or(1.0),
            attention_factor: attention_factor.unwrap_or_else(|| yarn_magnitude(factor, 1.0)),
        }
    }

    /// θ_i = base^(−2i/d) of rotation pair i of a d-wide head, as scaled, in a sequence of `length` tokens (only the
    /// dynamic and LongRoPE scalings depend on it: a forward pass rotates its tokens with the frequencies of the
    /// sequence up to its last one, as transformers computes them).
    pub fn frequency(&self, i: usize, d: usize, base: f64, length: usize) -> f64 {
        let theta = base.powf(-2.0 * i as f64 / d as f64);
        match *self {
            RopeScaling::Factors { ref factors } => theta / factors[i],
            RopeScaling::Dynamic { factor, original_context } => {
                if length <= original_context {
                    return theta;
                }
                let n = factor * length as f64 / original_context as f64 - (factor - 1.0);
                (base * n.powf(d as f64 / (d as f64 - 2.0))).powf(-2.0 * i as f64 / d as f64)
            }
            RopeScaling::LongRope { ref short, ref long, original_context, .. } => {
                theta / if length > original_context { long[i] } else { short[i] }
            }
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
            RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, .. } => {
                let dim = |rotations: f64| {
                    d as f64 * (original_context as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * base.ln())
                };
                let low = dim(beta_fast).floor().max(0.0);
                let high = dim(beta_slow).ceil().min(d as f64 - 1.0);
                let high = if high == low { high + 0.001 } else { high };
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                theta / factor * ramp + theta * (1.0 - ramp)
            }
        }
    }

    /// What cos and sin are multiplied by: YaRN's attention factor, else 1.
    pub fn magnitude(&self) -> f64 {
        match *self {
            RopeScaling::Yarn { attention_factor, .. } | RopeScaling::LongRope { attention_factor, .. } => {
                attention_factor
            }
            _ => 1.0,
        }
    }

    /// `model.rope_scaling`: a factor ≥ 1; Llama 3's band factors 0 < α < β and an original context; per-pair factors
    /// (LongRoPE's short and long ones too), one for each of the `pairs` rotation pairs of a head, finite and > 0.
    pub fn check(&self, pairs: usize) -> Result<(), Invalid> {
        let factors = |key: &str, factors: &[f64]| {
            let count = format!("{} factors", factors.len());
            require(factors.len() == pairs, key, count, format!("one per rotation pair: {pairs}"))?;
            let bad = factors.iter().find(|f| !(f.is_finite() && **f > 0.0));
            require(bad.is_none(), key, bad.copied().unwrap_or(0.0), "finite numbers > 0")
        };
        let context = |original_context: usize| {
            require(original_context >= 1, "model.rope_scaling.original_context", original_context, "at least 1")
        };
        let factor = match *self {
            RopeScaling::Factors { factors: ref f } => return factors("model.rope_scaling.factors", f),
            RopeScaling::LongRope { ref short, ref long, original_context, attention_factor: m } => {
                factors("model.rope_scaling.short", short)?;
                factors("model.rope_scaling.long", long)?;
                require(m.is_finite() && m > 0.0, "model.rope_scaling.attention_factor", m, "a finite number > 0")?;
                return context(original_context);
            }
            RopeScaling::Dynamic { factor, original_context } => {
                context(original_context)?;
                factor
            }
            RopeScaling::Linear { factor } => factor,
            RopeScaling::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, original_context } => {
                let key = "model.rope_scaling.low_freq_factor";
                require(low.is_finite() && low > 0.0, key, low, "a finite number > 0")?;
                let key = "model.rope_scaling.high_freq_factor";
                require(high.is_finite() && high > low, key, high, "a finite number greater than low_freq_factor")?;
                context(original_context)?;
                factor
            }
            RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor } => {
                let key = "model.rope_scaling.beta_slow";
                require(beta_slow.is_finite() && beta_slow > 0.0, key, beta_slow, "a finite number > 0")?;
                let key = "model.rope_scaling.beta_fast";
                require(
                    beta_fast.is_finite() && beta_fast > beta_slow,
                    key,
                    beta_fast,
                    "a finite number above beta_slow",
                )?;
                let (key, m) = ("model.rope_scaling.attention_factor", attention_factor);
                require(m.is_finite() && m > 0.0, key, m, "a finite number > 0")?;
                context(original_context)?;
                factor
            }
        };
        require(factor.is_finite() && factor >= 1.0, "model.rope_scaling.factor", factor, "a finite number ≥ 1")
    }
}

/// LongRoPE's default attention factor for a context grown s times from L = `original_context`: √(1 + ln s / ln L)
/// (1 for s ≤ 1), as transformers and llama.cpp's converter compute it.
pub fn longrope_magnitude(factor: f64, original_context: usize) -> f64 {
    if factor <= 1.0 { 1.0 } else { (1.0 + factor.ln() / (original_context as f64).ln()).sqrt() }
}

/// YaRN's default attention factor for a scale s: 0.1 · m · ln s + 1 (1 for s ≤ 1).
pub fn yarn_magnitude(factor: f64, m: f64) -> f64 {
    if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_frequencies_divides_low_ones_and_blends_between() {
        let s =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 8192 };
        // λ = 2π/θ: 6.3 (< 8192/4) kept; 62,832 (> 8192) divided by 8; 4,096 between them, t = (2 − 1)/3.
        // Pair 1 of a 2-wide head turns at θ = 1/base.
        let at = |theta: f64| {
            let base = 1.0 / theta;
            s.frequency(1, 2, base, 1)
        };
        assert!((at(1.0) - 1.0).abs() < 1e-15);
        assert!((at(1e-4) - 1e-4 / 8.0).abs() < 1e-18);
        let theta = 2.0 * std::f64::consts::PI / 4096.0;
        let t = (8192.0 / 4096.0 - 1.0) / 3.0;
        assert!((at(theta) - ((1.0 - t) * theta / 8.0 + t * theta)).abs() < 1e-12);
        assert_eq!(RopeScaling::Linear { factor: 4.0 }.frequency(0, 8, 10_000.0, 1), 0.25);
    }

    /// Dynamic NTK leaves θ alone up to the original context and raises the base past it; LongRoPE switches from the
    /// short factors to the long ones there.
    #[test]
    fn dynamic_and_longrope_scalings_change_at_the_original_context() {
        let dynamic = RopeScaling::Dynamic { factor: 2.0, original_context: 16 };
        assert_eq!(dynamic.frequency(1, 4, 100.0, 16), 0.1);
        // n = 32: base · (2·32/16 − 1)^(4/2) = 100 · 9, θ_1 = 900^(−1/2).
        assert!((dynamic.frequency(1, 4, 100.0, 32) - 1.0 / 30.0).abs() < 1e-15);
        let long = RopeScaling::LongRope {
            short: vec![1.0, 2.0],
            long: vec![3.0, 5.0],
            original_context: 16,
            attention_factor: 1.2,
        };
        assert_eq!((long.frequency(1, 4, 100.0, 16), long.frequency(1, 4, 100.0, 17)), (0.1 / 2.0, 0.1 / 5.0));
        assert_eq!(long.magnitude(), 1.2);
        let want = (1.0 + 4f64.ln() / 16f64.ln()).sqrt();
        assert_eq!((longrope_magnitude(4.0, 16), longrope_magnitude(1.0, 16)), (want, 1.0));
    }

    /// Per-pair factors divide each θ_i by its own factor; a model config checks there is one per rotation pair.
    #[test]
    fn factors_divide_each_pair_and_their_count_is_checked() {
        let s = RopeScaling::Factors { factors: vec![1.0, 2.0, 8.0] };
        for (i, f) in [1.0, 2.0, 8.0].into_iter().enumerate() {
            assert_eq!(s.frequency(i, 6, 100.0, 1), 100f64.powf(-2.0 * i as f64 / 6.0) / f);
        }
        let mut config = crate::config::ModelConfig::gpt(50, 2, 2, 12, 16).llama_style(2);
        config.rope_scaling = Some(s);
        assert!(config.validate().is_ok(), "heads of 6: 3 pairs");
        config.rope_scaling = Some(RopeScaling::Factors { factors: vec![1.0, 2.0] });
        let err = config.validate().unwrap_err().to_string();
        assert_eq!(err, "model.rope_scaling.factors = 2 factors: one per rotation pair: 3");
        config.rope_scaling = Some(RopeScaling::Factors { factors: vec![1.0, 0.0, 1.0] });
        assert!(config.validate().unwrap_err().to_string().contains("finite numbers > 0"));
    }
}
