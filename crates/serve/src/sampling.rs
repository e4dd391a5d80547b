//! Drawing the next token from a model's logits as a request's [`Sampling`] says (penalties, temperature, top-k,
//! top-p), and the log-probabilities the completions APIs report.

use std::collections::{HashMap, HashSet};

use ember_formats::request::Sampling;
use ember_formats::rng::Rng;

/// The index of the largest value (the first of equals), as a token id.
pub fn argmax<T: PartialOrd + Copy>(values: &[T]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// A generated token's log-probability under the model and the `top` most likely alternatives, as the completions
/// APIs report them.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// log softmax(z)_chosen and the `top` largest entries of log softmax(z): the model's own distribution, before the
/// temperature and penalties shape the draw (as vLLM reports logprobs).
pub fn logprobs(logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = max + logits.iter().map(|&z| (z as f64 - max).exp()).sum::<f64>().ln();
    let logprob = |id: usize| (logits[id] as f64 - log_sum) as f32;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let top = top.min(logits.len());
    if top > 0 {
        order.select_nth_unstable_by(top - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
    }
    order.truncate(top);
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    TokenLogprob {
        id: chosen,
        logprob: logprob(chosen as usize),
        top: order.into_iter().map(|i| (i as u32, logprob(i))).collect(),
    }
}

/// What the penalties look at, kept as tokens are added, so that a step costs the distinct tokens seen, not the
/// whole sequence: the tokens that appeared (prompt included) and how often each was generated.
#[derive(Clone, Debug, Default)]
pub struct History {
    seen: HashSet<u32>,
    generated: HashMap<u32, f64>,
}

impl History {
    /// The history of `ids`, of which the first `prompt_len` are the prompt.
    pub fn new(ids: &[u32], prompt_len: usize) -> Self {
        let mut history = Self::default();
        ids.iter().enumerate().for_each(|(i, &id)| history.push(id, i >= prompt_len));
        history
    }

    pub fn push(&mut self, id: u32, generated: bool) {
        self.seen.insert(id);
        if generated {
            *self.generated.entry(id).or_default() += 1.0;
        }
    }
}

/// The next token after `history`: logits of tokens in it are penalised (`repetition_penalty`), those of generated
/// tokens lowered by the frequency and presence penalties, then the argmax when `temperature` is 0, else a draw from
/// softmax(z / temperature) restricted to the `top_k` largest logits and then to the smallest set whose probability
/// reaches `top_p`.
pub fn sample(logits: &[f32], settings: &Sampling, history: &History, rng: &mut Rng) -> u32 {
    sample_among(logits, settings, history, rng, |_| true).expect("every token is allowed")
}

/// [`sample`] restricted to the tokens `allowed` admits, after top-k and top-p have chosen the candidates: the draw
/// is from the sampler's own distribution conditioned on an allowed token (greedy: the largest allowed logit). None
/// when no candidate is allowed.
pub fn sample_among(
    logits: &[f32],
    settings: &Sampling,
    history: &History,
    rng: &mut Rng,
    allowed: impl Fn(u32) -> bool,
) -> Option<u32> {
    let z = penalised(logits, settings, history);
    if settings.temperature == 0.0 {
        return argmax_among(&z, allowed);
    }
    let mut candidates = Candidates::new(&z, settings);
    let (kept, order) = (candidates.kept, &candidates.ranking.order);
    let every = (0..kept).all(|rank| allowed(order[rank] as u32));
    let kept_total = if kept == order.len() && every {
        candidates.total
    } else {
        order[..kept].iter().filter(|&&i| allowed(i as u32)).map(|&i| candidates.weight(i)).sum()
    };
    if kept_total == 0.0 {
        return None;
    }
    let mut u = rng.uniform() * kept_total;
    let mut last = None;
    for rank in 0..kept {
        let i = candidates.ranking.at(rank);
        if !allowed(i as u32) {
            continue;
        }
        let w = candidates.weight(i);
        if u < w {
            return Some(i as u32);
        }
        u -= w;
        last = Some(i as u32);
    }
    last
}

/// The probability that [`sample`] draws `token` from `logits` (1 or 0 when greedy).
pub fn probability(logits: &[f32], settings: &Sampling, history: &History, token: u32) -> f64 {
    let z = penalised(logits, settings, history);
    if settings.temperature == 0.0 {
        return f64::from(argmax_among(&z, |_| true) == Some(token));
    }
    let candidates = Candidates::new(&z, settings);
    let kept = &candidates.ranking.order[..candidates.kept];
    if !kept.contains(&(token as usize)) {
        return 0.0;
    }
    let kept_total: f64 = if candidates.kept == candidates.ranking.order.len() {
        candidates.total
    } else {
        kept.iter().map(|&i| candidates.weight(i)).sum()
    };
    candidates.weight(token as usize) / kept_total
}

/// The logits z with the penalties of `history` applied: repetition (z / θ where z > 0, z · θ otherwise, over every
/// token seen), frequency and presence (z_j − α_f · c_j − α_p over the generated ones).
fn penalised(logits: &[f32], settings: &Sampling, history: &History) -> Vec<f64> {
    let mut z: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
    let theta = settings.repetition_penalty;
    if theta != 1.0 {
        for &t in &history.seen {
            if let Some(zi) = z.get_mut(t as usize) {
                *zi = if *zi > 0.0 { *zi / theta } else { *zi * theta };
            }
        }
    }
    let (alpha_f, alpha_p) = (settings.frequency_penalty, settings.presence_penalty);
    if alpha_f != 0.0 || alpha_p != 0.0 {
        for (&t, &c) in &history.generated {
            if let Some(zi) = z.get_mut(t as usize) {
                *zi -= alpha_f * c + alpha_p;
            }
        }
    }
    z
}

/// The largest value among the ids `allowed` admits (the first of equals).
fn argmax_among(z: &[f64], allowed: impl Fn(u32) -> bool) -> Option<u32> {
    let best = z.iter().enumerate().filter(|&(i, _)| allowed(i as u32));
    best.fold(None, |best: Option<(usize, f64)>, (i, &v)| match best {
        Some((_, b)) if b >= v => best,
        _ => Some((i, v)),
    })
    .map(|(i, _)| i as u32)
}

/// What a draw chooses among: the ids by rank, the first `kept` of them after top-k and top-p, weighted
/// exp((z − z_max) / T), with `total` the weight of all top-k ids.
struct Candidates<'a> {
    z: &'a [f64],
    ranking: Ranking<'a>,
    kept: usize,
    z_max: f64,
    temperature: f64,
    total: f64,
}

impl<'a> Candidates<'a> {
    fn new(z: &'a [f64], settings: &Sampling) -> Self {
        let mut ranking = Ranking::new(z, settings.top_k.unwrap_or(z.len()));
        let z_max = z[ranking.at(0)];
        let mut candidates =
            Self { z, kept: ranking.order.len(), ranking, z_max, temperature: settings.temperature, total: 0.0 };
        candidates.total = candidates.ranking.order.iter().map(|&i| candidates.weight(i)).sum();
        if let Some(p) = settings.top_p {
            let mut mass = 0.0;
            for rank in 0..candidates.kept {
                let i = candidates.ranking.at(rank);
                mass += candidates.weight(i) / candidates.total;
                if mass >= p {
                    candidates.kept = rank + 1;
                    break;
                }
            }
        }
        candidates
    }

    fn weight(&self, i: usize) -> f64 {
        ((self.z[i] - self.z_max) / self.temperature).exp()
    }
}

/// How many of the most likely tokens are sorted before a draw: at usual temperatures they hold nearly all the
/// mass, so the rest of the vocabulary (49,152 tokens for SmolLM2) is sorted only when a draw walks past them.
const SORTED_FIRST: usize = 256;

/// The `k` largest logits' ids, largest first and ties by id (a stable sort's order), sorted only as far as they
/// are read.
struct Ranking<'a> {
    z: &'a [f64],
    order: Vec<usize>,
    sorted: usize,
}

