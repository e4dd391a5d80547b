//! The run config: one TOML file with `[model]`, `[data]`, `[train]` and `[sample]`, overridden by
//! `--set section.key=value`, and validated before any work starts.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use ember_core_model::ModelConfig;
use ember_serve::GenerationRequest;
use ember_train::config::TaskKind;
use ember_train::translation::TranslationConfig;
use ember_train::{DataConfig, TrainConfig};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelConfig,
    pub data: DataConfig,
    pub train: TrainConfig,
    #[serde(default)]
    pub sample: GenerationRequest,
}

impl RunConfig {
    /// Reads, overrides and validates a config file; every error names the file and the key.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let config: Self = deserialize(path, read_table(path, overrides)?)?;
        config.validate().map_err(|e| anyhow!("{}: {e}", path.display()))?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ember_core_model::Invalid> {
        self.model.validate()?;
        self.data.validate()?;
        self.train.validate(TaskKind::LanguageModel, &self.model)?;
        self.sample.validate()
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a run config serialises to TOML")
    }
}

/// A run config of either kind, read once: a `[seq2seq]` table makes it a translator's.
pub enum AnyRunConfig {
    LanguageModel(RunConfig),
    Translation(TranslationConfig),
}

impl AnyRunConfig {
    /// Reads, overrides and validates a config file of either kind.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let table = read_table(path, overrides)?;
        let invalid = |e: ember_core_model::Invalid| anyhow!("{}: {e}", path.display());
        if table.contains_key("seq2seq") {
            let config: TranslationConfig = deserialize(path, table)?;
            config.validate().map_err(invalid)?;
            return Ok(Self::Translation(config));
        }
        let config: RunConfig = deserialize(path, table)?;
        config.validate().map_err(invalid)?;
        Ok(Self::LanguageModel(config))
    }
}

/// The table of a TOML config file with `--set` overrides applied; errors name the file, line and key.
fn read_table(path: &Path, overrides: &[String]) -> Result<toml::Table> {
    let file = path.display();
    let text = ember_core_model::files::read_to_string(path).with_context(|| format!("config {file}"))?;
    let mut table: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow!("{file}:{}: {}", position(&text, e.span()), e.message()))?;
    for assignment in overrides {
        set(&mut table, assignment)?;
    }
    Ok(table)
}

/// `table` as a `T`; an error names the file `path` and the key.
fn deserialize<T: serde::de::DeserializeOwned>(path: &Path, table: toml::Table) -> Result<T> {
    T::deserialize(toml::Value::Table(table)).map_err(|e| anyhow!("{}: {}", path.display(), one_line(&e.to_string())))
}

/// "line:column" of a byte span's start.
fn position(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let at = span.map_or(0, |s| s.start.min(text.len()));
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = at - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{line}:{column}")
}

/// toml's "message\nin `model.n_layers`" as "message (in `model.n_layers`)".
fn one_line(message: &str) -> String {
    let mut lines = message.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or_default().to_string();
    lines.fold(first, |acc, l| format!("{acc} ({})", l.trim()))
}

/// Applies `section.key=value`; the value is read as TOML (numbers, booleans, quoted strings), else as a string.
fn set(table: &mut toml::Table, assignment: &str) -> Result<()> {
    let usage = || anyhow!("--set {assignment}: expected section.key=value, e.g. train.max_steps=100");
    let (key, raw) = assignment.split_once('=').ok_or_else(usage)?;
    let (section, field) = key.trim().split_once('.').ok_or_else(usage)?;
    if section.is_empty() || field.is_empty() || field.contains('.') {
        return Err(usage());
    }
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").ok_or_else(usage)?,
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let entry = table.entry(section.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(section_table) = entry.as_table_mut() else {
        bail!("--set {assignment}: {section} is not a [section]");
    };
    section_table.insert(field.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BABY: &str = "configs/shakespeare-char.toml";

    fn baby() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(BABY)
    }

    #[test]
    fn the_baby_gpt_config_loads_and_overrides_apply() {
        let config = RunConfig::load(&baby(), &["train.max_steps=100".into(), "sample.prompt=ROMEO:".into()]).unwrap();
        assert_eq!(config.train.max_steps, 100);
        assert_eq!(config.sample.prompt, "ROMEO:");
        assert_eq!(
            (config.model.n_layers, config.model.n_heads, config.model.d_model, config.model.block_size),
            (4, 4, 128, 64)
        );
    }

    #[test]
    fn errors_name_file_key_value_and_rule() {
        let err = RunConfig::load(&baby(), &["model.d_model=130".into()]).unwrap_err().to_string();
        assert!(err.contains("model.d_model = 130: must be a multiple of model.n_heads = 4"), "{err}");
        assert!(err.contains("shakespeare-char.toml"), "{err}");
        let err = RunConfig::load(&baby(), &["train.lr=0".into()]).unwrap_err().to_string();
        assert!(err.contains("train.lr = 0: a finite number > 0"), "{err}");
        let err = RunConfig::load(&baby(), &["train.seq_len=65".into()]).unwrap_err().to_string();
        assert!(err.contains("train.seq_len = 65: at most model.block_size = 64"), "{err}");
        let err = RunConfig::load(&baby(), &["model.colour=1".into()]).unwrap_err().to_string();
        assert!(err.contains("unknown field `colour`") && err.contains("(in `model`)"), "{err}");
        let err = RunConfig::load(&baby(), &["train.max_steps=\"many\"".into()]).unwrap_err().to_string();
        assert!(err.contains("invalid type") && err.contains("train.max_steps"), "{err}");
        let err = RunConfig::load(&baby(), &["max_steps=3".into()]).unwrap_err().to_string();
        assert!(err.contains("expected section.key=value"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn one_train_section_serves_both_tasks_and_each_refuses_the_others_keys() {
        let err = RunConfig::load(&baby(), &["train.max_tokens=4096".into()]).unwrap_err().to_string();
        let expected = "train.max_tokens = (set): a translator's key; a language model's [train] reads batch_size, \
                        seq_len, eval_iters instead";
        assert!(err.contains(expected), "{err}");
        let bible = baby().with_file_name("bible-en-es.toml");
        let err = AnyRunConfig::load(&bible, &["train.eval_iters=5".into()]).err().unwrap().to_string();
        assert!(err.contains("train.eval_iters = (set): a language model's key; a translator's [train]"), "{err}");
        let sets = ["train.schedule=\"cosine\"".into(), "train.weight_decay=0.1".into(), "train.min_lr=1e-4".into()];
        let Ok(AnyRunConfig::Translation(config)) = AnyRunConfig::load(&bible, &sets) else { panic!("not loaded") };
        assert_eq!(config.train.schedule(TaskKind::Translation), ember_train::config::ScheduleKind::Cosine);
        let adam = config.train.adamw(TaskKind::Translation);
        assert_eq!((adam.beta2, adam.eps, adam.weight_decay), (0.98, 1e-9, 0.1));
        let lm = RunConfig::load(&baby(), &[]).unwrap().train.adamw(TaskKind::LanguageModel);
        assert_eq!(lm.beta2, 0.99, "the baby GPT's own beta2");
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "[model]\nn_layers = 4\n[train\n").unwrap();
        let err = RunConfig::load(&path, &[]).unwrap_err().to_string();
        assert!(err.contains("bad.toml:3:7: "), "{err}");
    }
}
