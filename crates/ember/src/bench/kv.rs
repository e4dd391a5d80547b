//! `ember bench kv`: what each KV store costs and changes: its bytes, and the model's loss on a text teacher-forced
//! through it (chunks of tokens appended to the store, each attending to everything stored before, dequantized).

use ember_core_model::weights::WeightFormat;
use std::path::PathBuf;

use anyhow::{Result, bail};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use clap::Args;
use ember_core_model::cache::KvCache;
use ember_core_model::config::Precision;
use ember_serve::kv::ContiguousCache;
use ember_serve::{KvKind, KvSpec};

use crate::devices::DeviceChoice;
use crate::eval::{TextEnd, text_ids};
use crate::inference::{self, Placement};

#[derive(Args)]
pub struct BenchKvArgs {
    /// A run directory, Hugging Face directory or GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// How projections and the token embedding are held on the CPU and wgpu: native (a GGUF file's blocks, used as they are;
    /// a run directory as stored), f32, or converted to f16, bf16, q8_0, q4_0, q4_1, q5_0 or q5_1.
    #[arg(long, default_value = "native")]
    weights: WeightFormat,
    /// A UTF-8 text to score; its first (or with --tail last) --tokens tokens, up to the context, are used.
    #[arg(long)]
    text: PathBuf,
    /// Tokens per window (at most the context); each window starts with an empty store.
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// Consecutive windows scored.
    #[arg(long, default_value_t = 1)]
    windows: usize,
    /// Tokens appended to the store per step.
    #[arg(long, default_value_t = 16)]
    chunk: usize,
    /// Score the last tokens of the text instead of the first (the validation split of `ember train`).
    #[arg(long)]
    tail: bool,
    /// Values per scale of the quantized stores.
    #[arg(long, default_value_t = 32)]
    kv_group: usize,
}

pub fn bench_kv(args: BenchKvArgs, device: DeviceChoice) -> Result<()> {
    if args.tokens < 2 || args.windows == 0 || args.chunk == 0 || args.kv_group == 0 {
        bail!("--tokens must be at least 2, and --windows, --chunk and --kv-group at least 1");
    }
    let placement = Placement::new(device, Precision::F32)?;
    let run = inference::load(&args.model, &placement, args.weights)?;
    let (device, description) = (placement.device, placement.description);
    let w = args.tokens.min(run.model.block_size());
    let n = w.saturating_mul(args.windows);
    let end = if args.tail { TextEnd::Last } else { TextEnd::First };
    let ids = text_ids(&args.text, &run.tokenizer, n, end)?;
    if w < 2 || ids.len() < 2 {
        bail!("{}: fewer than 2 tokens to score", args.text.display());
    }
    let chunk = args.chunk;
    println!(
        "bench kv: {} on {description}: {} tokens of {} in windows of {w}, teacher-forced through each store {chunk} at a time",
        args.model.display(),
        ids.len(),
        args.text.display()
    );
    println!("| store | bytes per window | mean loss (nats/token) | perplexity | change vs f32 |");
    println!("|---|---|---|---|---|");
    let mut reference = None;
    for kind in [KvKind::Contiguous, KvKind::Int8, KvKind::Int4] {
        let (mut nll, mut count, mut bytes) = (0.0f64, 0usize, 0usize);
        for window in ids.chunks(w).filter(|c| c.len() >= 2) {
            // f32 grown one token at a time, so its bytes are exactly what the tokens need.
            let mut cache: Box<dyn KvCache> = match kind {
                KvKind::Contiguous => Box::new(ContiguousCache::new(1)),
                kind => KvSpec { kind, page_size: 16, group: args.kv_group }.build().expect("a store"),
            };
            for start in (0..window.len() - 1).step_by(chunk) {
                let end = (start + chunk).min(window.len() - 1);
                let input: Vec<i64> = window[start..end].iter().map(|&i| i as i64).collect();
                let x = Tensor::<2, Int>::from_data(TensorData::new(input, [1, end - start]), &device);
                let logp = log_softmax(run.model.forward_step_all(x, cache.as_mut()), 2);
                let logp = logp.into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 logits");
                let v = logp.len() / (end - start);
                for (i, target) in window[start + 1..end + 1].iter().enumerate() {
                    nll -= logp[i * v + *target as usize] as f64;
                    count += 1;
                }
            }
            bytes = bytes.max(cache.bytes());
        }
        let loss = nll / count as f64;
        let base = *reference.get_or_insert(loss);
        let name = match kind {
            KvKind::Contiguous => "f32 (contiguous)".to_string(),
            other => format!("{other:?} (group {})", args.kv_group).to_lowercase(),
        };
        println!(
            "| {name} | {} | {loss:.4} | {:.3} | {:+.2}% perplexity |",
            bytes,
            loss.exp(),
            ((loss - base).exp() - 1.0) * 100.0
        );
    }
    Ok(())
}
