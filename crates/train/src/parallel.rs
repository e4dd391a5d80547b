//! Parallel text for translation: sentence pairs from a TSV file (`source<TAB>target`) or two line-aligned files,
//! byte-level BPE vocabularies (one joint over both sides, or one per side), and batches formed by token count from length-sorted buckets.

use std::path::Path;

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::Rng;
use ember_core_model::tokenizer::{self, TokenizerError};
use ember_formats::tsv;
use tokenizers::Tokenizer;

use crate::corpus::{CorpusError, read_text};

/// Padding, beginning and end of sentence: ids 0, 1, 2 of every translation vocabulary.
pub const PAD: u32 = 0;
pub const BOS: u32 = 1;
pub const EOS: u32 = 2;
pub const SPECIALS: [&str; 3] = ["<pad>", "<s>", "</s>"];

#[derive(Debug, thiserror::Error)]
pub enum ParallelError {
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error("{path}:{line}: no tab between source and target")]
    NoTab { path: String, line: usize },
    #[error("{source_path} has {sources} lines but {target_path} has {targets}: they must be line-aligned")]
    Misaligned { source_path: String, sources: usize, target_path: String, targets: usize },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// Sentence pairs of a TSV file: each line `source<TAB>target` (further tabs belong to the target).
pub fn read_tsv(path: &Path) -> Result<Vec<(String, String)>, ParallelError> {
    tsv::pairs(&read_text(path)?).map_err(|line| ParallelError::NoTab { path: path.display().to_string(), line })
}

/// Sentence pairs of two line-aligned files.
pub fn read_aligned(source: &Path, target: &Path) -> Result<Vec<(String, String)>, ParallelError> {
    tsv::aligned(&read_text(source)?, &read_text(target)?).map_err(|(sources, targets)| ParallelError::Misaligned {
        source_path: source.display().to_string(),
        sources,
        target_path: target.display().to_string(),
        targets,
    })
}

/// The tokenizers of source and target sentences: the same joint BPE, or one BPE per side.
#[derive(Clone)]
pub struct Vocabularies {
    pub source: Tokenizer,
    pub target: Tokenizer,
    pub joint: bool,
    /// The token a translation starts from and the one that ends a sentence ([`BOS`] and [`EOS`] for Ember's own;
    /// an imported model's may differ).
    pub bos: u32,
    pub eos: u32,
}

impl Vocabularies {
    /// Byte-level BPEs of `vocab_size` tokens each, <pad>, <s>, </s> first: one over both sides of `pairs` when
    /// `joint` (fairseq's joined dictionary), else one over the sources and one over the targets.
    pub fn train(pairs: &[(String, String)], vocab_size: usize, joint: bool) -> Result<Self, ParallelError> {
        let bpe = |lines: Vec<&str>| tokenizer::train_bpe_lines(lines.into_iter(), vocab_size, &SPECIALS);
        if joint {
            let both = bpe(pairs.iter().flat_map(|(s, t)| [s.as_str(), t.as_str()]).collect())?;
            return Ok(Self { source: both.clone(), target: both, joint, bos: BOS, eos: EOS });
        }
        let source = bpe(pairs.iter().map(|(s, _)| s.as_str()).collect())?;
        let target = bpe(pairs.iter().map(|(_, t)| t.as_str()).collect())?;
        Ok(Self { source, target, joint, bos: BOS, eos: EOS })
    }

    /// Source and target vocabulary sizes.
    pub fn sizes(&self) -> (usize, usize) {
        (self.source.get_vocab_size(true), self.target.get_vocab_size(true))
    }
}

/// Token ids of a source sentence and of its target (no specials).
pub type Pair = (Vec<u32>, Vec<u32>);

