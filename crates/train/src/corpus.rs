//! A text corpus tokenized once into a cached binary file per split (train/val by position, as nanoGPT), and the
//! sampler of random contiguous windows of `seq_len + 1` tokens.

use std::fs;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::Rng;
use ember_core_model::bundle::{self, BundleError};
use ember_core_model::files;
use ember_core_model::tokenizer::{self, TokenizerError};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::collective::Shard;
use crate::config::{DataConfig, TokenizerKind};

pub const TRAIN_BIN: &str = "train.bin";
pub const VAL_BIN: &str = "val.bin";

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("corpus {0} does not exist")]
    Missing(PathBuf),
    #[error("corpus {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("cannot write the run directory {path}: {cause}")]
    RunDir { path: PathBuf, cause: std::io::Error },
    #[error("corpus {0} is empty")]
    Empty(PathBuf),
    #[error("corpus {path} is not UTF-8 text (invalid byte at offset {offset})")]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("corpus {path} has {tokens} tokens in its {split} split, fewer than one window of {needed}")]
    TooSmall { path: PathBuf, split: &'static str, tokens: usize, needed: usize },
    #[error("token cache {0} is corrupt (its length is not a whole number of tokens)")]
    CorruptCache(PathBuf),
    #[error("token cache {path} is corrupt: token {at} is id {id}, past the tokenizer's vocabulary of {vocab}")]
    IdPastVocabulary { path: PathBuf, at: usize, id: u32, vocab: usize },
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
}

/// Reads a corpus as UTF-8 text, refusing a missing, empty or non-UTF-8 file.
pub fn read_text(path: &Path) -> Result<String, CorpusError> {
    if !path.exists() {
        return Err(CorpusError::Missing(path.to_path_buf()));
    }
    let bytes = files::read(path).map_err(|cause| CorpusError::Read { path: path.to_path_buf(), cause })?;
    if bytes.is_empty() {
        return Err(CorpusError::Empty(path.to_path_buf()));
    }
    String::from_utf8(bytes)
        .map_err(|e| CorpusError::NotUtf8 { path: path.to_path_buf(), offset: e.utf8_error().valid_up_to() })
}

/// A run's token ids, split by position.
#[derive(Clone)]
pub struct Corpus {
    pub train: Vec<u32>,
    pub val: Vec<u32>,
}

/// The tokenizer and token splits of a run: with `reuse`, loaded from `run_dir` when it holds them (a resumed
/// run); otherwise trained on the corpus, encoded and cached there.
pub fn prepare(data: &DataConfig, run_dir: &Path, reuse: bool) -> Result<(Tokenizer, Corpus), CorpusError> {
    let (tok_path, train_path, val_path) =
        (run_dir.join(bundle::TOKENIZER), run_dir.join(TRAIN_BIN), run_dir.join(VAL_BIN));
    if reuse && tok_path.exists() && train_path.exists() && val_path.exists() {
        return load(run_dir);
    }
    let text = read_text(&data.corpus)?;
    let tok = match data.tokenizer {
        // A run directory that already has a tokenizer (a converted or imported model) keeps it.
        _ if reuse && tok_path.exists() => tokenizer::load(&tok_path)?,
        TokenizerKind::Char => tokenizer::train_char(&text)?,
        TokenizerKind::Bpe => tokenizer::train_bpe(&text, data.vocab_size.unwrap_or(256))?,
    };
    let ids = encode_lines(&tok, &text)?;
    let n_train = ((1.0 - data.val_fraction) * ids.len() as f64) as usize;
    let corpus = Corpus { train: ids[..n_train].to_vec(), val: ids[n_train..].to_vec() };
    fs::create_dir_all(run_dir).map_err(|cause| CorpusError::RunDir { path: run_dir.to_path_buf(), cause })?;
    write_tokens(&train_path, &corpus.train)?;
    write_tokens(&val_path, &corpus.val)?;
    tokenizer::save(&tok, &tok_path)?;
    Ok((tok, corpus))
}

/// The tokenizer and token splits a run directory holds (written by [`prepare`]).
pub fn load(run_dir: &Path) -> Result<(Tokenizer, Corpus), CorpusError> {
    let corpus = Corpus { train: read_tokens(&run_dir.join(TRAIN_BIN))?, val: read_tokens(&run_dir.join(VAL_BIN))? };
    Ok((tokenizer::load(&run_dir.join(bundle::TOKENIZER))?, corpus))
}

