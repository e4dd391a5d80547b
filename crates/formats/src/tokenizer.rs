//! Tokenizers, through the `tokenizers` crate: character-level (vocabulary from the training text, ids in sorted
//! character order as nanoGPT) and byte-level BPE trained in-process. Saved as `tokenizer.json`.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder, Vocab};
use tokenizers::models::unigram::Unigram;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::normalizers::precompiled::Precompiled;
use tokenizers::normalizers::replace::{Replace, ReplacePattern};
use tokenizers::normalizers::strip::Strip;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::{NormalizerWrapper, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::spm::{PieceKind, SentencePiece};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read tokenizer: {0}")]
    Load(String),
    #[error("cannot write tokenizer: {0}")]
    Save(String),
    #[error("cannot build tokenizer: {0}")]
    Build(String),
    #[error("text cannot be encoded: {0}")]
    Encode(String),
    #[error("ids cannot be decoded: {0}")]
    Decode(String),
    #[error(
        "token {token:?} has id {id}, past the model's vocabulary of {vocab}: the tokenizer does not belong to this model"
    )]
    PastVocabulary { token: String, id: u32, vocab: usize },
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn build(e: BoxError) -> TokenizerError {
    TokenizerError::Build(e.to_string())
}

/// One token per character of `text`; ids follow sorted character order.
pub fn train_char(text: &str) -> Result<Tokenizer, TokenizerError> {
    let mut chars: Vec<char> = text.chars().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    chars.sort_unstable();
    let vocab = chars.iter().enumerate().map(|(i, c)| (c.to_string(), i as u32)).collect();
    let model = WordLevel::builder().vocab(vocab).build().map_err(build)?;
    let mut tokenizer = Tokenizer::new(model);
    let each_char =
        Split::new(SplitPattern::Regex("(?s).".into()), SplitDelimiterBehavior::Isolated, false).map_err(build)?;
    tokenizer.with_pre_tokenizer(Some(each_char));
    tokenizer.with_decoder(Some(Fuse::new()));
    Ok(tokenizer)
}

/// Byte-level BPE (GPT-2's byte alphabet, no prefix space) trained on `text` to `vocab_size` tokens.
pub fn train_bpe(text: &str, vocab_size: usize) -> Result<Tokenizer, TokenizerError> {
    train_bpe_lines(text.lines(), vocab_size, &[])
}

/// Byte-level BPE trained on `lines` to `vocab_size` tokens, the `specials` first (ids 0, 1, …).
pub fn train_bpe_lines<'a>(
    lines: impl Iterator<Item = &'a str> + Send,
    vocab_size: usize,
    specials: &[&str],
) -> Result<Tokenizer, TokenizerError> {
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials.iter().map(|s| AddedToken::from(s.to_string(), true)).collect())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    tokenizer.train(&mut trainer, lines).map_err(build)?;
    Ok(tokenizer)
}

/// Qwen2's split before the byte-level mapping (transformers' `PRETOKENIZE_REGEX`): contractions in any case, one
/// non-letter leading a word, each digit alone, punctuation runs with their line breaks.
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's: Qwen2's with digits in runs of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pretrained byte-level BPE from its token list (id = position), its merges ("a b"), the ids of its special
/// tokens, and the split before the byte-level mapping by llama.cpp's `tokenizer.ggml.pre` name: `qwen2` (NFC, then
/// [`QWEN2_SPLIT`]), `llama-bpe` ([`LLAMA3_SPLIT`]), `smollm` and `deepseek-llm` (digits one by one, then GPT-2's
/// split), GPT-2's split for any other.
pub fn from_bpe(
    tokens: &[String],
    merges: &[String],
    specials: &[u32],
    pre: &str,
) -> Result<Tokenizer, TokenizerError> {
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = merges
        .iter()
        .map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| TokenizerError::Build("a merge is not of the form \"a b\"".into()))?;
    let model = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(build)?;
    let mut tokenizer = Tokenizer::new(model);
    let gpt2_split = ByteLevel::new(false, true, true);
    let split = |regex: &str| -> Result<Sequence, TokenizerError> {
        let split = Split::new(SplitPattern::Regex(regex.into()), SplitDelimiterBehavior::Isolated, false);
        Ok(Sequence::new(vec![split.map_err(build)?.into(), ByteLevel::new(false, true, false).into()]))
    };
    match pre {
        "qwen2" => {
            tokenizer.with_normalizer(Some(NFC));
            tokenizer.with_pre_tokenizer(Some(split(QWEN2_SPLIT)?));
        }
        "llama-bpe" => {
            tokenizer.with_pre_tokenizer(Some(split(LLAMA3_SPLIT)?));
        }
        "smollm" | "deepseek-llm" => {
            tokenizer.with_pre_tokenizer(Some(Sequence::new(vec![Digits::new(true).into(), gpt2_split.into()])));
        }
        _ => {
            tokenizer.with_pre_tokenizer(Some(gpt2_split));
        }
    }
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let specials: Vec<AddedToken> =
        specials.iter().filter_map(|&id| tokens.get(id as usize)).map(|t| AddedToken::from(t.clone(), true)).collect();
    tokenizer.add_special_tokens(&specials);
    Ok(tokenizer)
}

