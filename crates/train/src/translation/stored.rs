//! What a translation run directory keeps: the vocabularies, the last checkpoints' weights for averaging, and the
//! trained translator loaded back.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, Device, TensorData};
use ember_core_model::bundle::{self, BundleError};
use ember_core_model::seq2seq::{Seq2Seq, Seq2SeqConfig};
use ember_core_model::{Build, tokenizer};
use ember_formats::generation::{self, Generation};
use tokenizers::Tokenizer;

use super::{SOURCE_TOKENIZER, TranslationConfig, TranslationError, io};
use crate::parallel::{BOS, EOS, Vocabularies};

/// The directory of a run's `step-N.safetensors` weights.
pub const CHECKPOINTS: &str = "checkpoints";

/// The checkpoints of a run directory, by step.
pub fn checkpoints(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>, TranslationError> {
    let dir = run_dir.join(CHECKPOINTS);
    step_files(&dir).map_err(io(&dir))
}

/// The `step-N.safetensors` files of `dir`, by step.
pub(super) fn step_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let step = name.strip_prefix("step-")?.strip_suffix(".safetensors")?.parse().ok()?;
            Some((step, p))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// A translator: its model, vocabularies and, for an imported MarianMT model, the search transformers' `generate()`
/// runs it with by default.
pub struct Translator {
    pub model: Seq2Seq,
    pub vocab: Vocabularies,
    pub generation: Option<Generation>,
}

/// Writes `tokenizer.json` (the joint or target vocabulary) and, for separate vocabularies, `source_tokenizer.json`.
pub(super) fn save_vocabularies(vocab: &Vocabularies, run_dir: &Path) -> Result<(), BundleError> {
    let save = |tok: &Tokenizer, name: &str| {
        let path = run_dir.join(name);
        tokenizer::save(tok, &path).map_err(|cause| BundleError::Tokenizer { path, cause })
    };
    save(&vocab.target, bundle::TOKENIZER)?;
    if !vocab.joint {
        save(&vocab.source, SOURCE_TOKENIZER)?;
    }
    Ok(())
}

/// The vocabularies [`save_vocabularies`] wrote: separate when `source_tokenizer.json` is present. The model's
/// embeddings have a row per token of each, so ids must run from 0 without gaps.
pub(super) fn load_vocabularies(run_dir: &Path) -> Result<Vocabularies, BundleError> {
    let load = |name: &str| {
        let path = run_dir.join(name);
        tokenizer::load(&path)
            .and_then(|t| tokenizer::check_fits(&t, tokenizer::vocab_size(&t)).map(|_| t))
            .map_err(|cause| BundleError::Tokenizer { path, cause })
    };
    let target = load(bundle::TOKENIZER)?;
    if !run_dir.join(SOURCE_TOKENIZER).exists() {
        return Ok(Vocabularies { source: target.clone(), target, joint: true, bos: BOS, eos: EOS });
    }
    Ok(Vocabularies { source: load(SOURCE_TOKENIZER)?, target, joint: false, bos: BOS, eos: EOS })
}

/// Loads a translation run directory, with the weights of `weights` (default `model.safetensors`), or a MarianMT
/// directory ([`marian`]).
pub fn load(run_dir: &Path, weights: Option<&Path>, device: &Device) -> Result<Translator, TranslationError> {
    if weights.is_none() && run_dir.join(MARIAN_VOCAB).is_file() {
        return marian(run_dir, device);
    }
    let config = run_config(run_dir)?.ok_or_else(|| TranslationError::NotTranslation(run_dir.to_path_buf()))?;
    let vocab = load_vocabularies(run_dir)?;
    let weights = weights.map_or_else(|| run_dir.join(bundle::MODEL), Path::to_path_buf);
    let (tensors, _) = bundle::load_tensors(&weights)?;
    let model = Seq2Seq::load(&config.seq2seq_config(&vocab), &tensors, device)
        .map_err(|cause| BundleError::Mismatch { path: weights.clone(), cause })?;
    Ok(Translator { model, vocab, generation: None })
}

/// The `config.toml` of a translation run directory; None for a run directory of another kind.
fn run_config(run_dir: &Path) -> Result<Option<TranslationConfig>, TranslationError> {
    let path = run_dir.join(bundle::CONFIG);
    let text = ember_core_model::files::read_to_string(&path).map_err(io(&path))?;
    let bad = |reason: &str| TranslationError::Config { path: path.clone(), reason: reason.into() };
    let table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.message()))?;
    if !table.contains_key("seq2seq") {
        return Ok(None);
    }
    toml::Value::Table(table).try_into().map(Some).map_err(|e: toml::de::Error| bad(e.message()))
}

