//! Sampling through whole [`Sequence`] steps: a constrained draw follows the sampler's distribution restricted to
//! the tokens the grammar allows, and speculative sampling with prompt-lookup drafts draws as plain sampling does.

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

/// The tokens after the first of one generation of `steps` more, plain or with prompt-lookup drafts of 3.
fn tokens_after_first(model: &CausalLm, tokenizer: &tokenizers::Tokenizer, seed: u64, drafted: bool) -> Vec<u32> {
    let sampling = Sampling { temperature: 0.8, ..Sampling::default() };
    let request =
        GenerationRequest { prompt: "abcabcab".into(), max_new_tokens: 3, seed, sampling, ..Default::default() };
    let mut sequence = Sequence::new(model, tokenizer, &request, KvKind::Contiguous.into(), &Device::flex()).unwrap();
    sequence.step().unwrap();
    while sequence.finished().is_none() {
        match drafted {
            true => sequence.step_drafted(&ember_serve::speculate::lookup(sequence.ids(), 3)).unwrap(),
            false => (sequence.step().unwrap(), 0),
        };
    }
    sequence.ids()[9..].to_vec()
}

/// Speculative sampling keeps the distribution: over 2,000 seeds the second and third generated tokens (the first
/// drawn through drafts) fall into the vocabulary's ids as plain sampling's do, a two-sample χ² test at p > 0.01
/// for each position.
#[test]
fn prompt_lookup_sampling_draws_as_plain_sampling_does() {
    let tokenizer = tokenizer::train_char("abcdefgh").unwrap();
    let model = CausalLm::new(&ModelConfig::gpt(8, 1, 2, 8, 32), &mut Rng::new(7), &Device::flex());
    let n = 2000;
    let plain: Vec<Vec<u32>> = (0..n).map(|seed| tokens_after_first(&model, &tokenizer, seed, false)).collect();
    let drafted: Vec<Vec<u32>> = (0..n).map(|seed| tokens_after_first(&model, &tokenizer, seed + n, true)).collect();
    // The 0.99 quantiles of χ² with 1 to 7 degrees of freedom.
    const CHI2_99: [f64; 7] = [6.635, 9.210, 11.345, 13.277, 15.086, 16.812, 18.475];
    for position in 0..2 {
        let count = |runs: &[Vec<u32>]| {
            let mut counts = [0f64; 8];
            runs.iter().filter_map(|r| r.get(position)).for_each(|&t| counts[t as usize] += 1.0);
            counts
        };
        let (a, b) = (count(&plain), count(&drafted));
        let (na, nb): (f64, f64) = (a.iter().sum(), b.iter().sum());
        let cells: Vec<(f64, f64)> = a.into_iter().zip(b).filter(|(x, y)| x + y > 0.0).collect();
        // Two samples of different sizes: Σ (√(nb/na)·a − √(na/nb)·b)² / (a + b).
        let chi2: f64 =
            cells.iter().map(|(x, y)| ((nb / na).sqrt() * x - (na / nb).sqrt() * y).powi(2) / (x + y)).sum();
        let limit = CHI2_99[cells.len() - 2];
        assert!(chi2 < limit, "position {position}: χ² {chi2:.2} ≥ {limit} ({a:?} against {b:?})");
    }
}