/// A byte-level BPE's parts as [`from_bpe`] takes them: tokens by id, merges ("a b"), special tokens' ids, and
/// llama.cpp's name for its split.
pub struct BpeParts {
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub specials: Vec<u32>,
    pub pre: &'static str,
}

/// The splits [`from_bpe`] builds by llama.cpp's name, GPT-2's last.
const PRE_NAMES: [&str; 4] = ["smollm", "qwen2", "llama-bpe", "gpt2"];

/// `tokenizer` taken apart for a GGUF file: a byte-level BPE whose ids run 0..n without gaps, whose normalizer and
/// split are one of those [`from_bpe`] builds by name (so a file written from these parts reads back as the same
/// tokenizer); anything else is an error naming what differs.
pub fn bpe_parts(tokenizer: &Tokenizer) -> Result<BpeParts, TokenizerError> {
    let bad = |why: &str| TokenizerError::Save(format!("not writable as a GGUF byte-level BPE: {why}"));
    let json: serde_json::Value = serde_json::from_str(&tokenizer.to_string(false).map_err(|e| bad(&e.to_string()))?)
        .map_err(|e| bad(&e.to_string()))?;
    if json["model"]["type"] != "BPE" {
        return Err(bad(&format!("its model is {}, not BPE", json["model"]["type"])));
    }
    let vocab = tokenizer.get_vocab(true);
    let mut tokens = vec![None; vocab.len()];
    for (token, id) in vocab {
        *tokens.get_mut(id as usize).ok_or_else(|| bad("its ids have gaps"))? = Some(token);
    }
    let tokens: Vec<String> = tokens.into_iter().collect::<Option<_>>().ok_or_else(|| bad("its ids have gaps"))?;
    let merge = |m: &serde_json::Value| match m {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(pair) => Some(format!("{} {}", pair.first()?.as_str()?, pair.get(1)?.as_str()?)),
        _ => None,
    };
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .map(|m| m.iter().map(merge).collect::<Option<_>>())
        .unwrap_or(Some(Vec::new()))
        .ok_or_else(|| bad("a merge is neither \"a b\" nor [\"a\", \"b\"]"))?;
    let mut specials: Vec<u32> =
        tokenizer.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect();
    specials.sort_unstable();
    let shape = |t: &Tokenizer| {
        (serde_json::to_value(t.get_normalizer()).ok(), serde_json::to_value(t.get_pre_tokenizer()).ok())
    };
    let pre = PRE_NAMES
        .into_iter()
        .find(|&name| from_bpe(&tokens, &[], &[], name).is_ok_and(|built| shape(&built) == shape(tokenizer)))
        .ok_or_else(|| {
            bad("its normalizer and pre-tokenizer are none of those llama.cpp names (smollm, qwen2, llama-bpe, gpt2)")
        })?;
    Ok(BpeParts { tokens, merges, specials, pre })
}

