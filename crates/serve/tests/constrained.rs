//! Constrained sampling through a whole [`Sequence`] step: the draw follows the sampler's distribution restricted to
//! the tokens the grammar allows.

use std::sync::Arc;

use burn::tensor::Device;
use ember_core_model::{Build, CausalLm, ModelConfig, Rng};
use ember_formats::openai::Format;
use ember_formats::request::{GenerationRequest, Sampling};
use ember_formats::tokenizer;
use ember_serve::constrain::{self, Compiled, Constraint, Vocabulary};
use ember_serve::{KvKind, Sequence};

/// With logits z = (0, 1, 2) over "a", "b", "c" and only "a" or "b" allowed, the first token is drawn from the
/// sampler's distribution restricted to them: softmax(z) gives P(a) = 1 / (1 + e) among the two (within 4σ over
/// 4,000 draws); greedy takes "b"; with top-k 1 no candidate is allowed and the draw falls back to the best
/// allowed token.
#[test]
fn constrained_draws_follow_the_restricted_distribution() {
    let tokenizer = tokenizer::train_char("abc").unwrap();
    let device = Device::flex();
    let model = CausalLm::new(&ModelConfig::gpt(3, 1, 2, 8, 16), &mut Rng::new(1), &device);
    let compiled = Compiled::new(constrain::compile(&Format::Choice(vec!["a".into(), "b".into()])).unwrap());
    let vocabulary = Arc::new(Vocabulary::new(&tokenizer, 3));
    let first = |sampling: Sampling, seed: u64| {
        let request = GenerationRequest { prompt: "c".into(), max_new_tokens: 4, seed, sampling, ..Default::default() };
        let constraint = Constraint::new(compiled.clone(), vocabulary.clone());
        let sequence = Sequence::new(&model, &tokenizer, &request, KvKind::None.into(), &device).unwrap();
        let mut sequence = sequence.with_constraint(Some(constraint));
        let text = sequence.step_with(vec![0.0, 1.0, 2.0]).unwrap();
        assert!(sequence.finished().is_some(), "a choice is complete after one token");
        text
    };
    let n = 4000;
    let a = (0..n).filter(|&seed| first(Sampling { temperature: 1.0, ..Sampling::default() }, seed) == "a").count();
    let (p, want) = (a as f64 / n as f64, 1.0 / (1.0 + 1f64.exp()));
    let sigma = (want * (1.0 - want) / n as f64).sqrt();
    assert!((p - want).abs() < 4.0 * sigma, "P(a) = {p}, expected {want} ± {}", 4.0 * sigma);
    assert_eq!(first(Sampling::greedy(), 0), "b");
    assert_eq!(first(Sampling { temperature: 1.0, top_k: Some(1), ..Sampling::default() }, 0), "b");
}
