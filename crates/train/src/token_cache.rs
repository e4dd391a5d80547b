//! Token files kept between runs, as nanoGPT's `prepare.py` keeps `train.bin` beside its data: a new run on the same
//! corpus (the same file, size and modification time) with the same data settings copies the tokenizer and the token
//! files of the first instead of training a tokenizer and encoding the corpus again.
//! An entry is a directory of the files a run directory names them by (the caller's `files`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use ember_core_model::files;

use crate::collective::fingerprint;
use crate::config::DataConfig;

/// A directory of entries, one per corpus and data settings.
pub struct TokenCache {
    dir: PathBuf,
}

impl TokenCache {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The entry of `data`'s corpus as it is now; None when the corpus cannot be read.
    pub fn entry(&self, data: &DataConfig) -> Option<PathBuf> {
        let meta = fs::metadata(&data.corpus).ok()?;
        let modified = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
        let corpus = fs::canonicalize(&data.corpus).ok()?;
        let (kind, vocab, val) = (data.tokenizer, data.vocab_size, data.val_fraction);
        let key = format!("1|{}|{}|{modified}|{kind:?}|{vocab:?}|{val}", corpus.display(), meta.len());
        Some(self.dir.join(format!("{:016x}", fingerprint(key.as_bytes()))))
    }

    /// Copies the `files` of `data`'s entry into `run_dir`; false when the entry lacks one, or cannot be read.
    pub fn restore(&self, data: &DataConfig, run_dir: &Path, files: &[&str]) -> bool {
        let Some(entry) = self.entry(data).filter(|e| files.iter().all(|name| e.join(name).is_file())) else {
            return false;
        };
        let copied = fs::create_dir_all(run_dir)
            .and_then(|_| files.iter().try_for_each(|name| copy_whole(&entry.join(name), &run_dir.join(name))));
        copied.is_ok()
    }

    /// Keeps `run_dir`'s `files` as the entry of `data`, whole or not at all. A cache that cannot be written (a
    /// read-only home) only means the next run tokenizes again.
    pub fn store(&self, data: &DataConfig, run_dir: &Path, files: &[&str]) {
        let Some(entry) = self.entry(data) else { return };
        let tmp = entry.with_extension(format!("tmp{}", std::process::id()));
        let written = fs::create_dir_all(&tmp)
            .and_then(|_| files.iter().try_for_each(|name| fs::copy(run_dir.join(name), tmp.join(name)).map(|_| ())))
            .and_then(|_| fs::rename(&tmp, &entry));
        if written.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
    }
}

/// `from` copied to `to` through a temporary file beside it, so that `to` is whole or absent.
fn copy_whole(from: &Path, to: &Path) -> std::io::Result<()> {
    files::replace(to, |out| std::io::copy(&mut fs::File::open(from)?, out).map(drop))
}
