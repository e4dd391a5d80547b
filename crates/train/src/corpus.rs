//! A text corpus tokenized once, in a streaming pass, into a token file per split (train/val by position, as
//! nanoGPT's `train.bin`), which training reads a window at a time, so a corpus of any size trains in bounded memory;
//! and the sampler of random contiguous windows of `seq_len + 1` tokens.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::Rng;
use ember_core_model::bundle::{self, BundleError};
use ember_core_model::files;
use ember_core_model::tokenizer::{self, TokenizerError};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::collective::Shard;
use crate::config::{DataConfig, TokenizerKind};
use crate::token_cache::TokenCache;

pub const TRAIN_BIN: &str = "train.bin";
pub const VAL_BIN: &str = "val.bin";
/// What [`prepare`] writes into a run directory, and a token cache keeps.
const RUN_FILES: [&str; 3] = [bundle::TOKENIZER, TRAIN_BIN, VAL_BIN];

/// Bytes of text encoded at once (whole lines): the tokenizer's per-token records of one chunk are what tokenizing
/// holds in memory, whatever the corpus's size. Small enough that no buffer of a chunk reaches the 4 MiB from which
/// Ember's allocator keeps freed blocks for reuse at their exact size (chunks of varying sizes would fill it).
const CHUNK_BYTES: usize = 256 << 10;
/// Bytes of text a BPE is trained on at most: its first whole lines (the trainer's word counts grow with it).
pub const BPE_SAMPLE_BYTES: usize = 64 << 20;
/// Token ids read at once when a whole split is scanned.
const SCAN_TOKENS: usize = 1 << 18;

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
    let mut text = String::new();
    for chunk in TextChunks::open(path, usize::MAX)? {
        text.push_str(&chunk?);
    }
    Ok(text)
}

/// A corpus's text in chunks of whole lines of about `size` bytes (the last may lack its newline), each checked as
/// UTF-8; a missing or empty file is refused when opened.
struct TextChunks {
    path: PathBuf,
    reader: BufReader<File>,
    size: usize,
    /// Bytes read so far, of `total`.
    offset: usize,
    total: u64,
}

impl TextChunks {
    fn open(path: &Path, size: usize) -> Result<Self, CorpusError> {
        if !path.exists() {
            return Err(CorpusError::Missing(path.to_path_buf()));
        }
        let read = |cause| CorpusError::Read { path: path.to_path_buf(), cause };
        files::check_regular(path).map_err(read)?;
        let file = File::open(path).map_err(read)?;
        let total = file.metadata().map_err(read)?.len();
        if total == 0 {
            return Err(CorpusError::Empty(path.to_path_buf()));
        }
        Ok(Self { path: path.to_path_buf(), reader: BufReader::new(file), size, offset: 0, total })
    }
}

impl Iterator for TextChunks {
    type Item = Result<String, CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        let read = |cause| CorpusError::Read { path: self.path.clone(), cause };
        let mut bytes = Vec::new();
        if let Err(e) = (&mut self.reader).take(self.size as u64).read_to_end(&mut bytes) {
            return Some(Err(read(e)));
        }
        // The chunk ends at a newline, an ASCII byte, so it never splits a character.
        if bytes.last().is_some_and(|&b| b != b'\n')
            && let Err(e) = self.reader.read_until(b'\n', &mut bytes)
        {
            return Some(Err(read(e)));
        }
        if bytes.is_empty() {
            return None;
        }
        let at = self.offset;
        self.offset += bytes.len();
        Some(
            String::from_utf8(bytes).map_err(|e| CorpusError::NotUtf8 {
                path: self.path.clone(),
                offset: at + e.utf8_error().valid_up_to(),
            }),
        )
    }
}

/// A split's token ids: a file of little-endian u32s read a window at a time (so the corpus never has to fit in
/// memory, and each rank reads only the windows it trains on), or ids held in memory.
#[derive(Clone, Debug)]
pub enum Tokens {
    File { path: PathBuf, file: Arc<File>, len: usize },
    Memory(Vec<u32>),
}

impl From<Vec<u32>> for Tokens {
    fn from(ids: Vec<u32>) -> Self {
        Self::Memory(ids)
    }
}

impl Tokens {
    /// The token file at `path` (written by [`prepare`]).
    pub fn open(path: &Path) -> Result<Self, CorpusError> {
        let read = |cause| CorpusError::Read { path: path.to_path_buf(), cause };
        let file = File::open(path).map_err(read)?;
        let bytes = file.metadata().map_err(read)?.len();
        if !bytes.is_multiple_of(4) {
            return Err(CorpusError::CorruptCache(path.to_path_buf()));
        }
        Ok(Self::File { path: path.to_path_buf(), file: Arc::new(file), len: (bytes / 4) as usize })
    }