/// A SentencePiece BPE vocabulary (GGUF's "llama" tokenizer) as a BPE over "▁"-for-space text with byte fallback.
/// The file lists no merges: they are every split of a token into two tokens, ranked as the pieces are ordered in
/// `order` (best first; Gemma's is the file's own order, others' their scores), then by the longer left piece, then
/// the longer right one, as transformers rebuilds them. A run of spaces stored as spaces is respelled with "▁".
/// `control` tokens (`<start_of_turn>`, …) are matched whole as special tokens, `user` ones whole as added tokens;
/// `bos`, when given, starts every encoding.
pub fn from_spm(
    tokens: &[String],
    order: &[f64],
    control: &[u32],
    user: &[u32],
    bos: Option<u32>,
) -> Result<Tokenizer, TokenizerError> {
    let tokens: Vec<String> = tokens
        .iter()
        .map(|t| if t.len() >= 2 && t.chars().all(|c| c == ' ') { "▁".repeat(t.len()) } else { t.clone() })
        .collect();
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    // (score, left length, right length, left id, right id) of every split, best first.
    let mut splits: Vec<(f64, usize, usize, u32, u32)> = Vec::new();
    for (token, &score) in tokens.iter().zip(order) {
        for (at, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                splits.push((score, left.chars().count(), right.chars().count(), l, r));
            }
        }
    }
    splits.sort_by(|a, b| {
        b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)).then(a.3.cmp(&b.3)).then(a.4.cmp(&b.4))
    });
    let merges =
        splits.into_iter().map(|(_, _, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone())).collect();
    let unk = tokens.iter().find(|t| *t == "<unk>").cloned();
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let mut tokenizer = Tokenizer::new(builder.build().map_err(build)?);
    tokenizer.with_normalizer(Some(Replace::new(" ", "▁").map_err(build)?));
    tokenizer.with_decoder(Some(DecoderSequence::new(vec![
        Replace::new("▁", " ").map_err(build)?.into(),
        ByteFallback::default().into(),
        Fuse::new().into(),
    ])));
    let added = |ids: &[u32], special: bool| -> Vec<AddedToken> {
        ids.iter()
            .filter_map(|&id| tokens.get(id as usize))
            .map(|t| AddedToken::from(t.clone(), special).normalized(false))
            .collect()
    };
    tokenizer.add_special_tokens(&added(control, true));
    tokenizer.add_tokens(&added(user, false));
    if let Some(bos) = bos.and_then(|id| Some((tokens.get(id as usize)?.clone(), id))) {
        let template = TemplateProcessing::builder()
            .try_single(format!("{} $A", bos.0))
            .map_err(|e| TokenizerError::Build(e.to_string()))?
            .special_tokens(vec![bos])
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        tokenizer.with_post_processor(Some(template));
    }
    Ok(tokenizer)
}

/// A SentencePiece unigram model (Marian's `source.spm` or `target.spm`) as a tokenizer whose ids are those of `ids`
/// (Marian's `vocab.json`, one table for both sides), normalized as the model says (its precompiled character map,
/// whitespace stripped and runs collapsed) with "▁" for each space and before the text, as sentencepiece encodes.
/// An entry of `ids` that is a normal or user-defined piece of the model keeps its score; any other (the other side's
/// pieces) keeps its text for decoding when `decode_foreign`, and otherwise stands for text no input normalizes to,
/// so that encoding never picks it where sentencepiece would not. `unk` is unknown text's id; `specials` are matched
/// whole and skipped when decoding.
pub fn from_sentencepiece(
    model: &SentencePiece,
    ids: &HashMap<String, u32>,
    unk: u32,
    specials: &[u32],
    decode_foreign: bool,
) -> Result<Tokenizer, TokenizerError> {
    if !model.unigram {
        return Err(TokenizerError::Build("only unigram SentencePiece models are supported".into()));
    }
    let own: HashMap<&str, f64> = model
        .pieces
        .iter()
        .filter(|p| matches!(p.kind, PieceKind::Normal | PieceKind::UserDefined))
        .map(|p| (p.text.as_str(), f64::from(p.score)))
        .collect();
    let lowest = own.values().copied().fold(0.0, f64::min);
    let size = ids.values().max().map_or(0, |&id| id as usize + 1);
    // Ids missing from `ids` are gaps no text reaches either.
    let mut vocab: Vec<(String, f64)> = (0..size).map(|id| (format!("\u{0}{id}"), lowest)).collect();
    for (piece, &id) in ids {
        match own.get(piece.as_str()) {
            Some(&score) => vocab[id as usize] = (piece.clone(), score),
            None if decode_foreign => vocab[id as usize] = (piece.clone(), lowest),
            None => {}
        }
    }
    let specials: Vec<AddedToken> = specials
        .iter()
        .filter_map(|&id| vocab.get(id as usize))
        .map(|(t, _)| AddedToken::from(t.clone(), true))
        .collect();
    let model_unigram = Unigram::from(vocab, Some(unk as usize), false).map_err(build)?;
    let mut tokenizer = Tokenizer::new(model_unigram);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if !model.charsmap.is_empty() {
        normalizers.push(Precompiled::from(&model.charsmap).map_err(|e| build(e.into()))?.into());
    }
    if model.remove_extra_whitespaces {
        normalizers.push(Strip::new(true, true).into());
        normalizers.push(Replace::new(ReplacePattern::Regex(" {2,}".into()), " ").map_err(build)?.into());
    }
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    let prepend = if model.add_dummy_prefix { PrependScheme::Always } else { PrependScheme::Never };
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', prepend, true)));
    tokenizer.with_decoder(Some(Metaspace::new('▁', prepend, true)));
    tokenizer.add_special_tokens(&specials);
    Ok(tokenizer)
}

