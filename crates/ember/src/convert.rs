//! `ember convert --to mla`: a trained MHA / GQA model's attention factored into multi-head latent attention
//! (ember_core_model::convert), written as a run directory, with what it costs and saves: KV-cache bytes per token
//! and, given a text, the loss before and after. The converted run directory takes a run config's [data], [train]
//! and [sample] (the source run directory's, or `--config`'s), so `ember train --resume` fine-tunes it from step 0.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use ember_core_model::config::Precision;
use ember_core_model::convert::{default_rope_dim, max_latent, to_mla};
use ember_core_model::import::Source;
use ember_core_model::inspect::{kv_cache_bytes, total_params};
use ember_core_model::weights::WeightFormat;
use ember_core_model::{bundle, files};
use ember_train::corpus::{TRAIN_BIN, VAL_BIN};
use ember_train::loss::text_loss;

use crate::devices::DeviceChoice;
use crate::inference::{self, Placement};
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
    /// A run config whose [data], [train] and [sample] the converted run directory takes, for fine-tuning with
    /// `ember train --resume` (default: the source run directory's own, when it has one).
    #[arg(long)]
    config: Option<PathBuf>,
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
    let from_run = Source::of(&args.model)? == Source::Run;
    // `--config` must be a run config; a source run directory's is taken where it has [train].
    let setup = match &args.config {
        Some(path) => Some(fine_tuning_table(path)?),
        None if from_run => Some(run_table(&args.model.join(bundle::CONFIG))?).filter(|t| t.contains_key("train")),
        None => None,
    };
    let started = std::time::Instant::now();
    let cpu = Placement::new(DeviceChoice::Cpu, Precision::F32)?;
    let source = inference::load(&args.model, &cpu, WeightFormat::F32)?;
    let config = &source.config;
    let rope = args.rope_dim.unwrap_or(default_rope_dim(config));
    let mla = to_mla(&source.model, args.latent_dim, rope)?;
    let converted = mla.config().clone();
    bundle::save(&args.out, &converted, &mla, &source.tokenizer)?;
    if let Some(mut table) = setup {
        // The run config with the converted [model] becomes the run directory's, so that `ember train --resume`
        // fine-tunes the converted weights.
        table.insert("model".into(), toml::Value::try_from(&converted)?);
        bundle::write_atomic(&args.out.join(bundle::CONFIG), table.to_string().as_bytes())?;
    }
    if from_run {
        // The source's token splits, in the token ids the converted model shares.
        for split in [TRAIN_BIN, VAL_BIN] {
            let from = args.model.join(split);
            if from.exists() {
                std::fs::copy(&from, args.out.join(split)).with_context(|| from.display().to_string())?;
            }
        }
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
        let scored = crate::eval::ScoredText { model: args.model.clone(), text: path.clone(), tokens: args.tokens };
        let ids = scored.ids(&source.tokenizer)?;
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

/// The run config at `path` whose [data], [train] and [sample] a run directory takes, so that `ember train
/// --resume` fine-tunes the weights it holds; without [data] or [train] it is an error.
pub fn fine_tuning_table(path: &Path) -> Result<toml::Table> {
    let table = run_table(path)?;
    if let Some(missing) = ["data", "train"].into_iter().find(|section| !table.contains_key(*section)) {
        bail!(
            "{}: no [{missing}] table: --config takes a run config, whose [data] and [train] the run is fine-tuned \
             with",
            path.display()
        );
    }
    Ok(table)
}

/// The TOML table of the run config at `path`.
fn run_table(path: &Path) -> Result<toml::Table> {
    let text = files::read_to_string(path).with_context(|| path.display().to_string())?;
    let table: toml::Table = toml::from_str(&text).with_context(|| path.display().to_string())?;
    Ok(table)
}