/// The encoder–decoder of a translation run directory or a MarianMT directory, read without its weights; None for
/// a directory of a decoder-only model.
pub fn seq2seq_config(dir: &Path) -> Result<Option<Seq2SeqConfig>, TranslationError> {
    if dir.join(MARIAN_VOCAB).is_file() {
        return Ok(Some(ember_core_model::import::marian::config(dir)?.0));
    }
    if !dir.join(bundle::CONFIG).is_file() {
        return Ok(None);
    }
    match run_config(dir)? {
        Some(config) => Ok(Some(config.seq2seq_config(&load_vocabularies(dir)?))),
        None => Ok(None),
    }
}

/// The vocabulary of a MarianMT directory (the source's alone where `target_vocab.json` gives the target its own);
/// `source.spm` and `target.spm` segment each side.
const MARIAN_VOCAB: &str = "vocab.json";
const MARIAN_TARGET_VOCAB: &str = "target_vocab.json";

/// A MarianMT directory (an OPUS-MT model: `config.json`, `model.safetensors`, `vocab.json` and, with separate
/// vocabularies, `target_vocab.json`, `source.spm`, `target.spm`): the model through ember-core-model's Marian
/// importer, each side's SentencePiece model with its vocabulary's ids, Marian's start (its pad id) and end tokens,
/// and its `generate()` settings (generation_config.json, else the same keys of config.json).
fn marian(dir: &Path, device: &Device) -> Result<Translator, TranslationError> {
    let (config, tensors, ids) = ember_core_model::import::marian::load(dir)?;
    let bad = |path: &Path, reason: String| TranslationError::Config { path: path.to_path_buf(), reason };
    let side = |spm: &str, table: &str, size: usize, decode_foreign: bool| -> Result<Tokenizer, TranslationError> {
        let path = dir.join(table);
        let text = ember_core_model::files::read_to_string(&path).map_err(io(&path))?;
        let table: HashMap<String, u32> = serde_json::from_str(&text).map_err(|e| bad(&path, e.to_string()))?;
        if let Some((piece, id)) = table.iter().find(|(_, id)| **id as usize >= size) {
            return Err(bad(&path, format!("{piece:?} has id {id}, past the model's {size} tokens")));
        }
        let special = |name: &str| table.get(name).copied().ok_or_else(|| bad(&path, format!("no {name} entry")));
        let unk = special("<unk>")?;
        let specials = [special("</s>")?, special("<pad>")?, unk];
        let path = dir.join(spm);
        let bytes = ember_core_model::files::read(&path).map_err(io(&path))?;
        let model = ember_formats::spm::read(&bytes).map_err(|e| bad(&path, e))?;
        tokenizer::from_sentencepiece(&model, &table, unk, &specials, decode_foreign)
            .map_err(|cause| BundleError::Tokenizer { path, cause }.into())
    };
    let target_table = if dir.join(MARIAN_TARGET_VOCAB).is_file() { MARIAN_TARGET_VOCAB } else { MARIAN_VOCAB };
    let vocab = Vocabularies {
        source: side("source.spm", MARIAN_VOCAB, config.src_vocab, false)?,
        target: side("target.spm", target_table, config.tgt_vocab, true)?,
        joint: false,
        bos: ids.decoder_start,
        eos: ids.eos,
    };
    let path = match dir.join("generation_config.json") {
        own if own.is_file() => own,
        _ => dir.join("config.json"),
    };
    let text = ember_core_model::files::read_to_string(&path).map_err(io(&path))?;
    let generation = generation::read(&text, config.tgt_vocab).map_err(|e| bad(&path, e))?;
    if let Some(forced) = generation.forced_eos.filter(|&id| id != ids.eos) {
        return Err(bad(&path, format!("forced_eos_token_id {forced} is not the end token {}", ids.eos)));
    }
    let model = Seq2Seq::load(&config, &tensors, device)
        .map_err(|cause| BundleError::Mismatch { path: dir.join("model.safetensors"), cause })?;
    Ok(Translator { model, vocab, generation: Some(generation) })
}