pub fn save(tokenizer: &Tokenizer, path: &Path) -> Result<(), TokenizerError> {
    tokenizer.save(path, false).map_err(|e| TokenizerError::Save(format!("{}: {e}", path.display())))
}

pub fn load(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let bytes = crate::files::read(path).map_err(|e| TokenizerError::Load(format!("{}: {e}", path.display())))?;
    parse(&bytes).map_err(|e| TokenizerError::Load(format!("{}: {e}", path.display())))
}

/// A `tokenizer.json`'s bytes as a tokenizer. The file is read as JSON in full first: the tokenizers crate panics
/// instead of failing when its decoder section is not valid JSON (bad syntax, bytes that are not UTF-8, a lone
/// surrogate escape), and a syntax check alone would skip over the insides of strings.
pub fn parse(bytes: &[u8]) -> Result<Tokenizer, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    serde_json::from_str::<serde_json::Value>(text).map_err(|e| format!("not valid JSON: {e}"))?;
    text.parse::<Tokenizer>().map_err(|e| e.to_string())
}

/// Token ids of `text`, with the tokens the tokenizer's post-processor adds (a SentencePiece model's BOS); a
/// character a character-level vocabulary lacks (whose tokenizer has no unknown token) is named in the error.
pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, TokenizerError> {
    encode_with(tokenizer, text, true)
}

/// [`encode`], adding the tokenizer's special tokens (a BOS) only when `special`.
pub fn encode_with(tokenizer: &Tokenizer, text: &str, special: bool) -> Result<Vec<u32>, TokenizerError> {
    let encoding = tokenizer.encode(text, special).map_err(|e| {
        let characters = tokenizer.get_vocab(false).keys().all(|token| token.chars().count() == 1);
        let missing = text.chars().find(|c| tokenizer.token_to_id(&c.to_string()).is_none()).filter(|_| characters);
        match missing {
            Some(c) => TokenizerError::Encode(format!(
                "the character {c:?} (U+{:04X}) is not in the tokenizer's vocabulary ({e})",
                c as u32
            )),
            None => TokenizerError::Encode(e.to_string()),
        }
    })?;
    Ok(encoding.get_ids().to_vec())
}

/// The token ids of a rendered chat `text` (no special tokens added, as transformers tokenizes a rendered chat) and,
/// for each, whether it is the assistant's: whether its bytes overlap one of `spans` (byte ranges of `text`, in
/// order), as transformers' `return_assistant_tokens_mask` marks tokens.
pub fn assistant_mask(
    tokenizer: &Tokenizer,
    text: &str,
    spans: &[std::ops::Range<usize>],
) -> Result<(Vec<u32>, Vec<bool>), TokenizerError> {
    let encoding = tokenizer.encode(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
    let mut span = spans.iter().peekable();
    let mask = encoding
        .get_offsets()
        .iter()
        .map(|&(start, end)| {
            while span.next_if(|s| start >= s.end).is_some() {}
            span.peek().is_some_and(|s| end > s.start)
        })
        .collect();
    Ok((encoding.get_ids().to_vec(), mask))
}

pub fn decode(tokenizer: &Tokenizer, ids: &[u32]) -> Result<String, TokenizerError> {
    tokenizer.decode(ids, false).map_err(|e| TokenizerError::Decode(e.to_string()))
}

/// Fails unless every id `tokenizer` can produce, added tokens included, indexes a model vocabulary of `vocab`
/// tokens (an embedding lookup past it would fail).
pub fn check_fits(tokenizer: &Tokenizer, vocab: usize) -> Result<(), TokenizerError> {
    match tokenizer.get_vocab(true).into_iter().max_by_key(|&(_, id)| id) {
        Some((token, id)) if id as usize >= vocab => Err(TokenizerError::PastVocabulary { token, id, vocab }),
        _ => Ok(()),
    }
}

pub fn vocab_size(tokenizer: &Tokenizer) -> usize {
    tokenizer.get_vocab_size(true)
}

/// Special tokens that end a text: end-of-text / end-of-turn markers of GPT-2, Llama, ChatML and Gemma.
pub fn end_tokens(tokenizer: &Tokenizer) -> Vec<u32> {
    const ENDS: [&str; 6] = ["<|endoftext|>", "</s>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<eos>"];
    tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special && ENDS.contains(&t.content.as_str()))
        .map(|(id, _)| id)
        .collect()
}

