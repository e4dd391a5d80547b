//! The run directory a trainer writes. A new run refuses one that already holds a model or a checkpoint (unless
//! `--force`), and every trainer holds an exclusive lock on its directory, so two trainers never interleave their
//! writes there.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use anyhow::{Context, Result, bail};
use ember_core_model::bundle;
use ember_train::corpus::TRAIN_BIN;

/// The lock file inside a run directory.
const LOCK: &str = ".lock";

/// Files that make a directory someone's model: a run directory's weights, a Hugging Face directory's config, sharded
/// and PyTorch weights.
const MODEL_FILES: [&str; 5] =
    [bundle::MODEL, "config.json", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"];

/// The file in `dir` that makes it someone's model: one of [`MODEL_FILES`], a GGUF file, or a tokenizer that is not
/// an Ember run's own (a run writes its token files beside it, then `config.toml`).
fn model_file(dir: &Path) -> Option<String> {
    if let Some(found) = MODEL_FILES.iter().find(|name| dir.join(name).exists()) {
        return Some(found.to_string());
    }
    let names = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let gguf = names.map(|e| e.file_name().to_string_lossy().into_owned()).filter(|name| name.ends_with(".gguf"));
    let ours = [bundle::CONFIG, TRAIN_BIN].iter().any(|name| dir.join(name).exists());
    let foreign_tokenizer = dir.join(bundle::TOKENIZER).exists() && !ours;
    gguf.min().or(foreign_tokenizer.then(|| bundle::TOKENIZER.to_string()))
}

/// Refuses a new run in `dir` when it holds a checkpoint or a model, unless `force` (its files are then replaced).
pub fn check_new(dir: &Path, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    if dir.join(bundle::CHECKPOINT).exists() {
        bail!(
            "{} already holds a checkpoint; continue it with --resume {0}, choose another train.out_dir, or pass \
             --force to overwrite it",
            dir.display()
        );
    }
    if let Some(found) = model_file(dir) {
        bail!(
            "{} already holds a model ({found}); choose another train.out_dir, or pass --force to overwrite it",
            dir.display()
        );
    }
    Ok(())
}

/// An exclusive lock on a run directory: its `.lock` file locked with the operating system's file lock, which is
/// released when this is dropped or when the process ends, however it ends.
pub struct RunLock {
    _file: File,
}

/// Locks `dir` (created if missing) for one trainer; a second gets a clear error at once instead of waiting. Once
/// locked, the `.tmp` files of atomic writes that a killed trainer left unfinished (in `dir` and its `checkpoints/`)
/// are removed: nobody else can be writing them.
pub fn lock(dir: &Path) -> Result<RunLock> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating the run directory {}", dir.display()))?;
    let path = dir.join(LOCK);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {
            remove_unfinished(dir)?;
            remove_unfinished(&dir.join("checkpoints"))?;
            Ok(RunLock { _file: file })
        }
        Err(TryLockError::WouldBlock) => {
            bail!("{} is in use by another trainer (it holds {})", dir.display(), path.display())
        }
        Err(TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

/// [`lock`] on the rank that writes the run directory (rank 0); the other ranks of a data-parallel run hold none.
pub fn lock_on_rank_0(dir: &Path, rank: usize) -> Result<Option<RunLock>> {
    (rank == 0).then(|| lock(dir)).transpose()
}

/// Removes the `*.tmp` files directly in `dir` (none if it does not exist).
fn remove_unfinished(dir: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "tmp") && path.is_file() {
            std::fs::remove_file(&path).with_context(|| format!("removing the unfinished {}", path.display()))?;
        }
    }
    Ok(())
}
