//! `ember generate`: a model from a run directory, a Hugging Face directory or a GGUF file, and the prompt's
//! continuation streamed to stdout.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use burn::tensor::Device;
use clap::Args;
use ember_core_model::CausalLm;
use ember_serve::{GenerationRequest, GenerationStats, KvSpec, Sampling};
use tokenizers::Tokenizer;

use crate::devices::DeviceChoice;
use crate::inference::{HoldFlags, KvFlags, Placement, load_for_inference};

#[derive(Args)]
pub struct GenerateArgs {
    /// A run directory (`ember train` / `ember import`), a Hugging Face directory, or a .gguf file.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    hold: HoldFlags,
    #[arg(long)]
    prompt: Option<String>,
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// 0 is greedy.
    #[arg(long)]
    temperature: Option<f64>,
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus sampling: the smallest set of likeliest tokens whose probability reaches P.
    #[arg(long)]
    top_p: Option<f64>,
    /// Penalty on tokens already in the context (1 is off; 1.1–1.3 is typical).
    #[arg(long)]
    repetition_penalty: Option<f64>,
    /// Lower each generated token's logit by this times its count so far (-2 to 2; 0 is off).
    #[arg(long, allow_hyphen_values = true)]
    frequency_penalty: Option<f64>,
    /// Lower the logit of every token generated so far by this (-2 to 2; 0 is off).
    #[arg(long, allow_hyphen_values = true)]
    presence_penalty: Option<f64>,
    /// Stop before this string (repeatable); it is not printed.
    #[arg(long)]
    stop: Vec<String>,
    #[arg(long)]
    seed: Option<u64>,
    #[command(flatten)]
    kv: KvFlags,
    /// Speculative decoding by prompt lookup: check up to N drafted tokens (what followed the last tokens' latest
    /// earlier occurrence in the context) in one forward pass; greedy text and sampling's distribution are unchanged
    /// (0 is off).
    #[arg(long, default_value_t = 0)]
    prompt_lookup: usize,
    /// Print load time and prompt / generation speed to stderr.
    #[arg(long)]
    stats: bool,
}

pub fn generate(args: GenerateArgs, choice: DeviceChoice) -> Result<()> {
    let placement = Placement::new(choice, args.hold.dtype)?;
    let started = std::time::Instant::now();
    let run = load_for_inference(&args.model, args.hold, &placement, 1)?;
    let load_seconds = started.elapsed().as_secs_f64();
    let (defaults, drawn) = (GenerationRequest::default(), Sampling::default());
    let sampling = Sampling {
        temperature: args.temperature.unwrap_or(drawn.temperature),
        top_k: args.top_k.or(drawn.top_k),
        top_p: args.top_p.or(drawn.top_p),
        repetition_penalty: args.repetition_penalty.unwrap_or(drawn.repetition_penalty),
        frequency_penalty: args.frequency_penalty.unwrap_or(drawn.frequency_penalty),
        presence_penalty: args.presence_penalty.unwrap_or(drawn.presence_penalty),
    };
    let request = GenerationRequest {
        prompt: args.prompt.unwrap_or(defaults.prompt),
        max_new_tokens: args.max_new_tokens.unwrap_or(defaults.max_new_tokens),
        stop: args.stop,
        seed: args.seed.unwrap_or(defaults.seed),
        sampling,
    };
    request.validate()?;
    let kv = args.kv.spec(run.model.config())?;
    let g = print_sample(&run.model, &run.tokenizer, &request, kv, &placement.device, args.prompt_lookup)?;
    if args.stats && g.drafted > 0 {
        eprintln!(
            "prompt lookup: {} of {} drafted tokens accepted ({:.1} %)",
            g.accepted,
            g.drafted,
            100.0 * g.accepted as f64 / g.drafted as f64
        );
    }
    if args.stats {
        eprintln!(
            "loaded in {load_seconds:.2} s; prompt {} tokens in {:.3} s ({:.1} tokens/s, until the first new token); \
             {} more tokens in {:.2} s ({:.1} tokens/s); KV store {:.2} MiB",
            g.prompt_tokens,
            g.prompt_seconds,
            g.prompt_tokens as f64 / g.prompt_seconds,
            g.new_tokens.saturating_sub(1),
            g.decode_seconds,
            g.new_tokens.saturating_sub(1) as f64 / g.decode_seconds,
            g.kv_bytes as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}

/// Streams the prompt and its continuation to stdout.
pub fn print_sample(
    model: &CausalLm,
    tok: &Tokenizer,
    request: &GenerationRequest,
    kv: KvSpec,
    device: &Device,
    lookup: usize,
) -> Result<GenerationStats> {
    let mut out = std::io::stdout();
    write!(out, "{}", request.prompt)?;
    out.flush()?;
    let generation = ember_serve::generate(model, tok, request, kv, device, lookup, |piece| {
        let _ = write!(out, "{piece}");
        let _ = out.flush();
    })?;
    writeln!(out)?;
    Ok(generation)
}
