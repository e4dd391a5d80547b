//! Translation decoding: beam search over a batch of sentences (beam 1 is greedy decoding). Each step every live
//! beam proposes its 2k best continuations; one ending in </s> among the k best becomes a finished hypothesis, the
//! best k others carry on. Two rules keep the books ([`Search`]): fairseq's (GNMT's length penalty, a sentence done at
//! k finished) and transformers' `generate()` (log p / |y|^α, the k best finished kept, its `early_stopping` test).
//! The encoder runs once per sentence, cross-attention keys/values are computed once, and the decoder's
//! self-attention reads a KV cache whose rows follow the surviving beams.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::nn::cross_attention::Memory;
use ember_core_model::seq2seq::Seq2Seq;
use ember_formats::generation::EarlyStopping;

use crate::kv::ContiguousCache;

/// How finished hypotheses are scored and when a sentence is done.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Search {
    /// fairseq: log p(y|x) / ((5 + |y|) / 6)^α with |y| counting </s>; done once k hypotheses have ended.
    Fairseq,
    /// transformers' `generate()`: log p(y|x) / |y|^α over the generated tokens; the k best finished are kept and
    /// the sentence ends as `early_stopping` says.
    Transformers(EarlyStopping),
}

/// How many tokens a translation may have.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// The source's length + n (fairseq's `max_len_b`).
    PastSource(usize),
    /// n, whatever the source (transformers' `max_new_tokens`).
    Tokens(usize),
}

/// Beam width, length-penalty exponent α, the rule, and the tokens that start, end and may not appear in a sentence.
#[derive(Clone, Debug)]
pub struct BeamConfig {
    pub beam: usize,
    pub alpha: f64,
    pub search: Search,
    pub bos: u32,
    pub eos: u32,
    /// Within the model's positions either way.
    pub limit: Limit,
    /// Tokens given log p = −∞ at every step (Marian bans its pad).
    pub banned: Vec<u32>,
    /// At the last allowed step every hypothesis ends in </s> (log p = 0), as transformers' forced EOS does.
    pub forced_eos: bool,
}

/// GNMT's length penalty ((5 + |y|) / 6)^α.
pub fn length_penalty(len: usize, alpha: f64) -> f64 {
    ((5.0 + len as f64) / 6.0).powf(alpha)
}

struct Hypothesis {
    tokens: Vec<u32>,
    score: f64,
}

