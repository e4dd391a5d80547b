//! `ember bench context`: what a long context costs softmax attention (Ember's flash kernels: O(T²) work per
//! sequence, a K/V store that grows with T) against linear attention (O(T) by chunks, a fixed recurrent state when
//! decoding): seconds per training step and per decoded token against T, both models built from one config with
//! random weights (speed does not depend on their values) and timed in turns.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::tensor::{Int, Tensor, TensorData};
use clap::Args;
use ember_core_model::config::{AttentionKernel, PositionKind};
use ember_core_model::{Build, CausalLm, ModelConfig, Rng};
use ember_serve::KvKind;
use ember_train::loss::lm_loss;
use ember_train::plot::{Axes, Series, line_svg};

use super::decode::greedy_timed;
use super::median;
use crate::devices::{self, DeviceChoice};
use crate::inspect::model_config;

#[derive(Args)]
pub struct BenchContextArgs {
    /// A config whose [model] is built twice: as written with softmax attention, and with attention_kernel =
    /// "linear"; its context is raised to the longest T.
    #[arg(long)]
    config: PathBuf,
    /// Context lengths T (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096,16384")]
    lengths: Vec<usize>,
    /// Tokens decoded after a T-token prompt, timed per token.
    #[arg(long, default_value_t = 16)]
    decode_tokens: usize,
    /// Rounds per point; the median is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Writes the figure (seconds against T, log–log) to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// One model's figures at one T: seconds per training step (forward, loss and backward of one sequence) and per
/// decoded token.
#[derive(Clone, Copy)]
struct Point {
    step: f64,
    token: f64,
}

pub fn bench_context(args: BenchContextArgs, device: DeviceChoice) -> Result<()> {
    if args.lengths.iter().any(|&t| t < 2) || args.rounds == 0 || args.decode_tokens < 2 {
        bail!("--lengths must be at least 2, --rounds at least 1, --decode-tokens at least 2");
    }
    let on_host = devices::on_host(device);
    let (device, description) = devices::select(device)?;
    let longest = args.lengths.iter().copied().max().unwrap_or(0).saturating_add(args.decode_tokens);
    let mut softmax = model_config(&args.config)?;
    softmax.vocab_size.get_or_insert(256);
    softmax.block_size = softmax.block_size.max(longest);
    softmax.attention_kernel = AttentionKernel::Softmax;
    let linear = ModelConfig { attention_kernel: AttentionKernel::Linear, ..softmax.clone() };
    linear.validate().with_context(|| format!("{} with linear attention", args.config.display()))?;
    if on_host {
        crate::admission::admit_training(&softmax, 1, longest)?;
    }
    let positions = if softmax.positions == PositionKind::Learned { "learned positions" } else { "RoPE" };
    println!(
        "bench context: {} ({} layers, d {}, {} heads, {positions}) on {description}: one sequence of T tokens; \
         training step = forward, loss and backward; decoding = {} tokens after a T-token prompt, its own store \
         (softmax: contiguous K/V, linear: recurrent state)",
        args.config.display(),
        softmax.n_layers,
        softmax.d_model,
        softmax.n_heads,
        args.decode_tokens
    );
    println!(
        "\n| T | softmax step | linear step | linear / softmax | softmax per token | linear per token | linear / softmax |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for &t in &args.lengths {
        let [s, l] = [&softmax, &linear].map(|config| measure(config, t, &args, &device));
        println!(
            "| {t} | {} | {} | {:.2} | {} | {} | {:.2} |",
            seconds(s.step),
            seconds(l.step),
            l.step / s.step,
            seconds(s.token),
            seconds(l.token),
            l.token / s.token
        );
        rows.push((t as f64, s, l));
    }
    if let Some(path) = &args.svg {
        let pick = |f: fn(&Point) -> f64, which: usize| -> Vec<(f64, f64)> {
            rows.iter().map(|(t, s, l)| (*t, f(if which == 0 { s } else { l }))).collect()
        };
        let (s_step, l_step) = (pick(|p| p.step, 0), pick(|p| p.step, 1));
        let (s_token, l_token) = (pick(|p| p.token, 0), pick(|p| p.token, 1));
        let series = [
            Series { name: "softmax, training step", color: "#1f77b4", points: &s_step },
            Series { name: "linear, training step", color: "#d62728", points: &l_step },
            Series { name: "softmax, decoded token", color: "#7fb3d5", points: &s_token },
            Series { name: "linear, decoded token", color: "#f1948a", points: &l_token },
        ];
        let axes = Axes { title: "Seconds against context length", x: "T (tokens)", y: "seconds", log: true };
        std::fs::write(path, line_svg(&axes, &series)).with_context(|| path.display().to_string())?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

/// The medians over `args.rounds` of one training step on T tokens and of each decoded token after T.
fn measure(config: &ModelConfig, t: usize, args: &BenchContextArgs, device: &burn::tensor::Device) -> Point {
    let mut rng = Rng::new(1);
    let vocab = config.vocab();
    let ids: Vec<u32> = (0..t + 1).map(|_| rng.below(vocab) as u32).collect();
    let trainable = CausalLm::new(config, &mut Rng::new(0), &device.clone().autodiff());
    let tensor = |from: usize| {
        let row: Vec<i64> = ids[from..from + t].iter().map(|&i| i as i64).collect();
        Tensor::<2, Int>::from_data(TensorData::new(row, [1, t]), &device.clone().autodiff())
    };
    let step = || {
        let started = Instant::now();
        let loss = lm_loss(trainable.forward(tensor(0)), tensor(1), None);
        let _grads = loss.backward();
        started.elapsed().as_secs_f64()
    };
    step();
    let mut steps: Vec<f64> = (0..args.rounds).map(|_| step()).collect();
    let model = CausalLm::new(config, &mut Rng::new(0), device);
    let kv = KvKind::for_model(config);
    let mut tokens: Vec<f64> =
        (0..args.rounds).map(|_| 1.0 / greedy_timed(&model, kv, &ids[..t], args.decode_tokens + 1, device).1).collect();
    Point { step: median(&mut steps), token: median(&mut tokens) }
}

/// Seconds as ms below one second.
fn seconds(s: f64) -> String {
    if s < 1.0 { format!("{:.2} ms", s * 1e3) } else { format!("{s:.2} s") }
}
