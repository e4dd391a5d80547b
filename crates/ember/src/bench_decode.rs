//! `ember bench decode`: generation tokens/s with the KV cache against recomputing the context every step, at
//! several lengths, side by side in one run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use ember_core_model::config::PositionKind;
use ember_core_model::{Gpt, Rng, import};
use ember_serve::{Decoder, KvKind};

use crate::bench::median;
use crate::devices::{self, DeviceChoice};
use crate::inspect::model_config;

#[derive(Args)]
pub struct BenchDecodeArgs {
    /// A config whose [model] is built with random weights (speed does not depend on the values); its context is
    /// raised to fit the longest run.
    #[arg(long, conflicts_with = "model")]
    config: Option<PathBuf>,
    /// A run directory, Hugging Face directory or GGUF file.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Generated tokens per measurement (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "128,512,1024")]
    lengths: Vec<usize>,
    /// Prompt tokens before generation.
    #[arg(long, default_value_t = 16)]
    prompt_tokens: usize,
    /// Rounds; cached and uncached alternate and the median is reported.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
}

pub fn bench_decode(args: BenchDecodeArgs, device: DeviceChoice) -> Result<()> {
    let (device, description) = devices::select(device)?;
    let longest = args.prompt_tokens + args.lengths.iter().copied().max().unwrap_or(0);
    let (model, source) = match (&args.config, &args.model) {
        (Some(path), _) => {
            let mut config = model_config(path)?;
            config.vocab_size.get_or_insert(256);
            if config.positions == PositionKind::Learned || config.block_size < longest {
                config.block_size = config.block_size.max(longest);
            }
            (Gpt::new(&config, &mut Rng::new(0), &device), format!("{} (random weights)", path.display()))
        }
        (None, Some(path)) => (import::load(path, &device)?.model, path.display().to_string()),
        (None, None) => bail!("give --config FILE or --model PATH"),
    };
    if model.block_size() < longest {
        bail!("the model's context is {} tokens; the longest run needs {longest}", model.block_size());
    }
    println!("bench decode: {source} on {description}, {}-token prompt, greedy", args.prompt_tokens);
    println!("| generated tokens | cached tokens/s | uncached tokens/s | cached / uncached |");
    println!("|---|---|---|---|");
    let vocab = model.config().vocab();
    let mut rng = Rng::new(1);
    let prompt: Vec<u32> = (0..args.prompt_tokens.max(1)).map(|_| rng.below(vocab) as u32).collect();
    for &n in &args.lengths {
        let (mut cached, mut uncached) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds.max(1) {
            cached.push(tokens_per_s(&model, KvKind::Contiguous, &prompt, n, &device));
            uncached.push(tokens_per_s(&model, KvKind::None, &prompt, n, &device));
        }
        let (c, u) = (median(&mut cached), median(&mut uncached));
        println!("| {n} | {c:.1} | {u:.1} | {:.1}x |", c / u);
    }
    Ok(())
}

/// Decode tokens/s of `n` greedy steps after the prompt (the prompt's own pass is not counted).
fn tokens_per_s(model: &Gpt, kv: KvKind, prompt: &[u32], n: usize, device: &burn::tensor::Device) -> f64 {
    let mut decoder = Decoder::new(model, kv, device);
    let mut ids = prompt.to_vec();
    let mut seen = 0;
    let mut started = Instant::now();
    for step in 0..=n {
        if step == 1 {
            started = Instant::now();
        }
        let logits = decoder.next_logits(&ids, seen);
        seen = ids.len();
        ids.push(logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32));
    }
    n as f64 / started.elapsed().as_secs_f64()
}
