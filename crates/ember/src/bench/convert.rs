//! `ember bench convert`: a trained model converted to MLA at several latent widths d_L (ember_core_model::convert),
//! each against the original: KV bytes per token and the loss of a text, in a table and an SVG of loss against bytes.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ember_core_model::ModelConfig;
use ember_core_model::config::Precision;
use ember_core_model::convert::{default_rope_dim, max_latent, to_mla};
use ember_core_model::inspect::kv_cache_bytes;
use ember_core_model::weights::WeightFormat;
use ember_train::loss::text_loss;
use ember_train::plot::{Axes, Series, line_svg};

use crate::devices::DeviceChoice;
use crate::eval::ScoredText;
use crate::inference::{self, Placement};
use crate::inspect::thousands;

#[derive(Args)]
pub struct BenchConvertArgs {
    /// The MHA / GQA model and the text it is scored on.
    #[command(flatten)]
    scored: ScoredText,
    /// Latent widths d_L, one row each (0: the full rank).
    #[arg(long, value_delimiter = ',', default_value = "0,64,32,16")]
    latent_dims: Vec<usize>,
    /// Width of the decoupled RoPE key (default d_h/2 for RoPE models, 2 otherwise).
    #[arg(long)]
    rope_dim: Option<usize>,
    /// Writes loss against KV bytes per token to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

pub fn bench_convert(args: BenchConvertArgs, device: DeviceChoice) -> Result<()> {
    let placement = Placement::new(device, Precision::F32)?;
    let run = inference::load(&args.scored.model, &placement, WeightFormat::F32)?;
    let description = placement.description;
    let config = &run.config;
    let rope = args.rope_dim.unwrap_or(default_rope_dim(config));
    let ids = args.scored.ids(&run.tokenizer)?;
    let bytes = |c: &ModelConfig| kv_cache_bytes(c, 1, 1, 4).unwrap_or(u128::MAX) as f64;
    let original = text_loss(&run.model, &ids);
    println!(
        "bench convert: {} on {description}, MLA with d_R {rope} (full rank {}); loss on the last {} tokens of {}, KV \
         bytes per token in f32\n",
        args.scored.model.display(),
        max_latent(config, rope),
        ids.len(),
        args.scored.text.display()
    );
    println!("| model | KV bytes/token | loss (nats/token) | Δ vs original |");
    println!("|---|---:|---:|---:|");
    println!("| original | {} | {original:.4} | |", thousands(bytes(config)));
    let mut points = Vec::new();
    for &latent in &args.latent_dims {
        let latent = if latent == 0 { max_latent(config, rope) } else { latent };
        let mla = to_mla(&run.model, latent, rope)?;
        let loss = text_loss(&mla, &ids);
        let kv = bytes(mla.config());
        println!("| MLA d_L = {latent} | {} | {loss:.4} | {:+.4} |", thousands(kv), loss - original);
        points.push((kv, loss));
    }
    if let Some(path) = &args.svg {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let reference = [(points.first().map_or(0.0, |p| p.0), original), (bytes(config), original)];
        let series = [
            Series { name: "MLA, converted", color: "#1f77b4", points: &points },
            Series { name: "original (its bytes at the right)", color: "#d62728", points: &reference },
        ];
        let axes =
            Axes { title: "Loss against KV bytes per token", x: "KV bytes per token (f32)", y: "loss", log: false };
        std::fs::write(path, line_svg(&axes, &series)).with_context(|| path.display().to_string())?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}