/// Encodes text line by line (newlines kept), which the tokenizer handles in parallel.
fn encode_lines(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, CorpusError> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let encodings = tok.encode_batch(lines, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
    Ok(encodings.iter().flat_map(|e| e.get_ids().iter().copied()).collect())
}

fn write_tokens(path: &Path, ids: &[u32]) -> Result<(), CorpusError> {
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    Ok(bundle::write_atomic(path, &bytes)?)
}

fn read_tokens(path: &Path) -> Result<Vec<u32>, CorpusError> {
    let bytes = files::read(path).map_err(|cause| CorpusError::Read { path: path.to_path_buf(), cause })?;
    if bytes.len() % 4 != 0 {
        return Err(CorpusError::CorruptCache(path.to_path_buf()));
    }
    Ok(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

impl Corpus {
    /// Fails when a token id is past the tokenizer's `vocab` (a corrupt or foreign token cache in `run_dir`), which
    /// would index past the embedding.
    pub fn check_ids(&self, vocab: usize, run_dir: &Path) -> Result<(), CorpusError> {
        for (name, ids) in [(TRAIN_BIN, &self.train), (VAL_BIN, &self.val)] {
            if let Some((at, &id)) = ids.iter().enumerate().find(|&(_, &id)| id as usize >= vocab) {
                return Err(CorpusError::IdPastVocabulary { path: run_dir.join(name), at, id, vocab });
            }
        }
        Ok(())
    }

    /// Fails unless each split holds at least one window of `seq_len + 1` tokens.
    pub fn check_fits(&self, corpus: &Path, seq_len: usize) -> Result<(), CorpusError> {
        for (split, tokens) in [("train", &self.train), ("val", &self.val)] {
            if tokens.len() < seq_len + 1 {
                return Err(CorpusError::TooSmall {
                    path: corpus.to_path_buf(),
                    split,
                    tokens: tokens.len(),
                    needed: seq_len + 1,
                });
            }
        }
        Ok(())
    }
}

/// Random contiguous windows; the whole state is one generator, so it checkpoints exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampler {
    pub rng: Rng,
}

/// Inputs x = w[0..T] and targets y = w[1..T+1] of B windows w, as [B, T] id tensors.
pub struct Batch {
    pub x: Tensor<2, Int>,
    pub y: Tensor<2, Int>,
}

impl Sampler {
    pub fn new(seed: u64) -> Self {
        Self { rng: Rng::new(seed) }
    }

    /// B windows at uniformly random offsets i ∈ [0, len − T − 1].
    pub fn batch(&mut self, tokens: &[u32], b: usize, t: usize, device: &Device) -> Batch {
        self.shard(tokens, b, t, Shard::WHOLE, device)
    }

    /// `shard`'s B windows of a global batch of B · ranks: every rank draws the same offsets and keeps its own.
    pub fn shard(&mut self, tokens: &[u32], b: usize, t: usize, shard: Shard, device: &Device) -> Batch {
        let offsets: Vec<usize> = (0..b * shard.ranks).map(|_| self.rng.below(tokens.len() - t)).collect();
        let (mut x, mut y) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
        for &i in &offsets[shard.rows(b * shard.ranks)] {
            x.extend(tokens[i..i + t].iter().map(|&id| id as i64));
            y.extend(tokens[i + 1..i + t + 1].iter().map(|&id| id as i64));
        }
        Batch {
            x: Tensor::from_data(TensorData::new(x, [b, t]), device),
            y: Tensor::from_data(TensorData::new(y, [b, t]), device),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_directory_that_cannot_be_written_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.txt");
        std::fs::write(&corpus, "To be, or not to be, that is the question.\n".repeat(20)).unwrap();
        let data =
            DataConfig { corpus, dataset: None, tokenizer: TokenizerKind::Char, vocab_size: None, val_fraction: 0.1 };
        // A path under a regular file cannot become a directory, whoever runs the test.
        let run_dir = dir.path().join("corpus.txt/run");
        let error = prepare(&data, &run_dir, false).err().expect("an unwritable run directory").to_string();
        assert!(error.starts_with("cannot write the run directory"), "{error}");
    }

    #[test]
    fn windows_are_shifted_by_one_and_deterministic() {
        let dev = Device::flex();
        let tokens: Vec<u32> = (0..100).collect();
        let (mut a, mut b) = (Sampler::new(3), Sampler::new(3));
        let batch = a.batch(&tokens, 4, 8, &dev);
        let x = batch.x.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        let y = batch.y.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        assert!(x.iter().zip(&y).all(|(x, y)| y - x == 1));
        assert!(x.chunks(8).all(|w| w.windows(2).all(|p| p[1] - p[0] == 1)), "windows are contiguous");
        let again = b.batch(&tokens, 4, 8, &dev).x.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        assert_eq!(x, again);
    }

    /// Two ranks' shards are the two halves of the one-process batch of twice the windows.
    #[test]
    fn shards_split_the_global_batch() {
        let dev = Device::flex();
        let tokens: Vec<u32> = (0..100).collect();
        let ids = |batch: Batch| batch.x.into_data().convert::<i64>().try_to_vec::<i64>().unwrap();
        let whole = ids(Sampler::new(5).batch(&tokens, 6, 4, &dev));
        let halves: Vec<i64> =
            (0..2).flat_map(|rank| ids(Sampler::new(5).shard(&tokens, 3, 4, Shard { rank, ranks: 2 }, &dev))).collect();
        assert_eq!(whole, halves);
    }

    #[test]
    fn bad_corpora_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.txt");
        assert!(matches!(read_text(&missing), Err(CorpusError::Missing(_))));
        let empty = dir.path().join("empty.txt");
        fs::write(&empty, "").unwrap();
        assert!(matches!(read_text(&empty), Err(CorpusError::Empty(_))));
        let latin1 = dir.path().join("latin1.txt");
        fs::write(&latin1, b"caf\xe9\n").unwrap();
        let err = read_text(&latin1).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("corpus {} is not UTF-8 text (invalid byte at offset 3)", latin1.display())
        );
    }
}
