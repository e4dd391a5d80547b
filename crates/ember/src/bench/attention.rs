//! `ember bench attention`: forward and forward+backward time of Ember's kernels, the naive materialised path and
//! Burn's built-in attention, causal, over sequence lengths and head dimensions, with achieved GFLOP/s and the
//! largest device allocation. Each measurement runs in a child process, so one path's allocations (or its running
//! out of memory) do not touch another's figures.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::tensor::{Device, Distribution, Tensor};
use clap::{Args, ValueEnum};
use ember_kernels::{AttentionImpl, AttentionSpec, device_memory};

use super::median;
use crate::devices::{self, DeviceChoice};

#[derive(Args)]
pub struct BenchAttentionArgs {
    /// Sequence lengths T.
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096,8192")]
    lengths: Vec<usize>,
    /// Head dimensions d.
    #[arg(long, value_delimiter = ',', default_value = "64,128")]
    head_dims: Vec<usize>,
    #[arg(long, default_value_t = 8)]
    heads: usize,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Measure one configuration, IMPL:T:D, and print it as one line (what the table's child processes run).
    #[arg(long, hide = true)]
    one: Option<String>,
}

const IMPLS: [(&str, AttentionImpl); 3] =
    [("ember", AttentionImpl::Auto), ("burn", AttentionImpl::Burn), ("naive", AttentionImpl::Naive)];

pub fn bench_attention(args: BenchAttentionArgs, choice: DeviceChoice) -> Result<()> {
    if let Some(one) = &args.one {
        return measure_one(&args, one, choice);
    }
    let (_, description) = devices::select(choice)?;
    println!(
        "bench attention on {description}: batch {}, {} heads, causal, f32, median of {} runs; GFLOP/s count \
         4·B·h·T²·d / 2 for the forward and 3.5× that for forward+backward",
        args.batch, args.heads, args.iters
    );
    println!("\n| T | d | path | forward ms | GFLOP/s | fwd+bwd ms | GFLOP/s | largest allocation |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    for &d in &args.head_dims {
        for &t in &args.lengths {
            let mut forward = Vec::new();
            for (name, _) in IMPLS {
                let figures = child(&args, choice, name, t, d);
                let flops = 2.0 * (args.batch * args.heads * t * t * d) as f64;
                let cell = |ms: Option<f64>, factor: f64| {
                    ms.map_or(("n/a".into(), "".into()), |ms| {
                        (format!("{ms:.2}"), format!("{:.1}", factor * flops / (ms * 1e-3) / 1e9))
                    })
                };
                let (f, b, mem) = match &figures {
                    Ok(x) => (Some(x.0), x.1, format!("{:.1} MiB", x.2 as f64 / 1048576.0)),
                    Err(e) => (None, None, format!("failed: {e}")),
                };
                let ((fms, fg), (bms, bg)) = (cell(f, 1.0), cell(b, 3.5));
                println!("| {t} | {d} | {name} | {fms} | {fg} | {bms} | {bg} | {mem} |");
                forward.push(f);
            }
            if let [Some(ember), burn, naive] = forward[..] {
                let ratio = |other: Option<f64>| other.map_or("n/a".into(), |o| format!("{:.2}×", o / ember));
                println!(
                    "| {t} | {d} | ember speed-up (forward) | vs burn {} | | vs naive {} | | |",
                    ratio(burn),
                    ratio(naive)
                );
            }
        }
    }
    Ok(())
}

/// Runs one configuration in a child process: (forward ms, forward+backward ms, largest allocation bytes).
fn child(
    args: &BenchAttentionArgs,
    choice: DeviceChoice,
    name: &str,
    t: usize,
    d: usize,
) -> Result<(f64, Option<f64>, u64)> {
    let exe = std::env::current_exe().context("locating the ember binary")?;
    let output = Command::new(exe)
        .args(["--device", choice.to_possible_value().context("a device name")?.get_name()])
        .args(["bench", "attention", "--one", &format!("{name}:{t}:{d}")])
        .args(["--heads", &args.heads.to_string(), "--batch", &args.batch.to_string()])
        .args(["--iters", &args.iters.to_string()])
        .output()
        .context("running a measurement")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("measured ")) else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let reason = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
        bail!("{}", reason.chars().take(80).collect::<String>());
    };
    let fields: Vec<&str> = line.split_whitespace().collect();
    let value = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    let forward = value(0).context("a forward time")?;
    Ok((forward, value(1), value(2).unwrap_or(0.0) as u64))
}

fn measure_one(args: &BenchAttentionArgs, one: &str, choice: DeviceChoice) -> Result<()> {
    let parts: Vec<&str> = one.split(':').collect();
    let [name, t, d] = parts[..] else { bail!("--one takes IMPL:T:D, got {one:?}") };
    let imp = IMPLS.iter().find(|(n, _)| *n == name).map(|&(_, i)| i).context("unknown path")?;
    let (t, d): (usize, usize) = (t.parse()?, d.parse()?);
    let (device, _) = devices::select(choice)?;
    let shape = [args.batch, args.heads, t, d];
    let spec = AttentionSpec::causal(d).with_implementation(imp);
    let x = |device: &Device| Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device);
    let (q, k, v) = (x(&device), x(&device), x(&device));
    let forward = time(args.iters, || {
        let o = ember_kernels::attention(q.clone(), k.clone(), v.clone(), &spec);
        o.sum().into_scalar::<f32>();
    });
    let autodiff = device.clone().autodiff();
    let (q, k, v) = (x(&autodiff).require_grad(), x(&autodiff).require_grad(), x(&autodiff).require_grad());
    let backward = time(args.iters, || {
        let grads = ember_kernels::attention(q.clone(), k.clone(), v.clone(), &spec).sum().backward();
        q.grad(&grads).expect("a gradient").sum().into_scalar::<f32>();
    });
    let largest = device_memory(&device).map_or(0, |m| m.largest_allocation);
    println!("measured {forward:.4} {backward:.4} {largest}");
    Ok(())
}

/// Median milliseconds of `iters` runs after one untimed run (compilation, autotuning).
fn time(iters: usize, mut run: impl FnMut()) -> f64 {
    run();
    let mut ms: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(&mut ms)
}
