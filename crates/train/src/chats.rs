//! Conversations for supervised fine-tuning: a JSONL file of OpenAI chats (`{"messages": [...], "tools": [...]}` a
//! line), each rendered with the model's chat template and tokenized, with the assistant's tokens (its replies and
//! their end-of-turn markers, [`ChatTemplate::render_assistant`]) as the only targets. A batch holds one
//! conversation a row, cut to the context and padded, so no token attends across conversations (packing several
//! into a row would need attention masked at their boundaries, which the attention kernels do not take).

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::tokenizer;
use ember_formats::chat::{ChatFormat, ChatTemplate, Json, RenderContext};
use tokenizers::Tokenizer;

use crate::collective::Shard;
use crate::corpus::{Batch, Sampler};

/// Why a chat file cannot be trained on.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {reason}", path.display(), line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct ChatsError {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub reason: String,
}

/// One rendered conversation: its token ids, and which of them the model learns to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    pub ids: Vec<u32>,
    pub learned: Vec<bool>,
}

/// The conversations of a run, the last `val_fraction` of them held out.
#[derive(Clone, Debug)]
pub struct Chats {
    pub train: Vec<Example>,
    pub val: Vec<Example>,
}

/// The conversations of `path` ([`examples`]), the last `val_fraction` of them held out.
pub fn read(
    path: &Path,
    tok: &Tokenizer,
    chat: &ChatFormat,
    val_fraction: f64,
    context: usize,
) -> Result<Chats, ChatsError> {
    let mut examples = examples(path, tok, chat, context)?;
    let held_out = ((examples.len() as f64) * val_fraction).round().max(1.0) as usize;
    if examples.len() < held_out + 1 {
        let reason = format!("{} conversations: too few to hold out {held_out} for validation", examples.len());
        return Err(ChatsError { path: path.to_path_buf(), line: None, reason });
    }
    let val = examples.split_off(examples.len() - held_out);
    Ok(Chats { train: examples, val })
}

/// Reads, renders and tokenizes every conversation of `path` with the model's `chat` format and tokenizer; one
/// whose assistant text starts past the first `context` + 1 tokens (which a row keeps) is an error.
pub fn examples(path: &Path, tok: &Tokenizer, chat: &ChatFormat, context: usize) -> Result<Vec<Example>, ChatsError> {
    let bad = |line: Option<usize>, reason: String| ChatsError { path: path.to_path_buf(), line, reason };
    let source = chat.template.as_deref().ok_or_else(|| {
        bad(None, "the model has no chat template (its tokenizer_config.json or GGUF file names none)".into())
    })?;
    let template = ChatTemplate::new(source).map_err(|e| bad(None, e.to_string()))?;
    let text = ember_formats::files::read_to_string(path).map_err(|e| bad(None, e.to_string()))?;
    let mut examples = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |reason: String| bad(Some(i + 1), reason);
        let record: Json = serde_json::from_str(line).map_err(|e| bad(format!("not a JSON object: {e}")))?;
        let messages = record.get("messages").ok_or_else(|| bad("no \"messages\" list".into()))?;
        let render = RenderContext {
            bos_token: &chat.bos_token,
            eos_token: &chat.eos_token,
            add_generation_prompt: false,
            now: Default::default(),
            tools: record.get("tools"),
        };
        let (text, spans) = template.render_assistant(messages, &render).map_err(|e| bad(e.to_string()))?;
        if spans.is_empty() {
            return Err(bad("the conversation has no assistant message to learn".into()));
        }
        let (ids, learned) = tokenizer::assistant_mask(tok, &text, &spans).map_err(|e| bad(e.to_string()))?;
        if !learned.iter().take(context + 1).skip(1).any(|&l| l) {
            return Err(bad(format!("the assistant's text starts past the context of {context} tokens")));
        }
        examples.push(Example { ids, learned });
    }
    Ok(examples)
}

