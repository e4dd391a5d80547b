//! Shared pieces of the `ember` binary's end-to-end tests: a small real corpus, tiny run configs, running the CLI.

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The reference Shakespeare corpus: ../shared/data when present, else the one scripts/prepare-data.sh wrote.
pub fn shakespeare() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [root.join("../shared/data/shakespeare.txt"), root.join("data/shakespeare.txt")]
        .into_iter()
        .find(|p| p.exists())
        .expect("no Shakespeare corpus: run scripts/prepare-data.sh shakespeare")
}

/// The first `bytes` of Shakespeare (cut at a character boundary), written into `dir`.
pub fn small_corpus(dir: &Path, bytes: usize) -> PathBuf {
    let text = std::fs::read_to_string(shakespeare()).unwrap();
    let cut = (0..=bytes.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap();
    let path = dir.join("corpus.txt");
    std::fs::write(&path, &text[..cut]).unwrap();
    path
}

/// A tiny GPT run config on `corpus` writing to `out_dir`.
pub fn tiny_config(dir: &Path, corpus: &Path, out_dir: &Path, extra_train: &str) -> PathBuf {
    let text = format!(
        r#"[model]
n_layers = 2
n_heads = 2
d_model = 32
block_size = 32
dropout = 0.0

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
        corpus.display(),
        out_dir.display()
    );
    let path = dir.join("tiny.toml");
    std::fs::write(&path, text).unwrap();
    path
}

pub fn ember(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember")).args(args).output().expect("the ember binary runs")
}

/// Runs `ember train --no-sample ARGS` and asserts it succeeded.
pub fn train_ok(args: &[&str]) -> Output {
    let out = ember(&[&["train", "--no-sample"], args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// The per-step training losses in a run directory's metrics.jsonl.
pub fn step_losses(run_dir: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Some((v["step"].as_u64()?, v.get("loss")?.as_f64()?))
        })
        .collect()
}

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

/// The real SmolLM2-135M-Instruct GGUF that `scripts/prepare-data.sh smollm2` fetches (scripts/test.sh does so).
pub fn smollm2() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.is_file(), "{} is missing: run scripts/prepare-data.sh smollm2", path.display());
    path
}

/// The reference English–Spanish Bible pairs (`train.tsv`, `valid.tsv`, `test.tsv`): ../shared/data when present,
/// else the copy scripts/prepare-data.sh bible-en-es wrote.
pub fn bible() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [root.join("../shared/data/bible-en-es"), root.join("data/bible-en-es")]
        .into_iter()
        .find(|p| p.join("train.tsv").exists())
        .expect("no bible-en-es data: run scripts/prepare-data.sh bible-en-es")
}
