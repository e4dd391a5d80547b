//! Corpus BLEU as sacreBLEU computes it by default: 13a tokenisation, n-grams up to 4, exponential smoothing of zero
//! n-gram matches, brevity penalty; BLEU = BP · exp(¼ Σ_n log p_n), BP = e^(1 − r/c) when c < r.

use std::collections::HashMap;
use std::fmt;

const MAX_ORDER: usize = 4;

/// Matches and totals of a hypothesis corpus against its references, enough to report BLEU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BleuStats {
    /// Clipped n-gram matches, n = 1..4.
    pub correct: [usize; MAX_ORDER],
    /// Hypothesis n-grams, n = 1..4.
    pub total: [usize; MAX_ORDER],
    pub hyp_len: usize,
    pub ref_len: usize,
}

/// A corpus score, printed like sacreBLEU: `BLEU = 23.45 56.7/30.1/18.2/11.4 (BP = 1.000 ratio = 1.012 ...)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Bleu {
    pub score: f64,
    /// p_n in percent, after smoothing.
    pub precisions: [f64; MAX_ORDER],
    pub brevity_penalty: f64,
    pub stats: BleuStats,
}

impl fmt::Display for Bleu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.precisions;
        let (c, r) = (self.stats.hyp_len, self.stats.ref_len);
        write!(
            f,
            "BLEU = {:.2} {:.1}/{:.1}/{:.1}/{:.1} (BP = {:.3} ratio = {:.3} hyp_len = {c} ref_len = {r})",
            self.score,
            p[0],
            p[1],
            p[2],
            p[3],
            self.brevity_penalty,
            c as f64 / r.max(1) as f64
        )
    }
}

/// sacreBLEU's `13a` tokenizer (mteval-v13a): unescape a few entities, split off punctuation and symbols, split
/// periods and commas unless between digits, split a dash after a digit.
pub fn tokenize_13a(line: &str) -> String {
    let mut line = line.replace("<skipped>", "").replace("-\n", "").replace('\n', " ");
    if line.contains('&') {
        line = line.replace("&quot;", "\"").replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">");
    }
    let chars: Vec<char> = format!(" {line} ").chars().collect();
    // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) → " \1 "
    let symbol = |c: char| matches!(c, '{'..='~' | '['..='`' | ' '..='&' | '('..='+' | ':'..='@' | '/');
    let chars: Vec<char> =
        chars.into_iter().flat_map(|c| if symbol(c) { vec![' ', c, ' '] } else { vec![c] }).collect();
    let digit = |c: char| c.is_ascii_digit();
    let period = |c: char| c == '.' || c == ',';
    // ([^0-9])([\.,]) → "\1 \2 ", then ([\.,])([^0-9]) → " \1 \2", then ([0-9])(-) → "\1 \2 ": each left to right,
    // matches not overlapping, as re.sub does.
    let chars = substitute(&chars, |a, b| !digit(a) && period(b), |a, b| vec![a, ' ', b, ' ']);
    let chars = substitute(&chars, |a, b| period(a) && !digit(b), |a, b| vec![' ', a, ' ', b]);
    let chars = substitute(&chars, |a, b| digit(a) && b == '-', |a, b| vec![a, ' ', b, ' ']);
    chars.into_iter().collect::<String>().split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Replaces each non-overlapping pair (a, b) matching `when`, scanning left to right.
fn substitute(chars: &[char], when: impl Fn(char, char) -> bool, by: impl Fn(char, char) -> Vec<char>) -> Vec<char> {
    let mut out = Vec::with_capacity(chars.len() + chars.len() / 4);
    let mut i = 0;
    while i < chars.len() {
        if i + 1 < chars.len() && when(chars[i], chars[i + 1]) {
            out.extend(by(chars[i], chars[i + 1]));
            i += 2;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

fn ngrams(words: &[&str], n: usize) -> HashMap<Vec<String>, usize> {
    let mut counts = HashMap::new();
    for gram in words.windows(n) {
        *counts.entry(gram.iter().map(|w| w.to_string()).collect()).or_insert(0) += 1;
    }
    counts
}

impl BleuStats {
    /// Adds one tokenised sentence pair.
    pub fn add(&mut self, hypothesis: &str, reference: &str) {
        let hyp: Vec<&str> = hypothesis.split_whitespace().collect();
        let reference: Vec<&str> = reference.split_whitespace().collect();
        self.hyp_len += hyp.len();
        self.ref_len += reference.len();
        for n in 1..=MAX_ORDER {
            let (h, r) = (ngrams(&hyp, n), ngrams(&reference, n));
            self.total[n - 1] += hyp.len().saturating_sub(n - 1);
            self.correct[n - 1] += h.iter().map(|(g, &c)| c.min(r.get(g).copied().unwrap_or(0))).sum::<usize>();
        }
    }

    /// p_n = 100 · correct_n / total_n, a zero match count smoothed to 100 / (2^k · total_n) for the k-th such n;
    /// BP = e^(1 − r/c) when c < r.
    pub fn score(&self) -> Bleu {
        let mut precisions = [0.0; MAX_ORDER];
        let mut smooth = 1.0;
        for ((p, &correct), &total) in precisions.iter_mut().zip(&self.correct).zip(&self.total) {
            if total == 0 {
                break;
            }
            *p = if correct == 0 {
                smooth *= 2.0;
                100.0 / (smooth * total as f64)
            } else {
                100.0 * correct as f64 / total as f64
            };
        }
        let (c, r) = (self.hyp_len as f64, self.ref_len as f64);
        let brevity_penalty = match () {
            _ if c >= r => 1.0,
            _ if c == 0.0 => 0.0,
            _ => (1.0 - r / c).exp(),
        };
        let log = |p: f64| if p == 0.0 { -9_999_999_999.0 } else { p.ln() };
        let mean = precisions.iter().map(|&p| log(p)).sum::<f64>() / MAX_ORDER as f64;
        Bleu { score: brevity_penalty * mean.exp(), precisions, brevity_penalty, stats: self.clone() }
    }
}

/// Corpus BLEU of hypotheses against one reference each, both untokenised.
pub fn corpus_bleu<'a>(
    hypotheses: impl IntoIterator<Item = &'a str>,
    references: impl IntoIterator<Item = &'a str>,
) -> Bleu {
    let mut stats = BleuStats::default();
    for (h, r) in hypotheses.into_iter().zip(references) {
        stats.add(&tokenize_13a(h), &tokenize_13a(r));
    }
    stats.score()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thirteen_a_splits_punctuation_but_keeps_numbers_whole() {
        assert_eq!(
            tokenize_13a("Hello, world! It costs $1,000.50 (3-4 days)."),
            "Hello , world ! It costs $ 1,000.50 ( 3 - 4 days ) ."
        );
        assert_eq!(tokenize_13a("&quot;Yes&quot; &amp; no"), "\" Yes \" & no");
    }

    #[test]
    fn identical_corpora_score_100_and_an_empty_hypothesis_0() {
        let refs = ["the cat sat on the mat", "a dog barked at the moon tonight"];
        assert!((corpus_bleu(refs, refs).score - 100.0).abs() < 1e-9);
        assert_eq!(corpus_bleu(["", ""], refs).score, 0.0);
    }
}