/// One row a conversation: inputs x = c[0..T] and targets y = c[1..T+1] of each conversation c cut to T + 1 tokens
/// and padded, and the mask of the targets to learn (assistant tokens; never padding).
pub fn batch(examples: &[&Example], t: usize, device: &Device) -> (Batch, Tensor<2>) {
    let b = examples.len();
    let (mut x, mut y, mut mask) = (vec![0i64; b * t], vec![0i64; b * t], vec![0f32; b * t]);
    for (row, e) in examples.iter().enumerate() {
        for p in 0..t.min(e.ids.len().saturating_sub(1)) {
            x[row * t + p] = e.ids[p] as i64;
            y[row * t + p] = e.ids[p + 1] as i64;
            mask[row * t + p] = if e.learned[p + 1] { 1.0 } else { 0.0 };
        }
    }
    let ids = |v: Vec<i64>| Tensor::<2, Int>::from_data(TensorData::new(v, [b, t]), device);
    (Batch { x: ids(x), y: ids(y) }, Tensor::from_data(TensorData::new(mask, [b, t]), device))
}

impl Sampler {
    /// `shard`'s rows of a global batch of B · ranks conversations drawn at random, as [`batch`] lays them out.
    pub fn chats(
        &mut self,
        examples: &[Example],
        b: usize,
        t: usize,
        shard: Shard,
        device: &Device,
    ) -> (Batch, Tensor<2>) {
        let picks: Vec<usize> = (0..b * shard.ranks).map(|_| self.rng.below(examples.len())).collect();
        let rows: Vec<&Example> = picks[shard.rows(b * shard.ranks)].iter().map(|&i| &examples[i]).collect();
        batch(&rows, t, device)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A JSONL line of one question and its answer.
    pub(crate) fn line(q: &str, a: &str) -> String {
        format!(r#"{{"messages": [{{"role": "user", "content": "{q}"}}, {{"role": "assistant", "content": "{a}"}}]}}"#)
    }

    const TEMPLATE: &str = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}\
        {% if add_generation_prompt %}<|assistant|>{% endif %}";

    #[test]
    fn only_the_assistants_tokens_and_its_end_of_turn_are_targets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.jsonl");
        std::fs::write(&path, [line("hi", "yo"), line("2+2", "4"), String::new(), line("a", "b")].join("\n")).unwrap();
        let tok = tokenizer::train_char("<|userassistnd>hiyo2+4ab").unwrap();
        let chat = ChatFormat { template: Some(TEMPLATE.into()), ..ChatFormat::default() };
        let chats = read(&path, &tok, &chat, 0.3, 64).unwrap();
        assert_eq!((chats.train.len(), chats.val.len()), (2, 1));
        let first = &chats.train[0];
        let learned: String = first
            .ids
            .iter()
            .zip(&first.learned)
            .filter(|(_, l)| **l)
            .map(|(&id, _)| tok.id_to_token(id).unwrap())
            .collect();
        assert_eq!(learned, "yo<|end|>");
        let (batch, mask) = Sampler::new(1).chats(&chats.train, 2, 40, Shard::WHOLE, &Device::flex());
        let mask = mask.into_data().try_to_vec::<f32>().unwrap();
        let y = batch.y.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        // Every masked target is an assistant token; padding (past the conversation) is never one.
        assert!(mask.iter().zip(&y).all(|(&m, &id)| m == 0.0 || tok.id_to_token(id as u32).is_some()));
        assert!(mask.iter().sum::<f32>() > 0.0);
        assert!(mask.chunks(40).all(|row| row[38..].iter().all(|&m| m == 0.0)));
    }

    #[test]
    fn a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.jsonl");
        std::fs::write(&path, "{\"messages\": []}\n{\"oops\": 1}\n").unwrap();
        let tok = tokenizer::train_char("<|userassistnd>").unwrap();
        let chat = ChatFormat { template: Some(TEMPLATE.into()), ..ChatFormat::default() };
        let err = read(&path, &tok, &chat, 0.5, 64).unwrap_err().to_string();
        assert!(err.ends_with("line 1: the conversation has no assistant message to learn"), "{err}");
        let none = ChatFormat::default();
        assert!(read(&path, &tok, &none, 0.5, 64).unwrap_err().to_string().contains("no chat template"));
    }
}
