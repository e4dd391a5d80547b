//! A translation run's config: `[model]`, `[seq2seq]`, `[data]` and `[train]`, and their checks.

use std::path::PathBuf;

use ember_core_model::ModelConfig;
use ember_core_model::config::{Invalid, require};
use ember_core_model::seq2seq::Seq2SeqConfig;
use serde::{Deserialize, Serialize};

use crate::config::{TaskKind, TrainConfig};
use crate::parallel::Vocabularies;

/// `[seq2seq]`: the stacks and whether source, target and output share one embedding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seq2SeqSection {
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    #[serde(default = "crate::config::yes")]
    pub share_embeddings: bool,
}

/// `[data]`: parallel TSV files (`source<TAB>target`) or pairs of line-aligned files, the BPE vocabularies and the
/// longest pair kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelDataConfig {
    pub train: PathBuf,
    /// With it, `train` holds the source sentences and this file the targets, line by line.
    pub train_target: Option<PathBuf>,
    pub valid: PathBuf,
    pub valid_target: Option<PathBuf>,
    pub test: Option<PathBuf>,
    /// Tokens of the joint vocabulary, or of each side's.
    pub vocab_size: usize,
    /// One BPE over both sides (fairseq's joined dictionary); false: one BPE of `vocab_size` per side.
    #[serde(default = "crate::config::yes")]
    pub joint_vocab: bool,
    /// Pairs with more tokens than this on either side (</s> included) are left out of training.
    pub max_len: usize,
}

/// A translation run config: `[model]` (layer shapes, as for decoder-only models), `[seq2seq]`, `[data]`, `[train]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranslationConfig {
    pub model: ModelConfig,
    pub seq2seq: Seq2SeqSection,
    pub data: ParallelDataConfig,
    pub train: TrainConfig,
}

impl TranslationConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        self.model.validate()?;
        let (s, d, t) = (&self.seq2seq, &self.data, &self.train);
        require(s.encoder_layers >= 1, "seq2seq.encoder_layers", s.encoder_layers, "at least 1")?;
        require(s.decoder_layers >= 1, "seq2seq.decoder_layers", s.decoder_layers, "at least 1")?;
        require(d.vocab_size >= 300, "data.vocab_size", d.vocab_size, "at least 300 (256 bytes, specials, merges)")?;
        let most = crate::config::MAX_BPE_VOCAB;
        require(d.vocab_size <= most, "data.vocab_size", d.vocab_size, format!("at most {most}"))?;
        require(d.max_len >= 2, "data.max_len", d.max_len, "at least 2")?;
        require(
            d.joint_vocab || !s.share_embeddings,
            "seq2seq.share_embeddings",
            s.share_embeddings,
            "false when data.joint_vocab = false (separate vocabularies have separate embeddings)",
        )?;
        require(
            d.max_len <= self.model.block_size,
            "data.max_len",
            d.max_len,
            format!("at most model.block_size = {}", self.model.block_size),
        )?;
        t.validate(TaskKind::Translation, &self.model)?;
        require(t.max_tokens() >= d.max_len, "train.max_tokens", t.max_tokens(), "at least data.max_len")
    }

    /// The model's full configuration once the vocabularies are known.
    pub fn seq2seq_config(&self, vocab: &Vocabularies) -> Seq2SeqConfig {
        let (src_vocab, tgt_vocab) = vocab.sizes();
        Seq2SeqConfig {
            model: ModelConfig { vocab_size: Some(tgt_vocab), ..self.model.clone() },
            encoder_layers: self.seq2seq.encoder_layers,
            decoder_layers: self.seq2seq.decoder_layers,
            src_vocab,
            tgt_vocab,
            share_embeddings: self.seq2seq.share_embeddings,
            logits_bias: false,
        }
    }
}