/// The best translation (target ids without </s>) of each source sentence [B, S] with `lengths` real tokens.
pub fn translate_batch(
    model: &Seq2Seq,
    src: Tensor<2, Int>,
    lengths: &[usize],
    config: &BeamConfig,
    device: &Device,
) -> Vec<Vec<u32>> {
    let (b, k) = (lengths.len(), config.beam.max(1));
    let limit = model.config().model.block_size;
    let max_len: Vec<usize> = lengths
        .iter()
        .map(|&l| match config.limit {
            Limit::PastSource(n) => l.saturating_add(n),
            Limit::Tokens(n) => n,
        })
        .map(|n| n.min(limit))
        .collect();
    // Each sentence's memory repeated for its k beams: row b·k + j.
    let expand: Vec<i64> = (0..b * k).map(|r| (r / k) as i64).collect();
    let expand = Tensor::<1, Int>::from_data(TensorData::new(expand, [b * k]), device);
    let memories: Vec<Memory> = model
        .encode(src, lengths)
        .into_iter()
        .map(|m| Memory {
            k: m.k.select(0, expand.clone()),
            v: m.v.select(0, expand.clone()),
            lengths: (0..b * k).map(|r| m.lengths[r / k]).collect(),
        })
        .collect();
    let mut cache = ContiguousCache::new(16);
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); b * k];
    // Only the first beam of a sentence is live at the start: the others would repeat it.
    let mut scores: Vec<f64> = (0..b * k).map(|r| if r % k == 0 { 0.0 } else { f64::NEG_INFINITY }).collect();
    let mut finished: Vec<Vec<Hypothesis>> = (0..b).map(|_| Vec::new()).collect();
    let mut done = vec![false; b];
    let mut last: Vec<u32> = vec![config.bos; b * k];
    for step in 0..limit {
        if done.iter().all(|&d| d) {
            break;
        }
        let input =
            Tensor::<2, Int>::from_data(TensorData::new(last.iter().map(|&t| t as i64).collect(), [b * k, 1]), device);
        let logits = model.decode_step(&memories, input, &mut cache);
        let v = logits.dims()[1];
        let mut log_p = log_softmax(logits, 1).into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits");
        for row in log_p.chunks_mut(v) {
            for &t in &config.banned {
                row[t as usize] = f32::NEG_INFINITY;
            }
        }
        let mut parents: Vec<usize> = (0..b * k).collect();
        let (mut next_tokens, mut next_scores, mut next_last) = (tokens.clone(), scores.clone(), last.clone());
        for s in 0..b {
            if done[s] {
                continue;
            }
            let at_limit = step + 1 >= max_len[s];
            // The 2k best (score, beam, token) continuations of this sentence's live beams.
            let mut candidates: Vec<(f64, usize, u32)> = Vec::new();
            for j in 0..k {
                let r = s * k + j;
                if scores[r] == f64::NEG_INFINITY {
                    continue;
                }
                let row = &mut log_p[r * v..(r + 1) * v];
                if at_limit && config.forced_eos {
                    row.fill(f32::NEG_INFINITY);
                    row[config.eos as usize] = 0.0;
                }
                let mut best: Vec<u32> = (0..v as u32).collect();
                let take = (2 * k).min(v);
                best.select_nth_unstable_by(take - 1, |&a, &c| row[c as usize].total_cmp(&row[a as usize]));
                let live = best[..take].iter().filter(|&&t| row[t as usize] > f32::NEG_INFINITY);
                candidates.extend(live.map(|&t| (scores[r] + row[t as usize] as f64, r, t)));
            }
            candidates.sort_by(|a, c| c.0.total_cmp(&a.0));
            let hyps = &mut finished[s];
            let mut survivors = 0;
            for (rank, (score, r, t)) in candidates.into_iter().enumerate() {
                if survivors >= k || (config.search == Search::Fairseq && hyps.len() >= k) {
                    break;
                }
                if t == config.eos || at_limit {
                    // As in fairseq and transformers, a hypothesis ends only among the k best continuations.
                    if rank < k {
                        let mut y = tokens[r].clone();
                        if t != config.eos {
                            y.push(t);
                        }
                        let score = match config.search {
                            Search::Fairseq => score / length_penalty(y.len() + 1, config.alpha),
                            Search::Transformers(_) => score / ((step + 1) as f64).powf(config.alpha),
                        };
                        hyps.push(Hypothesis { tokens: y, score });
                    }
                } else {
                    let slot = s * k + survivors;
                    parents[slot] = r;
                    next_tokens[slot] = tokens[r].iter().copied().chain([t]).collect();
                    next_scores[slot] = score;
                    next_last[slot] = t;
                    survivors += 1;
                }
            }
            next_scores[s * k + survivors..(s + 1) * k].fill(f64::NEG_INFINITY);
            let full = match config.search {
                Search::Fairseq => hyps.len() >= k,
                Search::Transformers(stopping) => {
                    // The k best finished stay; done when the best live beam cannot beat the worst of them.
                    hyps.sort_by(|a, c| c.score.total_cmp(&a.score));
                    hyps.truncate(k);
                    let length = match stopping {
                        EarlyStopping::Never if config.alpha > 0.0 => max_len[s],
                        _ => step + 1,
                    };
                    let best_live = next_scores[s * k] / (length as f64).powf(config.alpha);
                    hyps.len() >= k
                        && (stopping == EarlyStopping::Done || hyps.last().is_some_and(|h| best_live <= h.score))
                }
            };
            done[s] = full || at_limit || survivors == 0;
        }
        cache.reorder(&parents, device);
        (tokens, scores, last) = (next_tokens, next_scores, next_last);
    }
    finished
        .into_iter()
        .map(|hyps| hyps.into_iter().max_by(|a, c| a.score.total_cmp(&c.score)).map(|h| h.tokens).unwrap_or_default())
        .collect()
}
