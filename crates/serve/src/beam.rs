//! Translation decoding: beam search over a batch of sentences (beam 1 is greedy decoding), as fairseq keeps its
//! books: each step every live beam proposes its 2k best continuations; one ending in </s> among the k best becomes a
//! finished hypothesis scored by log p(y|x) / lp(y) with GNMT's length penalty lp(y) = ((5 + |y|) / 6)^α; the best
//! k others carry on. A sentence is done when it has k finished hypotheses or reaches its length limit. The encoder
//! runs once per sentence, cross-attention keys/values are computed once, and the decoder's self-attention reads a
//! KV cache whose rows follow the surviving beams.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::nn::cross_attention::Memory;
use ember_core_model::seq2seq::Seq2Seq;

use crate::kv::ContiguousCache;

/// Beam width, length-penalty exponent α, and the tokens that start and end a target sentence.
#[derive(Clone, Copy, Debug)]
pub struct BeamConfig {
    pub beam: usize,
    pub alpha: f64,
    pub bos: u32,
    pub eos: u32,
    /// Target tokens allowed beyond the source length (the limit is source length + this, within the model's).
    pub extra_len: usize,
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
    config: BeamConfig,
    device: &Device,
) -> Vec<Vec<u32>> {
    let (b, k) = (lengths.len(), config.beam.max(1));
    let limit = model.config().model.block_size;
    let max_len: Vec<usize> = lengths.iter().map(|&l| (l + config.extra_len).min(limit)).collect();
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
        let log_p = log_softmax(logits, 1).into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits");
        let mut parents: Vec<usize> = (0..b * k).collect();
        let (mut next_tokens, mut next_scores, mut next_last) = (tokens.clone(), scores.clone(), last.clone());
        for s in 0..b {
            if done[s] {
                continue;
            }
            // The 2k best (score, beam, token) continuations of this sentence's live beams.
            let mut candidates: Vec<(f64, usize, u32)> = Vec::new();
            for j in 0..k {
                let r = s * k + j;
                if scores[r] == f64::NEG_INFINITY {
                    continue;
                }
                let row = &log_p[r * v..(r + 1) * v];
                let mut best: Vec<u32> = (0..v as u32).collect();
                let take = (2 * k).min(v);
                best.select_nth_unstable_by(take - 1, |&a, &c| row[c as usize].total_cmp(&row[a as usize]));
                candidates.extend(best[..take].iter().map(|&t| (scores[r] + row[t as usize] as f64, r, t)));
            }
            candidates.sort_by(|a, c| c.0.total_cmp(&a.0));
            let at_limit = step + 1 >= max_len[s];
            let mut survivors = 0;
            // Continuations ranked above the k-th survivor: those ending in </s> (or at the limit) finish.
            for (rank, (score, r, t)) in candidates.into_iter().enumerate() {
                if finished[s].len() >= k || survivors >= k {
                    break;
                }
                // As in fairseq and transformers, </s> ends a hypothesis only among the k best continuations.
                if t == config.eos && rank >= k {
                    continue;
                }
                if t == config.eos || at_limit {
                    let mut y = tokens[r].clone();
                    if t != config.eos {
                        y.push(t);
                    }
                    let normalized = score / length_penalty(y.len() + 1, config.alpha);
                    finished[s].push(Hypothesis { tokens: y, score: normalized });
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
            done[s] = finished[s].len() >= k || at_limit || survivors == 0;
        }
        cache.reorder(&parents, device);
        (tokens, scores, last) = (next_tokens, next_scores, next_last);
    }
    finished
        .into_iter()
        .map(|hyps| hyps.into_iter().max_by(|a, c| a.score.total_cmp(&c.score)).map(|h| h.tokens).unwrap_or_default())
        .collect()
}
