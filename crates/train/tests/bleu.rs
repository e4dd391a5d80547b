//! Corpus BLEU equals the sacrebleu package's (2.6, default: 13a tokenisation, exp smoothing) within 0.01 on fixtures
//! made by `scripts/reference/bleu_fixture.py`: matches, totals and lengths exactly, and the 13a tokens of tricky
//! lines (numbers, entities, URLs, non-ASCII punctuation).

use ember_train::bleu::{corpus_bleu, tokenize_13a};
use serde_json::Value;

#[test]
fn corpus_bleu_equals_sacrebleu_within_0_01() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bleu/cases.json")).unwrap();
    let fixture: Value = serde_json::from_str(&text).unwrap();
    let strings = |v: &Value| v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect::<Vec<_>>();
    let numbers = |v: &Value| v.as_array().unwrap().iter().map(|n| n.as_u64().unwrap() as usize).collect::<Vec<_>>();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let (hyps, refs) = (strings(&case["hyps"]), strings(&case["refs"]));
        let bleu = corpus_bleu(hyps.iter().map(String::as_str), refs.iter().map(String::as_str));
        assert_eq!(bleu.stats.correct.to_vec(), numbers(&case["correct"]), "{name}: matches");
        assert_eq!(bleu.stats.total.to_vec(), numbers(&case["total"]), "{name}: totals");
        assert_eq!(bleu.stats.hyp_len as u64, case["hyp_len"].as_u64().unwrap(), "{name}: hypothesis length");
        assert_eq!(bleu.stats.ref_len as u64, case["ref_len"].as_u64().unwrap(), "{name}: reference length");
        let expected = case["bleu"].as_f64().unwrap();
        assert!((bleu.score - expected).abs() <= 0.01, "{name}: BLEU {} vs sacrebleu {expected}", bleu.score);
        let tricky = &refs[refs.len() - 4..];
        let tokens: Vec<String> = tricky.iter().map(|r| tokenize_13a(r)).collect();
        assert_eq!(tokens, strings(&case["tokenized"]), "{name}: 13a tokens");
    }
}
