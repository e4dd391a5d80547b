//! `ember export`: a model for other tools, as a GGUF file (llama.cpp, Ollama, LM Studio) or a Hugging Face directory
//! (transformers, vLLM).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use ember_core_model::export::{gguf, hf};
use ember_core_model::weights::WeightFormat;

use crate::admission;

#[derive(Clone, Copy, ValueEnum)]
pub enum Target {
    /// One GGUF file.
    Gguf,
    /// A Hugging Face directory: config.json, model.safetensors, tokenizer.json, tokenizer_config.json.
    Hf,
}

#[derive(Args)]
pub struct ExportArgs {
    /// An Ember run directory, a Hugging Face directory or a GGUF file.
    source: PathBuf,
    /// The GGUF file or the directory to write.
    out: PathBuf,
    /// What to write.
    #[arg(long)]
    to: Target,
    /// GGUF only: the matrices' format — native (as stored: a GGUF's blocks, a run's f32), f32, or a ggml format
    /// Ember writes (f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1). Hugging Face directories are always f32.
    #[arg(long = "type", default_value = "native")]
    format: WeightFormat,
}

pub fn export(args: ExportArgs) -> Result<()> {
    admission::admit_model_files(&args.source)?;
    let started = std::time::Instant::now();
    let what = match args.to {
        Target::Gguf => {
            if args.out.is_dir() {
                bail!("{}: is a directory; give the GGUF file to write", args.out.display());
            }
            let written = gguf::export(&args.source, &args.out, args.format)?;
            format!(
                "a {} GGUF file of {} tensors ({:.1} MB)",
                written.arch,
                written.tensors,
                written.bytes as f64 / 1e6
            )
        }
        Target::Hf => {
            if args.format != WeightFormat::Native && args.format != WeightFormat::F32 {
                bail!("--type {}: Hugging Face directories are written in f32", args.format);
            }
            if args.out.join("config.json").exists() {
                bail!("{}: already holds a Hugging Face model; choose another directory", args.out.display());
            }
            format!("a Hugging Face {} directory", hf::export(&args.source, &args.out)?)
        }
    };
    println!(
        "exported {} to {} as {what} in {:.1} s",
        args.source.display(),
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