/// θ̄ = (1/n) Σ θ_i over the last `n` checkpoints (Vaswani et al. 2017: the last 5, written 10 minutes apart),
/// written as `model.safetensors` of a new run directory `out` with the same config and vocabularies. Every
/// checkpoint must hold the same f32 tensors with the same shapes.
pub fn average(run_dir: &Path, n: usize, out: &Path) -> Result<Vec<u64>, TranslationError> {
    let all = checkpoints(run_dir)?;
    if all.len() < n || n == 0 {
        return Err(TranslationError::TooFewCheckpoints { dir: run_dir.join(CHECKPOINTS), have: all.len(), want: n });
    }
    let chosen = &all[all.len() - n..];
    let first = &chosen[0].1;
    let mut sum: BTreeMap<String, (Vec<f32>, Vec<usize>)> = BTreeMap::new();
    for (i, (_, path)) in chosen.iter().enumerate() {
        let bad = |tensor: &str, reason: String| TranslationError::Average {
            path: path.clone(),
            tensor: tensor.to_string(),
            reason,
        };
        let (tensors, _) = bundle::load_tensors(path)?;
        if let Some(missing) = sum.keys().find(|name| !tensors.contains_key(*name)) {
            return Err(bad(missing, format!("missing here but present in {}", first.display())));
        }
        for (name, data) in tensors {
            if data.dtype() != DType::F32 {
                return Err(bad(&name, format!("it is {:?}, not F32", data.dtype())));
            }
            let values = data.as_slice::<f32>().map_err(|e| bad(&name, format!("{e:?}")))?;
            if let Some(value) = values.iter().find(|v| !v.is_finite()) {
                return Err(bad(&name, format!("it holds {value}; an average with it would be {value} too")));
            }
            let shape = data.shape().to_vec();
            if i == 0 {
                sum.insert(name.clone(), (vec![0.0; values.len()], shape.clone()));
            }
            let Some((acc, acc_shape)) = sum.get_mut(&name) else {
                return Err(bad(&name, format!("not in {}", first.display())));
            };
            if *acc_shape != shape {
                return Err(bad(&name, format!("shape {shape:?}, but {acc_shape:?} in {}", first.display())));
            }
            acc.iter_mut().zip(values).for_each(|(s, v)| *s += v / n as f32);
        }
    }
    fs::create_dir_all(out).map_err(io(out))?;
    let tensors: Vec<(String, TensorData)> =
        sum.into_iter().map(|(name, (values, shape))| (name, TensorData::new(values, shape))).collect();
    bundle::save_tensors(&out.join(bundle::MODEL), &tensors, HashMap::new())?;
    let config = run_dir.join(bundle::CONFIG);
    fs::copy(&config, out.join(bundle::CONFIG)).map_err(io(&config))?;
    save_vocabularies(&load_vocabularies(run_dir)?, out)?;
    Ok(chosen.iter().map(|(step, _)| *step).collect())
}