/// The bytes each token id stands for in decoded text, by id; None for special tokens (they write no text) and ids
/// the tokenizer does not have. Byte-level BPE maps its characters back through GPT-2's byte alphabet;
/// SentencePiece-style vocabularies write `▁` for a space and `<0xNN>` for a fallback byte; others are their text.
pub fn token_bytes(tokenizer: &Tokenizer) -> Vec<Option<Vec<u8>>> {
    use tokenizers::DecoderWrapper;
    let decoder = tokenizer.get_decoder();
    let byte_level = matches!(decoder, Some(DecoderWrapper::ByteLevel(_)));
    let sentencepiece = matches!(decoder, Some(DecoderWrapper::Metaspace(_) | DecoderWrapper::Sequence(_)));
    let alphabet: HashMap<char, u8> = gpt2_bytes().into_iter().enumerate().map(|(b, c)| (c, b as u8)).collect();
    let special: Vec<u32> =
        tokenizer.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect();
    (0..vocab_size(tokenizer) as u32)
        .map(|id| {
            let token = tokenizer.id_to_token(id).filter(|_| !special.contains(&id))?;
            if tokenizer.get_added_tokens_decoder().contains_key(&id) {
                return Some(token.into_bytes());
            }
            if byte_level {
                return token.chars().map(|c| alphabet.get(&c).copied()).collect();
            }
            if sentencepiece {
                let hex = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'));
                if let Some(byte) = hex.filter(|h| h.len() == 2).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    return Some(vec![byte]);
                }
                return Some(token.replace('▁', " ").into_bytes());
            }
            Some(token.into_bytes())
        })
        .collect()
}

/// GPT-2's byte alphabet: the character byte-level BPE writes for each byte (printable Latin-1 as itself, the other
/// bytes as the characters from U+0100 on, in order).
fn gpt2_bytes() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("Latin-1")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("below U+0200")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n";

    #[test]
    fn char_level_round_trips_and_orders_ids_by_character() {
        let tok = train_char(TEXT).unwrap();
        let ids = encode(&tok, "hear me\n").unwrap();
        assert_eq!(ids.len(), 8);
        assert_eq!(decode(&tok, &ids).unwrap(), "hear me\n");
        assert_eq!(encode(&tok, "\n").unwrap(), vec![0]); // '\n' sorts first
        assert!(encode(&tok, "Z").is_err(), "a character outside the vocabulary is an error");
    }

    /// The bytes of a text's tokens, joined, are the text: through GPT-2's byte alphabet (accents and CJK split over
    /// byte tokens) and for characters; special tokens write none.
    #[test]
    fn token_bytes_spell_the_text() {
        let text = "Grüße, 東京 — café.\n".repeat(10);
        for tok in [train_bpe(&text, 300).unwrap(), train_char(&text).unwrap()] {
            let bytes = token_bytes(&tok);
            let ids = encode(&tok, "東京 café — Grüße").unwrap();
            let spelled: Vec<u8> = ids.iter().flat_map(|&id| bytes[id as usize].clone().unwrap()).collect();
            assert_eq!(String::from_utf8(spelled).unwrap(), "東京 café — Grüße");
        }
        let bpe = train_bpe_lines(text.lines(), 300, &["<|endoftext|>"]).unwrap();
        let end = bpe.token_to_id("<|endoftext|>").unwrap();
        assert_eq!(token_bytes(&bpe)[end as usize], None);
    }

    #[test]
    fn a_bpe_taken_apart_builds_the_same_tokenizer() {
        let tokenizer = train_bpe(TEXT, 300).unwrap();
        let parts = bpe_parts(&tokenizer).unwrap();
        assert_eq!(parts.pre, "gpt2");
        let rebuilt = from_bpe(&parts.tokens, &parts.merges, &parts.specials, parts.pre).unwrap();
        let ids = encode(&tokenizer, TEXT).unwrap();
        assert_eq!(encode(&rebuilt, TEXT).unwrap(), ids);
        assert!(bpe_parts(&train_char(TEXT).unwrap()).is_err_and(|e| e.to_string().contains("not BPE")));
    }

    #[test]
    fn bpe_round_trips_and_reloads() {
        let text = TEXT.repeat(20);
        let tok = train_bpe(&text, 300).unwrap();
        assert!(vocab_size(&tok) <= 300 && vocab_size(&tok) > 256);
        let ids = encode(&tok, "Speak, hear me.").unwrap();
        assert!(ids.len() < "Speak, hear me.".len(), "merges shorten the text");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        save(&tok, &path).unwrap();
        let again = load(&path).unwrap();
        assert_eq!(encode(&again, "Speak, hear me.").unwrap(), ids);
        assert_eq!(decode(&again, &ids).unwrap(), "Speak, hear me.");
    }
}
