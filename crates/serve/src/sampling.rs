//! `[sample]` settings and drawing the next token from logits.

use ember_core_model::Rng;
use ember_core_model::config::{Invalid, require};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleConfig {
    #[serde(default = "default_prompt")]
    pub prompt: String,
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: usize,
    /// Divides the logits; 0 means greedy.
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// Sample among the k most likely tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    #[serde(default = "default_seed")]
    pub seed: u64,
}

fn default_prompt() -> String {
    "\n".into()
}
fn default_max_new_tokens() -> usize {
    500
}
fn default_temperature() -> f64 {
    0.8
}
fn default_seed() -> u64 {
    1337
}

impl Default for SampleConfig {
    fn default() -> Self {
        Self {
            prompt: default_prompt(),
            max_new_tokens: default_max_new_tokens(),
            temperature: default_temperature(),
            top_k: None,
            seed: default_seed(),
        }
    }
}

impl SampleConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        require(
            self.temperature >= 0.0 && self.temperature.is_finite(),
            "sample.temperature",
            self.temperature,
            "a finite number ≥ 0 (0 is greedy)",
        )?;
        if let Some(k) = self.top_k {
            require(k >= 1, "sample.top_k", k, "at least 1")?;
        }
        Ok(())
    }
}

/// The next token: argmax when `temperature` is 0, else a draw from softmax(z / temperature) restricted to the
/// `top_k` largest logits.
pub fn sample(logits: &[f32], temperature: f64, top_k: Option<usize>, rng: &mut Rng) -> u32 {
    let argmax = || {
        logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &z)| if z > best.1 { (i, z) } else { best }).0
            as u32
    };
    if temperature == 0.0 {
        return argmax();
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order.truncate(top_k.unwrap_or(logits.len()).min(logits.len()));
    let z_max = logits[order[0]] as f64;
    let weights: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - z_max) / temperature).exp()).collect();
    let mut u = rng.uniform() * weights.iter().sum::<f64>();
    for (&i, w) in order.iter().zip(&weights) {
        if u < *w {
            return i as u32;
        }
        u -= w;
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_top1_and_frequencies_follow_softmax() {
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let mut rng = Rng::new(1);
        assert_eq!(sample(&logits, 0.0, None, &mut rng), 1);
        assert!((0..50).all(|_| sample(&logits, 1.0, Some(1), &mut rng) == 1));
        let mut counts = [0usize; 4];
        let n = 40_000;
        for _ in 0..n {
            counts[sample(&logits, 1.0, Some(2), &mut rng) as usize] += 1;
        }
        assert_eq!(counts[0] + counts[3], 0, "top-k excludes the rest");
        let p1 = counts[1] as f64 / n as f64;
        let expect = 1.0 / (1.0 + (-1f64).exp());
        assert!((p1 - expect).abs() < 0.01, "{p1} vs {expect}");
    }
}