/// Id a before id b when its logit is larger, or equal and a < b.
fn by_rank(z: &[f64], a: usize, b: usize) -> std::cmp::Ordering {
    z[b].total_cmp(&z[a]).then(a.cmp(&b))
}

impl<'a> Ranking<'a> {
    fn new(z: &'a [f64], k: usize) -> Self {
        let mut order: Vec<usize> = (0..z.len()).collect();
        let by_rank = |a: &usize, b: &usize| by_rank(z, *a, *b);
        let k = k.clamp(1, z.len());
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, by_rank);
            order.truncate(k);
        }
        let sorted = SORTED_FIRST.min(k);
        if sorted < order.len() {
            order.select_nth_unstable_by(sorted - 1, by_rank);
        }
        order[..sorted].sort_unstable_by(by_rank);
        Self { z, order, sorted }
    }

    /// The id ranked `rank` (0: the largest logit), sorting the rest first when it lies past the sorted head.
    fn at(&mut self, rank: usize) -> usize {
        if rank >= self.sorted {
            let z = self.z;
            self.order[self.sorted..].sort_unstable_by(|a, b| by_rank(z, *a, *b));
            self.sorted = self.order.len();
        }
        self.order[rank]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_top1_and_frequencies_follow_softmax() {
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let mut rng = Rng::new(1);
        let with = |temperature: f64, top_k: Option<usize>| Sampling { temperature, top_k, ..Default::default() };
        assert_eq!(sample(&logits, &with(0.0, None), &History::default(), &mut rng), 1);
        assert!((0..50).all(|_| sample(&logits, &with(1.0, Some(1)), &History::default(), &mut rng) == 1));
        let mut counts = [0usize; 4];
        let n = 40_000;
        for _ in 0..n {
            counts[sample(&logits, &with(1.0, Some(2)), &History::default(), &mut rng) as usize] += 1;
        }
        assert_eq!(counts[0] + counts[3], 0, "top-k excludes the rest");
        let p1 = counts[1] as f64 / n as f64;
        let expect = 1.0 / (1.0 + (-1f64).exp());
        assert!((p1 - expect).abs() < 0.01, "{p1} vs {expect}");
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus_and_repetition_is_penalised() {
        // Probabilities ∝ e^(2, 1, 0, -1): 0.644, 0.237, 0.087, 0.032.
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut rng = Rng::new(2);
        let nucleus = Sampling { temperature: 1.0, top_p: Some(0.85), ..Default::default() };
        let mut seen = [false; 4];
        for _ in 0..2000 {
            seen[sample(&logits, &nucleus, &History::default(), &mut rng) as usize] = true;
        }
        assert_eq!(seen, [true, true, false, false], "0.644 + 0.237 ≥ 0.85: the top two only");
        let greedy = Sampling { temperature: 0.0, repetition_penalty: 4.0, ..Default::default() };
        assert_eq!(sample(&logits, &greedy, &History::new(&[0], 0), &mut rng), 1, "2/4 < 1: the penalised token loses");
        assert_eq!(sample(&logits, &greedy, &History::default(), &mut rng), 0);
        // Once per token however often it occurs, as transformers applies it: 2/1.5 = 1.33 > 1.
        let mild = Sampling { temperature: 0.0, repetition_penalty: 1.5, ..Default::default() };
        assert_eq!(sample(&logits, &mild, &History::new(&[0, 0, 0], 0), &mut rng), 0);
    }

    #[test]
    fn logprobs_are_log_softmax_with_the_top_alternatives_in_order() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let total: f64 = logits.iter().map(|&z| (z as f64).exp()).sum();
        let lp = logprobs(&logits, 2, 2);
        assert!((lp.logprob as f64 - (-total.ln())).abs() < 1e-6, "{lp:?}");
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1]);
        assert!((lp.top[0].1 as f64 - (2.0 - total.ln())).abs() < 1e-6);
        assert_eq!(logprobs(&logits, 0, 0).top, []);
        assert_eq!(logprobs(&logits, 0, 9).top.len(), 4);
    }

    #[test]
    fn frequency_and_presence_penalties_count_generated_tokens_only() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut rng = Rng::new(3);
        let frequency = Sampling { temperature: 0.0, frequency_penalty: 0.6, ..Default::default() };
        // Token 0 once in the prompt and once generated: 2 − 0.6 = 1.4 > 1.
        assert_eq!(sample(&logits, &frequency, &History::new(&[0, 0], 1), &mut rng), 0);
        // Generated twice: 2 − 1.2 = 0.8 < 1.
        assert_eq!(sample(&logits, &frequency, &History::new(&[0, 0], 0), &mut rng), 1);
        let presence = Sampling { temperature: 0.0, presence_penalty: 1.5, ..Default::default() };
        // 2 − 1.5 = 0.5 whatever the count.
        assert_eq!(sample(&logits, &presence, &History::new(&[3, 0], 1), &mut rng), 1);
        assert_eq!(sample(&logits, &presence, &History::new(&[0, 3], 1), &mut rng), 0);
    }

    /// Draws through the partly sorted ranking equal draws through a full stable sort of the vocabulary (the order
    /// before ranking was lazy), with ties, with and without top-k / top-p, at temperatures whose draws stop inside
    /// the sorted head and far past it.
    #[test]
    fn lazily_ranked_draws_equal_fully_sorted_ones() {
        let mut rng = Rng::new(9);
        let logits: Vec<f32> = (0..5000).map(|i| if i % 97 == 0 { 3.0 } else { (rng.normal() * 2.0) as f32 }).collect();
        let full = |settings: &Sampling, rng: &mut Rng| -> u32 {
            let z: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
            let mut order: Vec<usize> = (0..z.len()).collect();
            order.sort_by(|&a, &b| z[b].total_cmp(&z[a]));
            order.truncate(settings.top_k.unwrap_or(z.len()).min(z.len()));
            let mut weights: Vec<f64> =
                order.iter().map(|&i| ((z[i] - z[order[0]]) / settings.temperature).exp()).collect();
            if let Some(p) = settings.top_p {
                let total: f64 = weights.iter().sum();
                let mut mass = 0.0;
                let keep = weights.iter().position(|w| {
                    mass += w / total;
                    mass >= p
                });
                weights.truncate(keep.map_or(weights.len(), |i| i + 1));
            }
            let mut u = rng.uniform() * weights.iter().sum::<f64>();
            for (&i, w) in order.iter().zip(&weights) {
                if u < *w {
                    return i as u32;
                }
                u -= w;
            }
            order[weights.len() - 1] as u32
        };
        for (temperature, top_k, top_p) in [
            (0.7, None, None),
            (5.0, None, None),
            (2.0, Some(1000), None),
            (3.0, None, Some(0.95)),
            (1.0, Some(40), Some(0.9)),
        ] {
            let settings = Sampling { temperature, top_k, top_p, ..Default::default() };
            let (mut a, mut b) = (Rng::new(1), Rng::new(1));
            let draws: Vec<(u32, u32)> = (0..300)
                .map(|_| (sample(&logits, &settings, &History::default(), &mut a), full(&settings, &mut b)))
                .collect();
            assert!(draws.iter().all(|(x, y)| x == y), "T={temperature} k={top_k:?} p={top_p:?}");
            // The draws reach past the sorted head where the temperature spreads the mass.
            if temperature >= 5.0 {
                let ranks: Vec<usize> =
                    draws.iter().map(|&(x, _)| logits.iter().filter(|&&l| l > logits[x as usize]).count()).collect();
                assert!(ranks.iter().any(|&r| r >= SORTED_FIRST), "no draw past rank {SORTED_FIRST}");
            }
        }
    }
}
