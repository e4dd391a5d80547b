//! `ember convert --to mla`: a trained MHA / GQA model's attention factored into multi-head latent attention
//! (ember_core_model::convert), written as a run directory, with what it costs and saves: KV-cache bytes per token
//! and, given a text, the loss before and after. A run directory trained by Ember keeps its run config and token
//! splits, so `ember train --resume` fine-tunes the converted model from step 0.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use ember_core_model::config::PositionKind;
use ember_core_model::convert::{max_latent, to_mla};
use ember_core_model::import::{self, Source};
use ember_core_model::inspect::{kv_cache_bytes, total_params};
use ember_core_model::{bundle, files, tokenizer};
use ember_train::corpus::{TRAIN_BIN, VAL_BIN};
use ember_train::loss::text_loss;

use crate::inspect::thousands;

#[derive(Clone, Copy, ValueEnum)]
pub enum Target {
    /// Multi-head latent attention.
    Mla,
}

#[derive(Args)]
pub struct ConvertArgs {
    /// What the attention becomes.
    #[arg(long)]
    to: Target,
    /// Width d_L of the shared latent that replaces every layer's keys and values (at most the rank the conversion
    /// prints when asked for more).
    #[arg(long)]
    latent_dim: usize,
    /// Width d_R of the decoupled RoPE key (RoPE models keep every (d_h/d_R)-th frequency pair of each head);
    /// default d_h/2 for RoPE models, 2 (unused) otherwise.
    #[arg(long)]
    rope_dim: Option<usize>,
    /// A UTF-8 text whose last --tokens tokens are scored by the model before and after.
    #[arg(long)]
    text: Option<PathBuf>,
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// A run directory, Hugging Face directory or GGUF file.
    model: PathBuf,
    /// The run directory to write.
    #[arg(long)]
    out: PathBuf,
}

pub fn convert(args: ConvertArgs) -> Result<()> {
    let Target::Mla = args.to;
    if args.out.join(bundle::CONFIG).exists() || args.out.join(bundle::MODEL).exists() {
        bail!("{}: already holds a model; choose another --out", args.out.display());
    }
    let started = std::time::Instant::now();
    let source = import::load(&args.model, &burn::tensor::Device::flex())?;
    let config = &source.config;
    let rope = args.rope_dim.unwrap_or(if config.positions == PositionKind::Rope { config.head_dim() / 2 } else { 2 });
    let mla = to_mla(&source.model, args.latent_dim, rope)?;
    let converted = mla.config().clone();
    bundle::save(&args.out, &converted, &mla, &source.tokenizer)?;
    if Source::of(&args.model)? == Source::Run {
        keep_training_setup(&args.model, &args.out, &converted)?;
    }
    let per_token = |c| kv_cache_bytes(c, 1, 1, 4).map_or("?".into(), thousands);
    println!(
        "converted {} to MLA (d_L {}, d_R {rope}; full rank {}) in {:.1} s: {} → {} parameters, KV cache {} → {} bytes \
         per token (f32); wrote {}",
        args.model.display(),
        args.latent_dim,
        max_latent(config, rope),
        started.elapsed().as_secs_f64(),
        thousands(total_params(config)),
        thousands(total_params(&converted)),
        per_token(config),
        per_token(&converted),
        args.out.display()
    );
    if let Some(path) = &args.text {
        let text = files::read_to_string(path).with_context(|| path.display().to_string())?;
        let mut ids = tokenizer::encode(&source.tokenizer, &text)?;
        ids.drain(..ids.len().saturating_sub(args.tokens));
        if ids.len() < 2 {
            bail!("{}: fewer than 2 tokens to score", path.display());
        }
        let (before, after) = (text_loss(&source.model, &ids), text_loss(&mla, &ids));
        println!(
            "loss on the last {} tokens of {}: {before:.4} → {after:.4} nats/token (perplexity {:.2} → {:.2})",
            ids.len(),
            path.display(),
            before.exp(),
            after.exp()
        );
    }
    Ok(())
}

/// A run directory Ember trained keeps its run config (with the converted [model]) and its token splits, so that
/// `ember train --resume` fine-tunes the converted weights.
fn keep_training_setup(
    from: &std::path::Path,
    to: &std::path::Path,
    model: &ember_core_model::ModelConfig,
) -> Result<()> {
    let path = from.join(bundle::CONFIG);
    let mut table: toml::Table =
        toml::from_str(&files::read_to_string(&path)?).with_context(|| path.display().to_string())?;
    if !table.contains_key("train") {
        return Ok(());
    }
    table.insert("model".into(), toml::Value::try_from(model)?);
    bundle::write_atomic(&to.join(bundle::CONFIG), table.to_string().as_bytes())?;
    for split in [TRAIN_BIN, VAL_BIN] {
        if from.join(split).exists() {
            std::fs::copy(from.join(split), to.join(split)).with_context(|| from.join(split).display().to_string())?;
        }
    }
    Ok(())
}