    pub fn len(&self) -> usize {
        match self {
            Self::File { len, .. } => *len,
            Self::Memory(ids) => ids.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens [start, start + n).
    pub fn window(&self, start: usize, n: usize) -> Vec<u32> {
        match self {
            Self::Memory(ids) => ids[start..start + n].to_vec(),
            Self::File { path, file, .. } => {
                let mut bytes = vec![0u8; 4 * n];
                file.read_exact_at(&mut bytes, 4 * start as u64)
                    .unwrap_or_else(|e| panic!("{}: reading tokens {start}..{}: {e}", path.display(), start + n));
                bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            }
        }
    }

    /// The first token at or past `vocab`, with its position.
    fn first_past(&self, vocab: usize) -> Option<(usize, u32)> {
        (0..self.len()).step_by(SCAN_TOKENS).find_map(|start| {
            let ids = self.window(start, SCAN_TOKENS.min(self.len() - start));
            ids.iter().position(|&id| id as usize >= vocab).map(|i| (start + i, ids[i]))
        })
    }
}

/// A run's token ids, split by position.
#[derive(Clone)]
pub struct Corpus {
    pub train: Tokens,
    pub val: Tokens,
}

/// The tokenizer and token splits of a run: with `reuse`, loaded from `run_dir` when it holds them (a resumed
/// run); otherwise trained on the corpus (a BPE on its first [`BPE_SAMPLE_BYTES`]), encoded chunk by chunk into the
/// token files there.
pub fn prepare(data: &DataConfig, run_dir: &Path, reuse: bool) -> Result<(Tokenizer, Corpus), CorpusError> {
    prepare_reporting(data, run_dir, reuse, None, &mut |_, _| {})
}

/// [`prepare`], taking the tokenizer and token files from `cache` where it holds this corpus's (and keeping them
/// there otherwise), and telling `progress` the bytes of the corpus encoded so far and its size after each chunk.
pub fn prepare_reporting(
    data: &DataConfig,
    run_dir: &Path,
    reuse: bool,
    cache: Option<&TokenCache>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Tokenizer, Corpus), CorpusError> {
    let (tok_path, train_path, val_path) =
        (run_dir.join(bundle::TOKENIZER), run_dir.join(TRAIN_BIN), run_dir.join(VAL_BIN));
    if reuse && tok_path.exists() && train_path.exists() && val_path.exists() {
        return load(run_dir);
    }
    // A run directory that already has a tokenizer (a converted or imported model) keeps it, and its tokens are its
    // own; others are the corpus's, which the cache keeps.
    let own_tokenizer = reuse && tok_path.exists();
    let cache = cache.filter(|_| !own_tokenizer);
    if cache.is_some_and(|cache| cache.restore(data, run_dir, &RUN_FILES)) {
        return load(run_dir);
    }
    let tok = match data.tokenizer {
        _ if own_tokenizer => tokenizer::load(&tok_path)?,
        TokenizerKind::Char => {
            let mut chars = std::collections::BTreeSet::new();
            for chunk in TextChunks::open(&data.corpus, CHUNK_BYTES)? {
                chars.extend(chunk?.chars());
            }
            tokenizer::train_char(&chars.into_iter().collect::<String>())?
        }
        TokenizerKind::Bpe => {
            let sample = TextChunks::open(&data.corpus, BPE_SAMPLE_BYTES)?.next().expect("a corpus is not empty")?;
            tokenizer::train_bpe(&sample, data.vocab_size.unwrap_or(256))?
        }
    };
    let run_dir_error = |cause| CorpusError::RunDir { path: run_dir.to_path_buf(), cause };
    fs::create_dir_all(run_dir).map_err(run_dir_error)?;
    // Every token to one file, then its first (1 − val_fraction) to train.bin and the rest to val.bin.
    let all_path = run_dir.join("tokens.tmp");
    let mut all = BufWriter::new(File::create(&all_path).map_err(run_dir_error)?);
    let mut count = 0usize;
    let mut chunks = TextChunks::open(&data.corpus, CHUNK_BYTES)?;
    while let Some(chunk) = chunks.next() {
        let ids = encode_lines(&tok, &chunk?)?;
        count += ids.len();
        all.write_all(&ids.iter().flat_map(|id| id.to_le_bytes()).collect::<Vec<u8>>()).map_err(run_dir_error)?;
        progress(chunks.offset as u64, chunks.total);
    }
    all.flush().map_err(run_dir_error)?;
    drop(all);
    let n_train = ((1.0 - data.val_fraction) * count as f64) as usize;
    let mut tokens = File::open(&all_path).map_err(run_dir_error)?;
    write_streamed(&train_path, &mut (&mut tokens).take(4 * n_train as u64))?;
    write_streamed(&val_path, &mut tokens)?;
    fs::remove_file(&all_path).map_err(run_dir_error)?;
    tokenizer::save(&tok, &tok_path)?;
    if let Some(cache) = cache {
        cache.store(data, run_dir, &RUN_FILES);
    }
    let corpus = Corpus { train: Tokens::open(&train_path)?, val: Tokens::open(&val_path)? };
    Ok((tok, corpus))
}

/// The tokenizer and token splits a run directory holds (written by [`prepare`]).
pub fn load(run_dir: &Path) -> Result<(Tokenizer, Corpus), CorpusError> {
    let corpus = Corpus { train: Tokens::open(&run_dir.join(TRAIN_BIN))?, val: Tokens::open(&run_dir.join(VAL_BIN))? };
    Ok((tokenizer::load(&run_dir.join(bundle::TOKENIZER))?, corpus))
}

/// Encodes text line by line (newlines kept), which the tokenizer handles in parallel.
fn encode_lines(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, CorpusError> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let encodings = tok.encode_batch(lines, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
    Ok(encodings.iter().flat_map(|e| e.get_ids().iter().copied()).collect())
}

/// Writes what `from` reads to `path` atomically: a temporary file beside it, flushed, then renamed over it.
fn write_streamed(path: &Path, from: &mut impl Read) -> Result<(), CorpusError> {
    files::replace(path, |out| std::io::copy(from, out).map(drop))
        .map_err(|cause| CorpusError::RunDir { path: path.to_path_buf(), cause })
}

impl Corpus {
    /// Fails when a token id is past the tokenizer's `vocab` (a corrupt or foreign token cache in `run_dir`), which
    /// would index past the embedding.
    pub fn check_ids(&self, vocab: usize, run_dir: &Path) -> Result<(), CorpusError> {
        for (name, ids) in [(TRAIN_BIN, &self.train), (VAL_BIN, &self.val)] {
            if let Some((at, id)) = ids.first_past(vocab) {
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
    pub fn batch(&mut self, tokens: &Tokens, b: usize, t: usize, device: &Device) -> Batch {
        self.shard(tokens, b, t, Shard::WHOLE, device)
    }

    /// `shard`'s B windows of a global batch of B · ranks: every rank draws the same offsets and keeps its own.
    pub fn shard(&mut self, tokens: &Tokens, b: usize, t: usize, shard: Shard, device: &Device) -> Batch {
        let offsets: Vec<usize> = (0..b * shard.ranks).map(|_| self.rng.below(tokens.len() - t)).collect();
        let (mut x, mut y) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
        for &i in &offsets[shard.rows(b * shard.ranks)] {
            let window = tokens.window(i, t + 1);
            x.extend(window[..t].iter().map(|&id| id as i64));
            y.extend(window[1..].iter().map(|&id| id as i64));
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

    /// A character-level text corpus.
    fn char_data(corpus: PathBuf) -> DataConfig {
        let (format, tokenizer) = (Default::default(), TokenizerKind::Char);
        DataConfig { corpus, format, dataset: None, tokenizer, vocab_size: None, val_fraction: 0.1 }
    }

    #[test]
    fn a_run_directory_that_cannot_be_written_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.txt");
        std::fs::write(&corpus, "To be, or not to be, that is the question.\n".repeat(20)).unwrap();
        let data = char_data(corpus);
        // A path under a regular file cannot become a directory, whoever runs the test.
        let run_dir = dir.path().join("corpus.txt/run");
        let error = prepare(&data, &run_dir, false).err().expect("an unwritable run directory").to_string();
        assert!(error.starts_with("cannot write the run directory"), "{error}");
    }

    #[test]
    fn windows_are_shifted_by_one_and_deterministic() {
        let dev = Device::flex();
        let tokens = Tokens::from((0..100).collect::<Vec<u32>>());
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
        let tokens = Tokens::from((0..100).collect::<Vec<u32>>());
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

    /// A second run on the same corpus takes its tokens from the cache (a mark put into the cached split shows
    /// through); a changed corpus is tokenized afresh.
    #[test]
    fn a_second_run_on_the_same_corpus_takes_its_tokens_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let corpus = dir.path().join("corpus.txt");
        fs::write(&corpus, "To be, or not to be, that is the question.\n".repeat(20)).unwrap();
        let data = char_data(corpus);
        let cache = TokenCache::new(dir.path().join("cache"));
        let prepare = |run: &str| prepare_reporting(&data, &dir.path().join(run), false, Some(&cache), &mut |_, _| {});
        let first = prepare("a").unwrap().1.train.window(0, 1);
        let entry = cache.entry(&data).unwrap();
        let mut marked = fs::read(entry.join(TRAIN_BIN)).unwrap();
        marked[..4].copy_from_slice(&7u32.to_le_bytes());
        fs::write(entry.join(TRAIN_BIN), marked).unwrap();
        assert_eq!(prepare("b").unwrap().1.train.window(0, 1), [7], "the second run's tokens are the cache's");
        assert_ne!(first, [7]);
        fs::write(&data.corpus, "To be, or not to be, that is the question!\n".repeat(21)).unwrap();
        assert_ne!(prepare("c").unwrap().1.train.window(0, 1), [7], "a changed corpus is tokenized again");
    }
}
