//! A Hugging Face `generation_config.json` (or, for older directories, the same keys in `config.json`, as
//! transformers' `GenerationConfig.from_model_config` reads them): the beam-search settings `generate()` uses
//! when called with none of its own, with transformers' defaults for absent keys.

use serde_json::Value;

use crate::hf::optional;

/// How transformers ends a sentence's beam search (`early_stopping`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarlyStopping {
    /// `false`: once k hypotheses have ended and the best live beam, normalised at its current length, cannot beat
    /// the worst of them.
    Heuristic,
    /// `true`: once k hypotheses have ended.
    Done,
    /// `"never"`: as `false`, but a positive length penalty is judged at the longest allowed length.
    Never,
}

/// What `generate()` does by default for an encoder–decoder model.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub num_beams: usize,
    /// α of the score log p(y) / |y|^α of a finished hypothesis.
    pub length_penalty: f64,
    pub early_stopping: EarlyStopping,
    /// New tokens at most: `max_new_tokens`, else `max_length` − 1 (the decoder's start token counts).
    pub max_new_tokens: usize,
    /// Tokens never generated (`bad_words_ids` of one token each; Marian bans its pad).
    pub banned: Vec<u32>,
    /// The token forced at the last allowed step (`forced_eos_token_id`).
    pub forced_eos: Option<u32>,
}

/// The settings of a `generation_config.json` text for a model of `vocab` target tokens; what Ember's beam search
/// does not do (repetition penalties, n-gram blocking, a minimum length, multi-token bad words) is refused by name.
pub fn read(text: &str, vocab: usize) -> Result<Generation, String> {
    let json: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let number = |key: &str, default: f64| -> Result<f64, String> {
        match json.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| format!("{key} = {v} is not a number")),
        }
    };
    for (key, neutral) in [("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0.0), ("min_length", 0.0)] {
        if number(key, neutral)? != neutral {
            return Err(format!("{key} = {} is not supported", json[key]));
        }
    }
    let token = |id: &Value| -> Result<u32, String> {
        id.as_u64()
            .filter(|&id| (id as usize) < vocab)
            .map(|id| id as u32)
            .ok_or_else(|| format!("token {id} is not an id below the vocabulary's {vocab}"))
    };
    let mut banned = Vec::new();
    if let Some(words) = json.get("bad_words_ids").filter(|w| !w.is_null()) {
        for word in words.as_array().ok_or("bad_words_ids is not a list of token lists")? {
            match word.as_array().map(Vec::as_slice) {
                Some([id]) => banned.push(token(id)?),
                _ => return Err(format!("bad_words_ids entry {word} is not supported (single tokens are)")),
            }
        }
    }
    let forced_eos = match json.get("forced_eos_token_id") {
        None | Some(Value::Null) => None,
        Some(id) => Some(token(id)?),
    };
    let early_stopping = match &json["early_stopping"] {
        Value::Null | Value::Bool(false) => EarlyStopping::Heuristic,
        Value::Bool(true) => EarlyStopping::Done,
        Value::String(s) if s == "never" => EarlyStopping::Never,
        other => return Err(format!("early_stopping = {other} is not true, false or \"never\"")),
    };
    let max_new_tokens = match optional(&json, "max_new_tokens")? {
        Some(n) => n,
        None => match optional(&json, "max_length")?.unwrap_or(20) {
            0 | 1 => return Err("max_length must leave room for a token after the start".into()),
            n => n - 1,
        },
    };
    let num_beams = optional(&json, "num_beams")?.unwrap_or(1);
    if num_beams == 0 {
        return Err("num_beams = 0".into());
    }
    Ok(Generation {
        num_beams,
        length_penalty: number("length_penalty", 1.0)?,
        early_stopping,
        max_new_tokens,
        banned,
        forced_eos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OPUS-MT model's file: pad banned, </s> forced at the limit, 4 beams, transformers' length penalty 1.
    #[test]
    fn an_opus_mt_generation_config_is_read_with_transformers_defaults() {
        let text = r#"{"bad_words_ids": [[58100]], "bos_token_id": 0, "decoder_start_token_id": 58100,
            "eos_token_id": 0, "forced_eos_token_id": 0, "max_length": 512, "num_beams": 4, "pad_token_id": 58100}"#;
        let g = read(text, 58101).unwrap();
        let want = Generation {
            num_beams: 4,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Heuristic,
            max_new_tokens: 511,
            banned: vec![58100],
            forced_eos: Some(0),
        };
        assert_eq!(g, want);
        assert_eq!(read("{}", 10).unwrap().max_new_tokens, 19);
        assert_eq!(read(r#"{"early_stopping": "never"}"#, 10).unwrap().early_stopping, EarlyStopping::Never);
    }

    #[test]
    fn what_beam_search_does_not_do_is_refused_by_name() {
        for (text, error) in [
            (r#"{"repetition_penalty": 1.2}"#, "repetition_penalty = 1.2 is not supported"),
            (r#"{"no_repeat_ngram_size": 3}"#, "no_repeat_ngram_size = 3 is not supported"),
            (r#"{"bad_words_ids": [[1, 2]]}"#, "bad_words_ids entry [1,2] is not supported (single tokens are)"),
            (r#"{"bad_words_ids": [[99]]}"#, "token 99 is not an id below the vocabulary's 10"),
            (r#"{"early_stopping": 2}"#, "early_stopping = 2 is not true, false or \"never\""),
            (r#"{"max_length": 1}"#, "max_length must leave room for a token after the start"),
            (r#"{"num_beams": 0}"#, "num_beams = 0"),
        ] {
            assert_eq!(read(text, 10).unwrap_err(), error);
        }
    }
}
