//! `ember bench kernel`: a trained softmax model run with FAVOR+ in place of softmax, r random features per head,
//! without retraining: the loss of a text against the exact model's, several draws of the features per r. The
//! estimate of each attention weight has a standard deviation O(1/√r), so the change in loss should shrink about as
//! 1/√r; the table prints |Δ|·√r beside it, which stays flat where the theory holds.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use clap::Args;
use ember_core_model::{Gpt, import, tokenizer};
use ember_kernels::Similarity;

use crate::devices::{self, DeviceChoice};

#[derive(Args)]
pub struct BenchKernelArgs {
    /// A run directory, Hugging Face directory or GGUF file of a softmax model.
    #[arg(long)]
    model: PathBuf,
    /// A UTF-8 text whose last --tokens tokens (up to the context per window) are scored.
    #[arg(long)]
    text: PathBuf,
    #[arg(long, default_value_t = 2048)]
    tokens: usize,
    /// Random features per head, one row of the table each.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024")]
    features: Vec<usize>,
    /// Draws of the features per r.
    #[arg(long, default_value_t = 3)]
    draws: u64,
}

/// Mean cross-entropy (nats/token) of `model` on `ids`, in windows of its context, each predicting its own tokens.
fn loss(model: &Gpt, ids: &[u32], device: &burn::tensor::Device) -> f64 {
    let (mut nll, mut count) = (0.0f64, 0usize);
    for window in ids.chunks(model.block_size() + 1).filter(|w| w.len() >= 2) {
        let t = window.len() - 1;
        let input: Vec<i64> = window[..t].iter().map(|&i| i as i64).collect();
        let x = Tensor::<2, Int>::from_data(TensorData::new(input, [1, t]), device);
        let logp = log_softmax(model.forward(x), 2).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32");
        let v = logp.len() / t;
        for (i, &target) in window[1..].iter().enumerate() {
            nll -= logp[i * v + target as usize] as f64;
            count += 1;
        }
    }
    nll / count as f64
}

pub fn bench_kernel(args: BenchKernelArgs, device: DeviceChoice) -> Result<()> {
    if args.features.contains(&0) || args.draws == 0 {
        bail!("--features and --draws must be at least 1");
    }
    let (device, description) = devices::select(device)?;
    let run = import::load(&args.model, &device)?;
    let text = ember_core_model::files::read_to_string(&args.text).with_context(|| args.text.display().to_string())?;
    let mut ids = tokenizer::encode(&run.tokenizer, &text)?;
    ids.drain(..ids.len().saturating_sub(args.tokens));
    if ids.len() < 2 {
        bail!("{}: fewer than 2 tokens to score", args.text.display());
    }
    let exact = loss(&run.model, &ids, &device);
    println!(
        "bench kernel: {} on {description}: the last {} tokens of {}, softmax replaced by FAVOR+ without retraining",
        args.model.display(),
        ids.len(),
        args.text.display()
    );
    println!("exact softmax: {exact:.4} nats/token\n");
    println!("| features r | loss, mean of {} draws (min … max) | Δ vs softmax | |Δ|·√r |", args.draws);
    println!("|---:|---:|---:|---:|");
    for &r in &args.features {
        let losses: Vec<f64> = (0..args.draws)
            .map(|draw| {
                let favor = run
                    .model
                    .clone()
                    .with_similarity(|layer| Similarity::Favor { features: r, seed: draw * 1_000_003 + layer as u64 });
                favor.map(|model| loss(&model, &ids, &device))
            })
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("{}: MLA layers have softmax attention only", args.model.display()))?;
        let mean = losses.iter().sum::<f64>() / losses.len() as f64;
        let (lo, hi) = losses.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &l| (lo.min(l), hi.max(l)));
        let delta = mean - exact;
        println!("| {r} | {mean:.4} ({lo:.4} … {hi:.4}) | {delta:+.4} | {:.3} |", delta.abs() * (r as f64).sqrt());
    }
    Ok(())
}