/// Token ids of a sentence (no specials).
pub fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, ParallelError> {
    let encoding = tok.encode(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
    Ok(encoding.get_ids().to_vec())
}

/// Encoded pairs, with those longer than `max_len` tokens on either side (after adding </s>) dropped and counted.
pub fn encode_pairs(
    vocab: &Vocabularies,
    pairs: &[(String, String)],
    max_len: usize,
) -> Result<(Vec<Pair>, usize), ParallelError> {
    let mut kept = Vec::with_capacity(pairs.len());
    for (s, t) in pairs {
        let (s, t) = (encode(&vocab.source, s)?, encode(&vocab.target, t)?);
        // </s> takes one more position on each side.
        if s.len() < max_len && t.len() < max_len {
            kept.push((s, t));
        }
    }
    let dropped = pairs.len() - kept.len();
    Ok((kept, dropped))
}

/// Batches of pair indices holding at most `max_tokens` tokens each (rows × longest side, padding included): pairs
/// sorted by length are cut into consecutive batches, whose order `rng` shuffles every epoch.
pub fn token_batches(pairs: &[Pair], max_tokens: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.sort_by_key(|&i| (pairs[i].0.len(), pairs[i].1.len()));
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut longest = 0;
    for i in order {
        let len = pairs[i].0.len().max(pairs[i].1.len()) + 1;
        if !current.is_empty() && (current.len() + 1) * longest.max(len) > max_tokens {
            batches.push(std::mem::take(&mut current));
            longest = 0;
        }
        current.push(i);
        longest = longest.max(len);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    for i in (1..batches.len()).rev() {
        batches.swap(i, rng.below(i + 1));
    }
    batches
}

/// One padded batch: source [B, S] (x </s>), its lengths, decoder input [B, T] (<s> y), target [B, T] (y </s>)
/// and the target mask [B, T] (1 on real tokens).
pub struct PairBatch {
    pub src: Tensor<2, Int>,
    pub src_lengths: Vec<usize>,
    pub tgt_in: Tensor<2, Int>,
    pub tgt_out: Tensor<2, Int>,
    pub mask: Tensor<2>,
    /// Target tokens (</s> included).
    pub tokens: usize,
}

/// Source sentences as the encoder takes them: each x followed by `eos`, padded into [B, S], with their lengths.
pub fn source_batch(sources: &[&[u32]], eos: u32, device: &Device) -> (Tensor<2, Int>, Vec<usize>) {
    let b = sources.len();
    let s = sources.iter().map(|x| x.len() + 1).max().unwrap_or(1);
    let mut src = vec![PAD as i64; b * s];
    for (r, x) in sources.iter().enumerate() {
        for (j, &id) in x.iter().chain([&eos]).enumerate() {
            src[r * s + j] = id as i64;
        }
    }
    let lengths = sources.iter().map(|x| x.len() + 1).collect();
    (Tensor::from_data(TensorData::new(src, [b, s]), device), lengths)
}

impl PairBatch {
    pub fn new(pairs: &[Pair], rows: &[usize], device: &Device) -> Self {
        let b = rows.len();
        let sources: Vec<&[u32]> = rows.iter().map(|&i| pairs[i].0.as_slice()).collect();
        let (src, src_lengths) = source_batch(&sources, EOS, device);
        let t = rows.iter().map(|&i| pairs[i].1.len() + 1).max().unwrap_or(1);
        let (mut tgt_in, mut tgt_out, mut mask) = (vec![PAD as i64; b * t], vec![PAD as i64; b * t], vec![0f32; b * t]);
        for (r, &i) in rows.iter().enumerate() {
            let y = &pairs[i].1;
            for (j, &id) in [&BOS].into_iter().chain(y).enumerate() {
                tgt_in[r * t + j] = id as i64;
            }
            for (j, &id) in y.iter().chain([&EOS]).enumerate() {
                tgt_out[r * t + j] = id as i64;
                mask[r * t + j] = 1.0;
            }
        }
        let ids = |v: Vec<i64>, cols: usize| Tensor::<2, Int>::from_data(TensorData::new(v, [b, cols]), device);
        let tokens = mask.iter().filter(|&&m| m > 0.0).count();
        Self {
            src,
            src_lengths,
            tgt_in: ids(tgt_in, t),
            tgt_out: ids(tgt_out, t),
            mask: Tensor::from_data(TensorData::new(mask, [b, t]), device),
            tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_the_token_budget_and_cover_every_pair_once() {
        let mut rng = Rng::new(1);
        let pairs: Vec<Pair> = (0..200).map(|i| (vec![5; 1 + i % 37], vec![6; 1 + (i * 7) % 41])).collect();
        let batches = token_batches(&pairs, 256, &mut rng);
        let mut seen: Vec<usize> = batches.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..200).collect::<Vec<_>>());
        for batch in &batches {
            let longest = batch.iter().map(|&i| pairs[i].0.len().max(pairs[i].1.len()) + 1).max().unwrap();
            assert!(batch.len() * longest <= 256 || batch.len() == 1, "{} × {longest}", batch.len());
        }
    }

    #[test]
    fn a_batch_pads_sources_and_shifts_targets() {
        let pairs = vec![(vec![10, 11], vec![20]), (vec![12], vec![21, 22, 23])];
        let batch = PairBatch::new(&pairs, &[0, 1], &Device::flex());
        let v = |t: Tensor<2, Int>| t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        assert_eq!(v(batch.src), vec![10, 11, 2, 12, 2, 0]);
        assert_eq!(batch.src_lengths, vec![3, 2]);
        assert_eq!(v(batch.tgt_in), vec![1, 20, 0, 0, 1, 21, 22, 23]);
        assert_eq!(v(batch.tgt_out), vec![20, 2, 0, 0, 21, 22, 23, 2]);
        assert_eq!(batch.tokens, 6);
    }
}
