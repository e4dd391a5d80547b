//! Shared pieces of the `ember` binary's end-to-end tests: a small real corpus, tiny run configs, running the CLI.

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod server;

/// The repository's test fixtures (tests/fixtures: slices of the reference corpora, see its README).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The first `bytes` (at most 100,000) of the Shakespeare corpus (cut at a character boundary), written into `dir`.
pub fn small_corpus(dir: &Path, bytes: usize) -> PathBuf {
    let text = std::fs::read_to_string(fixtures().join("shakespeare-100k.txt")).unwrap();
    assert!(bytes <= text.len(), "the Shakespeare fixture holds {} bytes, not {bytes}", text.len());
    let cut = (0..=bytes.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap();
    let path = dir.join("corpus.txt");
    std::fs::write(&path, &text[..cut]).unwrap();
    path
}

/// A tiny GPT run on the first `bytes` of the Shakespeare fixture: its config file and run directory (`dir/run`).
pub fn tiny_setup(dir: &Path, bytes: usize) -> (PathBuf, PathBuf) {
    let (corpus, run) = (small_corpus(dir, bytes), dir.join("run"));
    (tiny_config(dir, &corpus, &run, ""), run)
}

/// A tiny GPT run config on `corpus` writing to `out_dir`.
pub fn tiny_config(dir: &Path, corpus: &Path, out_dir: &Path, extra_train: &str) -> PathBuf {
    let text = format!(
        r#"{}
[data]
corpus = "{}"
tokenizer = "char"

[train]
seed = 7
batch_size = 4
max_steps = 40
lr = 3e-3
min_lr = 3e-4
warmup_steps = 5
decay_steps = 40
beta2 = 0.99
weight_decay = 0.1
grad_clip = 1.0
eval_interval = 10
eval_iters = 2
out_dir = "{}"
{extra_train}
[sample]
max_new_tokens = 20
"#,
        ember_test_support::model_table(2, 2, 32, 32),
        corpus.display(),
        out_dir.display()
    );
    let path = dir.join("tiny.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A fresh temporary directory holding the first `bytes` of Shakespeare and the tiny config (`extra_train` added to
/// its `[train]`) of a run at `dir/run`, not trained yet.
pub struct Tiny {
    pub dir: tempfile::TempDir,
    pub run: PathBuf,
    config: PathBuf,
}

impl Tiny {
    pub fn new(bytes: usize, extra_train: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let corpus = small_corpus(dir.path(), bytes);
        let run = dir.path().join("run");
        let config = tiny_config(dir.path(), &corpus, &run, extra_train);
        Self { dir, run, config }
    }

    /// The config's path, as an argument.
    pub fn config(&self) -> &str {
        self.config.to_str().unwrap()
    }

    /// `ember train --device cpu --config CONFIG` with `args` after it.
    pub fn train(&self, args: &[&str]) -> Output {
        ember(&[&["train", "--device", "cpu", "--config", self.config()], args].concat())
    }
}

/// A tiny run (`tiny_config`) trained for `steps` steps on the first 20 kB of Shakespeare, in `dir/run`.
pub fn tiny_run(dir: &Path, steps: u64) -> PathBuf {
    let (config, run) = tiny_setup(dir, 20_000);
    let steps = format!("train.max_steps={steps}");
    train_ok(&["--device", "cpu", "--config", config.to_str().unwrap(), "--set", &steps]);
    run
}

pub fn ember(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .env("EMBER_CACHE_DIR", test_cache())
        .args(args)
        .output()
        .expect("the ember binary runs")
}

/// The token cache of the runs tests start: in the system's temporary directory, not the home's.
pub fn test_cache() -> PathBuf {
    std::env::temp_dir().join("ember-tests-cache")
}

/// Runs `ember generate --device cpu --model MODEL` with `args` after it.
pub fn generate_on_cpu(model: &Path, args: &[&str]) -> Output {
    ember(&[&["generate", "--device", "cpu", "--model", model.to_str().unwrap()], args].concat())
}

/// Runs `ember train --no-sample ARGS` and asserts it succeeded.
pub fn train_ok(args: &[&str]) -> Output {
    let out = ember(&[&["train", "--no-sample"], args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[allow(unused_imports)] // each test file uses a different part
pub use ember_test_support::step_losses;

/// Asserts a command failed with one line on stderr that contains `needle`, and did not panic.
pub fn assert_clean_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {stderr}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(needle),
        "expected an error naming {needle:?}, got: {stderr}"
    );
}

/// The real SmolLM2-135M-Instruct GGUF that `scripts/prepare-data.sh smollm2` fetches (scripts/test.sh does so);
/// the tests that read it are `#[ignore]`d, run by scripts/test.sh.
pub fn smollm2() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.is_file(), "{} is missing: run scripts/prepare-data.sh smollm2", path.display());
    path
}

/// Gemma 3 270M's Q4_K_M GGUF, which scripts/test.sh fetches before the tests.
pub fn gemma3() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gemma3/gemma-3-270m-q4_k_m.gguf");
    assert!(path.is_file(), "{} is missing: run scripts/prepare-data.sh gemma3", path.display());
    path
}

/// The first 600 training and 12 validation English–Spanish verse pairs (`train.tsv`, `valid.tsv`).
pub fn bible() -> PathBuf {
    fixtures().join("bible-en-es")
}

/// The first `lines` lines of `src`, written to `dst`.
fn head(src: &Path, dst: &Path, lines: usize) {
    let text = std::fs::read_to_string(src).unwrap();
    std::fs::write(dst, text.lines().take(lines).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
}

/// A tiny translation run config over the first 600 English–Spanish verse pairs, writing to `out`.
pub fn tiny_translation_config(dir: &Path, out: &Path) -> std::path::PathBuf {
    let data = bible();
    head(&data.join("train.tsv"), &dir.join("train.tsv"), 600);
    head(&data.join("valid.tsv"), &dir.join("valid.tsv"), 12);
    let train = "max_tokens = 1024\nmax_steps = 12\nlr = 2.0\nwarmup_steps = 4\neval_interval = 6\n\
                 bleu_sentences = 4\ncheckpoint_interval = 3\nkeep_checkpoints = 3\n";
    let text = ember_test_support::translation_toml(2, 32, 96, 400, dir, out, train);
    let path = dir.join("tiny-translation.toml");
    std::fs::write(&path, text).unwrap();
    path
}
