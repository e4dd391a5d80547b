//! The entry points of the fuzz targets in `fuzz/`, one per reader of untrusted bytes. Each runs a reader on the bytes
//! as Ember does and discards the result: an error is a correct answer; a panic, an abort, a hang or an allocation out
//! of proportion to the input is a bug. `tests/fuzz_corpus.rs` replays every corpus file and every crash found through
//! the same functions on the stable toolchain.

use std::collections::HashMap;

use crate::{
    chat, checkpoint, config, generation, gguf, grammar, hf, openai, safetensors, schema, spm, tokenizer, tsv,
};

/// A fuzz target: it reads the bytes and returns.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/` and `fuzz/corpus/` name them.
pub const TARGETS: [(&str, Target); 10] = [
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("hf_config", hf_config),
    ("run_config", run_config),
    ("tokenizer", tokenizer),
    ("checkpoint_state", checkpoint_state),
    ("tsv", tsv),
    ("openai_request", openai_request),
    ("chat_template", chat_template),
    ("sentencepiece", sentencepiece),
];

/// A GGUF file: header, metadata, tensor directory, then every tensor dequantized and every array read.
pub fn gguf(bytes: &[u8]) {
    let Ok(file) = gguf::Gguf::parse(bytes.to_vec()) else { return };
    for info in &file.tensors {
        let _ = file.tensor(&info.name);
    }
    for value in file.metadata.values() {
        if let Some(array) = value.as_array() {
            let _ = array.integers();
            let _ = array.strings().map(|s| s.iter().map(str::len).sum::<usize>());
        }
    }
}

/// A safetensors file read as f32.
pub fn safetensors(bytes: &[u8]) {
    let _ = safetensors::read(bytes, |name| name.ends_with(".attn.bias"));
}

/// A Hugging Face `config.json` (and the same text as a shard index, a MarianMT config and a generation config).
pub fn hf_config(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    if let Ok((_, config)) = hf::config(text) {
        describe(&config);
    }
    let _ = hf::shards(text);
    let _ = hf::marian(text);
    let _ = generation::read(text, 32_000);
}

/// A SentencePiece model (Marian's `source.spm`): read, made a tokenizer over its own pieces, and a sentence encoded.
pub fn sentencepiece(bytes: &[u8]) {
    let Ok(model) = spm::read(bytes) else { return };
    let ids: HashMap<String, u32> = model.pieces.iter().enumerate().map(|(i, p)| (p.text.clone(), i as u32)).collect();
    let Ok(tokenizer) = tokenizer::from_sentencepiece(&model, &ids, 0, &[], true) else { return };
    let _ = tokenizer.encode("The cat sat on the mat, naïvely — twice.", false);
}

/// A run directory's `config.toml`.
pub fn run_config(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    if let Ok(config) = config::model_from_run_toml(text) {
        describe(&config);
    }
}

/// What Ember derives from every loaded config before building a model.
fn describe(config: &config::ModelConfig) {
    let _ = (config.vocab(), config.head_dim(), config.kv_heads(), config.ffn_dim());
}

/// A `tokenizer.json`, then a round trip of a short text through it.
pub fn tokenizer(bytes: &[u8]) {
    let Ok(tok) = tokenizer::parse(bytes) else { return };
    if let Ok(ids) = tokenizer::encode(&tok, "To be, or not to be: ümlaut 日本 🙂") {
        let _ = tokenizer::decode(&tok, &ids);
    }
    let _ = tokenizer::vocab_size(&tok);
}

/// A checkpoint's training state, as the language-model and translation tasks read it.
pub fn checkpoint_state(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    let metadata = HashMap::from([(checkpoint::STATE_KEY.to_string(), text.to_string())]);
    let _ = checkpoint::state::<serde_json::Value>(&metadata);
}

/// A parallel corpus: the text as TSV, and its halves as line-aligned source and target.
pub fn tsv(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    let _ = tsv::pairs(text);
    let middle = (0..=text.len() / 2).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let _ = tsv::aligned(&text[..middle], &text[middle..]);
}

/// A completions or chat completions request body, and the grammar of its structured output run over the body's
/// own bytes.
pub fn openai_request(bytes: &[u8]) {
    let format = openai::parse_completion(bytes, "ember").ok().and_then(|c| c.format);
    let _ = openai::parse_chat(bytes, "ember");
    let grammar = match format {
        Some(openai::Format::JsonSchema(json)) => schema::grammar(&json).ok(),
        Some(openai::Format::Regex(pattern)) => {
            let mut g = grammar::Builder::default();
            grammar::regex::rule(&mut g, &pattern, false).ok().and_then(|start| g.build(start).ok())
        }
        _ => None,
    };
    if let Some(grammar) = grammar {
        let _ = grammar.advance_bytes(&grammar.start(), bytes);
    }
}

/// A chat template, as a model file brings it, rendered over a short chat.
pub fn chat_template(bytes: &[u8]) {
    let Ok(source) = std::str::from_utf8(bytes) else { return };
    let Ok(template) = chat::ChatTemplate::new(source) else { return };
    let messages = chat::Json::List(vec![chat::Json::Map(vec![
        ("role".into(), chat::Json::Str("user".into())),
        ("content".into(), chat::Json::Str("Hi there".into())),
    ])]);
    let context = chat::RenderContext {
        bos_token: "<s>",
        eos_token: "</s>",
        add_generation_prompt: true,
        now: chrono::NaiveDateTime::default(),
        tools: None,
    };
    let _ = template.render(&messages, &context);
}
