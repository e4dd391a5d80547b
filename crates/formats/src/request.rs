//! What a generation asks for: the prompt, how many tokens, where to stop and the seed ([`GenerationRequest`]), and
//! how each token is drawn ([`Sampling`]). The `[sample]` section of a run config, the flags of `ember generate` and
//! the body of an OpenAI request all become one; the drawing itself is the serve crate's.

use crate::config::{Invalid, require};
use serde::{Deserialize, Serialize};

/// How each next token is drawn from the logits z.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 means greedy.
    pub temperature: f64,
    /// Sample among the k most likely tokens only.
    pub top_k: Option<usize>,
    /// Nucleus sampling: among the most likely tokens whose probabilities first sum to at least p.
    pub top_p: Option<f64>,
    /// Penalty θ on tokens already in the context (prompt included): z / θ where z > 0, z · θ otherwise (CTRL).
    pub repetition_penalty: f64,
    /// α_f: z_j − α_f · c_j, with c_j the times token j was generated so far (OpenAI's frequency_penalty).
    pub frequency_penalty: f64,
    /// α_p: z_j − α_p when token j was generated so far (OpenAI's presence_penalty).
    pub presence_penalty: f64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: None,
            top_p: None,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
        }
    }
}

impl Sampling {
    /// Greedy decoding: the largest logit every step.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

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
        if let Some(p) = self.top_p {
            require(p > 0.0 && p <= 1.0, "sample.top_p", p, "in (0, 1]")?;
        }
        let theta = self.repetition_penalty;
        require(
            theta > 0.0 && theta.is_finite(),
            "sample.repetition_penalty",
            theta,
            "a finite number > 0 (1 is off)",
        )?;
        for (key, alpha) in
            [("sample.frequency_penalty", self.frequency_penalty), ("sample.presence_penalty", self.presence_penalty)]
        {
            require((-2.0..=2.0).contains(&alpha), key, alpha, "from -2 to 2 (0 is off)")?;
        }
        Ok(())
    }
}

/// One generation: the prompt, at most `max_new_tokens` after it, the strings that end it, the seed of its draws,
/// and how each token is drawn. In a run config it is the flat `[sample]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "SampleSection", into = "SampleSection")]
pub struct GenerationRequest {
    pub prompt: String,
    pub max_new_tokens: usize,
    /// Generation ends before the first of these strings appears; it is not part of the output.
    pub stop: Vec<String>,
    pub seed: u64,
    pub sampling: Sampling,
}

impl Default for GenerationRequest {
    fn default() -> Self {
        Self { prompt: "\n".into(), max_new_tokens: 500, stop: Vec::new(), seed: 1337, sampling: Sampling::default() }
    }
}

impl GenerationRequest {
    pub fn validate(&self) -> Result<(), Invalid> {
        self.sampling.validate()?;
        if let Some(empty) = self.stop.iter().find(|s| s.is_empty()) {
            require(false, "sample.stop", format!("{empty:?}"), "stop strings must not be empty")?;
        }
        Ok(())
    }
}

/// `[sample]` as written in a run config: every key at one level, each defaulting to [`GenerationRequest::default`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct SampleSection {
    prompt: String,
    max_new_tokens: usize,
    temperature: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    repetition_penalty: f64,
    #[serde(skip_serializing_if = "is_zero")]
    frequency_penalty: f64,
    #[serde(skip_serializing_if = "is_zero")]
    presence_penalty: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stop: Vec<String>,
    seed: u64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Default for SampleSection {
    fn default() -> Self {
        GenerationRequest::default().into()
    }
}

impl From<SampleSection> for GenerationRequest {
    fn from(s: SampleSection) -> Self {
        let sampling = Sampling {
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            repetition_penalty: s.repetition_penalty,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
        };
        Self { prompt: s.prompt, max_new_tokens: s.max_new_tokens, stop: s.stop, seed: s.seed, sampling }
    }
}

impl From<GenerationRequest> for SampleSection {
    fn from(r: GenerationRequest) -> Self {
        let Sampling { temperature, top_k, top_p, repetition_penalty, frequency_penalty, presence_penalty } =
            r.sampling;
        Self {
            prompt: r.prompt,
            max_new_tokens: r.max_new_tokens,
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            frequency_penalty,
            presence_penalty,
            stop: r.stop,
            seed: r.seed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[sample]` reads flat keys into the request and its sampling, keeps the defaults of the keys it lacks, writes
    /// back what it read, and refuses an unknown key.
    #[test]
    fn the_sample_section_is_flat_and_round_trips() {
        let read: GenerationRequest = toml::from_str("prompt = \"ROMEO:\"\ntemperature = 0.5\ntop_k = 40\n").unwrap();
        let want = GenerationRequest {
            prompt: "ROMEO:".into(),
            sampling: Sampling { temperature: 0.5, top_k: Some(40), ..Sampling::default() },
            ..GenerationRequest::default()
        };
        assert_eq!(read, want);
        let written = toml::to_string(&read).unwrap();
        assert_eq!(toml::from_str::<GenerationRequest>(&written).unwrap(), read);
        let err = toml::from_str::<GenerationRequest>("temprature = 0.5").unwrap_err().to_string();
        assert!(err.contains("temprature"), "{err}");
    }
}
