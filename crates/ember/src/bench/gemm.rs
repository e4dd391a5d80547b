//! `ember bench gemm`: C = A B on the device, Burn's matmul (f32, and f16 where the device has it) against Ember's
//! cooperative-matrix GEMM (f16 operands, f32 accumulators; `ember_kernels::gemm`) where the adapter offers the
//! matrices, per shape: milliseconds per product, GFLOP/s of 2·M·N·K, and with `--peak-gflops` their share of the
//! device's peak. Each cooperative result is checked against Burn's f32 product first.

use anyhow::{Result, anyhow, bail};
use burn::tensor::{Distribution, FloatDType, Tensor};
use clap::Args;
use ember_kernels::gemm::cooperative_matmul;

use super::attention::{Timing, time};
use crate::devices::{self, DeviceChoice};

#[derive(Args)]
pub struct BenchGemmArgs {
    /// Shapes M×K×N (A [M, K], B [K, N]): square, and GPT-2's projections at 8 × 1024 tokens.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024x1024x1024,4096x4096x4096,8192x768x2304,8192x768x3072,8192x3072x768"
    )]
    shapes: Vec<String>,
    /// Timed repetitions (median and minimum reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Products queued back to back per repetition, before one device sync.
    #[arg(long, default_value_t = 4)]
    calls: usize,
    /// The device's dense peak for the % peak column, in GFLOP/s (for f16 rows the f16 tensor peak).
    #[arg(long)]
    peak_gflops: Option<f64>,
}

fn shape(text: &str) -> Result<[usize; 3]> {
    let parts: Vec<usize> = text.split('x').map(str::parse).collect::<Result<_, _>>().map_err(|_| bad(text))?;
    match parts[..] {
        [m, k, n] if m > 0 && k > 0 && n > 0 => Ok([m, k, n]),
        _ => Err(bad(text)),
    }
}

fn bad(text: &str) -> anyhow::Error {
    anyhow!("--shapes: {text:?} is not M×K×N, three positive integers joined by x")
}

pub fn bench_gemm(args: BenchGemmArgs, choice: DeviceChoice) -> Result<()> {
    let shapes: Vec<[usize; 3]> = args.shapes.iter().map(|s| shape(s)).collect::<Result<_>>()?;
    let (device, description) = devices::select(choice)?;
    let adapter = devices::adapter(choice).filter(|_| ember_kernels::on_wgpu(&device));
    let side = adapter.as_ref().and_then(|a| a.cooperative_sides().first().copied());
    let f16 = adapter.as_ref().is_none_or(|a| a.features.contains(ember_kernels::adapters::Features::SHADER_F16));
    println!(
        "bench gemm on {description}: per product, median (minimum) of {} repetitions of {} products queued back to back \
         and one device sync, after 2 untimed ones; GFLOP/s of the median count 2·M·N·K; cooperative: {}",
        args.iters,
        args.calls,
        side.map_or("not offered here".into(), |s| format!("{s}×{s} f16 matrices, f32 accumulators"))
    );
    let peak = args.peak_gflops.filter(|p| *p > 0.0);
    println!("\n| M×K×N | path | ms | GFLOP/s |{}", if peak.is_some() { " % peak |" } else { "" });
    println!("|---|---|---:|---:|{}", if peak.is_some() { "---:|" } else { "" });
    for [m, k, n] in shapes {
        let a = Tensor::<2>::random([m, k], Distribution::Normal(0.0, 1.0), &device);
        let b = Tensor::<2>::random([k, n], Distribution::Normal(0.0, 1.0), &device);
        let flops = 2.0 * (m * k * n) as f64;
        let row = |path: &str, t: Timing| {
            let rate = flops / t.median / 1e6;
            let share = peak.map_or(String::new(), |p| format!(" {:.1} |", 100.0 * rate / p));
            println!("| {m}×{k}×{n} | {path} | {:.3} ({:.3}) | {rate:.0} |{share}", t.median, t.min);
        };
        let sizes = (args.iters, args.calls);
        row("burn f32", time(sizes, &device, || a.clone().matmul(b.clone()))?);
        let (a16, b16) = (a.clone().cast(FloatDType::F16), b.clone().cast(FloatDType::F16));
        if f16 {
            row("burn f16", time(sizes, &device, || a16.clone().matmul(b16.clone()))?);
        }
        if let Some(side) = side {
            let reference = a16.clone().cast(FloatDType::F32).matmul(b16.clone().cast(FloatDType::F32));
            let error =
                (cooperative_matmul(a.clone(), b.clone(), side) - reference.clone()).abs().max().into_scalar::<f32>();
            let scale = reference.abs().max().into_scalar::<f32>().max(1.0);
            if error.is_nan() || error > 1e-3 * scale {
                bail!("the cooperative GEMM is off by {error} at {m}×{k}×{n} (largest |C| {scale})");
            }
            row("cooperative, f32 in", time(sizes, &device, || cooperative_matmul(a.clone(), b.clone(), side))?);
            row("cooperative, f16 in", time(sizes, &device, || cooperative_matmul(a16.clone(), b16.clone(), side))?);
        }
    }
    Ok(())
}
