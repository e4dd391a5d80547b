//! `ember bench attention`: forward and forward+backward time of Ember's kernels, the naive materialised path and
//! Burn's built-in attention, causal, over sequence lengths and head dimensions, with achieved GFLOP/s and the
//! largest device allocation. Each measurement runs in a child process, so one path's allocations (or its running
//! out of memory) do not touch another's figures.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::tensor::{Device, Distribution, Tensor};
use clap::{Args, ValueEnum};
use ember_kernels::{
    AttentionAlgorithm, AttentionSpec, GpuTuning, KernelTier, NAMED_ATTENTION, device_memory, named_attention,
};

use super::median;
use crate::devices::{self, DeviceChoice};
use ember_core_model::config::Precision;
use ember_core_model::params;

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
    /// Timed repetitions of `--calls` back-to-back calls and one device sync (median and minimum reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Calls per timed repetition, queued without reading anything back.
    #[arg(long, default_value_t = 4)]
    calls: usize,
    /// Implementations to measure, in this order: ember (the default tier), portable, subgroup (a WGSL tier
    /// forced), portable-2pass, subgroup-2pass (the tier with dq in a backward pass of its own, not folded into the
    /// dk/dv pass), portable-f16, subgroup-f16 (the tier with f16 tiles in workgroup memory; with `--dtype f16`
    /// every tier has them), cooperative and cooperative-8 (the forward on 16×16 or 8×8 f16 cooperative matrices,
    /// where the adapter offers them), burn, naive. Default: on wgpu each tier the adapter runs, then burn and naive; on the
    /// CPU ember, burn, naive.
    #[arg(long, value_delimiter = ',')]
    impls: Vec<String>,
    /// q, k and v (and so o and the gradients) in f32 or f16 (wgpu adapters with `SHADER_F16`).
    #[arg(long, default_value = "f32")]
    dtype: Precision,
    /// The device's peak rate in GFLOP/s (the FP32 figure of its datasheet, say): adds each rate's percentage of it.
    #[arg(long)]
    peak_gflops: Option<f64>,
    /// Measure one configuration, IMPL:T:D, and print it as one line (what the table's child processes run).
    #[arg(long, hide = true)]
    one: Option<String>,
}

/// The largest |Δ| / (1 + |reference|) that [`sampled_error`] allows: f32 accumulation over 16k keys stays near 1e-5;
/// f16 (inputs, or tiles in workgroup memory) rounds q, k, v, o and dq to 11 significant bits (4.9e-4 relative) and
/// D = rowsum(dO ⊙ o) through o.
fn tolerance(precision: Precision) -> f64 {
    match precision {
        Precision::F32 => 1e-3,
        Precision::F16 => 5e-3,
    }
}

/// A tier's name in [`NAMED_ATTENTION`].
fn tier_name(tier: KernelTier) -> &'static str {
    let named = NAMED_ATTENTION.iter().find(|(_, a, t)| *a == AttentionAlgorithm::Ember && *t == GpuTuning::tier(tier));
    named.map_or("ember", |(n, ..)| n)
}

/// Refuses sizes no measurement can take: zero anywhere, or q, k, v, o and their gradients (8 tensors of
/// B·h·T·d) larger than the memory available.
fn check_sizes(args: &BenchAttentionArgs) -> Result<()> {
    let counts = [args.heads, args.batch, args.iters, args.calls];
    if args.lengths.contains(&0) || args.head_dims.contains(&0) || counts.contains(&0) {
        bail!("--lengths, --head-dims, --heads, --batch, --iters and --calls must be at least 1");
    }
    for (&t, &d) in args.lengths.iter().flat_map(|t| args.head_dims.iter().map(move |d| (t, d))) {
        let elements = [args.batch, args.heads, t, d].iter().fold(8u128, |n, &x| n.saturating_mul(x as u128));
        crate::admission::admit(&format!("attention at T = {t}, d = {d}"), elements.saturating_mul(4))?;
    }
    Ok(())
}

pub fn bench_attention(args: BenchAttentionArgs, choice: DeviceChoice) -> Result<()> {
    check_sizes(&args)?;
    if let Some(one) = &args.one {
        return measure_one(&args, one, choice);
    }
    if let Some(Err(e)) = args.impls.iter().map(|n| named_attention(n)).find(Result::is_err) {
        bail!("--impls: {e}");
    }
    // Ember's figure for the speed-up row: "ember", else the tier Ember picks on this adapter.
    let adapter = devices::adapter(choice);
    let default_tier = adapter.as_ref().map_or("ember", |a| tier_name(a.default_tier()));
    let mut args = args;
    if args.impls.is_empty() {
        let tiers = adapter.as_ref().map_or(vec!["ember"], |a| a.tiers().into_iter().map(tier_name).collect());
        args.impls = tiers.into_iter().chain(["burn", "naive"]).map(String::from).collect();
    }
    let sides = adapter.as_ref().map_or(Vec::new(), |a| a.cooperative_sides());
    for (impl_name, side) in [("cooperative", 16), ("cooperative-8", 8)] {
        if args.impls.iter().any(|n| n == impl_name) && !sides.contains(&side) {
            let name = adapter.as_ref().map_or("the CPU", |a| a.name.as_str());
            bail!(
                "--impls {impl_name}: {name} offers no {side}×{side}×{side} f16 → f32 cooperative matrices (wgpu \
                 EXPERIMENTAL_COOPERATIVE_MATRIX)"
            );
        }
    }
    let peak = args.peak_gflops.filter(|&p| p > 0.0);
    let per_peak = peak.map_or(String::new(), |p| format!("; % peak: the rate as a percentage of {p:.0} GFLOP/s"));
    let (_, description) = devices::select(choice)?;
    println!(
        "bench attention on {description}: batch {}, {} heads, causal, {}; per call, median (minimum) of {} \
         repetitions of {} back-to-back calls and one device sync, after 2 untimed calls (shader compilation, \
         autotuning); implementations in turn; GFLOP/s of the median count 4·B·h·T²·d / 2 for the forward and 3.5× \
         that for forward+backward{per_peak}; each path's output and dq checked against an f64 reference on four query \
         rows (a row fails past a relative error of {:e}); the largest allocation of the forward alone and of forward+backward \
         (under autodiff Burn's built-in materialises the T×T scores by design)",
        args.batch,
        args.heads,
        args.dtype.name(),
        args.iters,
        args.calls,
        tolerance(args.dtype)
    );
    // With a peak rate, each GFLOP/s column is followed by its percentage of the peak.
    let (pct_head, pct_rule) = if peak.is_some() { (" % peak |", "---:|") } else { ("", "") };
    let columns = if peak.is_some() { 11 } else { 9 };
    println!(
        "\n| T | d | path | forward ms | GFLOP/s |{pct_head} fwd+bwd ms | GFLOP/s |{pct_head} largest allocation fwd | \
         fwd+bwd |"
    );
    println!("|---:|---:|---|---:|---:|{pct_rule}---:|---:|{pct_rule}---:|---:|");
    let mut measured = 0;
    for &d in &args.head_dims {
        for &t in &args.lengths {
            let mut forward = Vec::new();
            for name in &args.impls {
                let figures = child(&args, choice, name, t, d);
                let flops = 2.0 * (args.batch * args.heads * t * t * d) as f64;
                // "ms (min) | GFLOP/s |" and, with a peak, " % |".
                let cell = |ms: Option<Timing>, factor: f64| {
                    let Some(ms) = ms else { return format!("n/a | |{}", if peak.is_some() { " |" } else { "" }) };
                    let rate = factor * flops / (ms.median * 1e-3) / 1e9;
                    let pct = peak.map_or(String::new(), |p| format!(" {:.1} |", 100.0 * rate / p));
                    format!("{:.2} ({:.2}) | {rate:.1} |{pct}", ms.median, ms.min)
                };
                let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / 1048576.0);
                let (f, b, mem) = match &figures {
                    Ok(x) => (Some(x.forward), x.backward, format!("{} | {}", mib(x.forward_bytes), mib(x.all_bytes))),
                    Err(e) => (None, None, format!("failed: {e} | ")),
                };
                println!("| {t} | {d} | {name} | {} {} {mem} |", cell(f, 1.0), cell(b, 3.5));
                forward.push((name.as_str(), f.map(|f| f.median)));
                measured += usize::from(f.is_some());
            }
            let mine = |n: &str| n == "ember" || n == default_tier;
            let ember = forward.iter().find(|(n, _)| mine(n)).and_then(|&(_, ms)| ms);
            let others: Vec<_> = forward.iter().filter(|(n, _)| !mine(n)).collect();
            if let Some(ember) = ember.filter(|_| !others.is_empty()) {
                let mut cells =
                    vec![t.to_string(), d.to_string(), format!("ember ({default_tier}) speed-up (forward)")];
                for (name, other) in others {
                    cells.push(other.map_or(format!("vs {name} n/a"), |o| format!("vs {name} {:.2}×", o / ember)));
                    cells.push(String::new());
                }
                cells.resize(columns.max(cells.len()), String::new());
                println!("| {} |", cells.join(" | "));
            }
        }
    }
    if measured == 0 {
        bail!("every measurement failed (the table says why)");
    }
    Ok(())
}

/// Milliseconds per call: the median and the minimum over the timed repetitions.
#[derive(Clone, Copy)]
pub(super) struct Timing {
    pub median: f64,
    pub min: f64,
}

/// One configuration's figures: forward and forward+backward times, the largest allocation of the forward alone and
/// of both.
struct Figures {
    forward: Timing,
    backward: Option<Timing>,
    forward_bytes: u64,
    all_bytes: u64,
}

/// Runs one configuration in a child process.
fn child(args: &BenchAttentionArgs, choice: DeviceChoice, name: &str, t: usize, d: usize) -> Result<Figures> {
    let exe = std::env::current_exe().context("locating the ember binary")?;
    let output = Command::new(exe)
        .args(["--device", choice.to_possible_value().context("a device name")?.get_name()])
        .args(["bench", "attention", "--one", &format!("{name}:{t}:{d}")])
        .args(["--heads", &args.heads.to_string(), "--batch", &args.batch.to_string()])
        .args(["--iters", &args.iters.to_string(), "--calls", &args.calls.to_string()])
        .args(["--dtype", args.dtype.name()])
        .output()
        .context("running a measurement")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("measured ")) else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let reason = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
        bail!("{}", reason.chars().take(120).collect::<String>());
    };
    let fields: Vec<&str> = line.split_whitespace().collect();
    let value = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    let timing = |i: usize| Some(Timing { median: value(i)?, min: value(i + 1)? });
    // f16 tiles round q, k and v as f16 inputs would: the f16 tolerance, whatever the inputs' type.
    let (_, tuning) = named_attention(name).map_err(anyhow::Error::msg)?;
    let rounding = if tuning.half_tiles(args.dtype == Precision::F16) { Precision::F16 } else { args.dtype };
    for (i, pass) in [(6, "output"), (7, "dq")] {
        let error = value(i).context("a sampled error")?;
        if error.is_nan() || error > tolerance(rounding) {
            bail!("wrong {pass}: |Δ|/(1+|ref|) {error:.1e} on sampled rows against an f64 reference");
        }
    }
    Ok(Figures {
        forward: timing(0).context("a forward time")?,
        backward: timing(2),
        forward_bytes: value(4).unwrap_or(0.0) as u64,
        all_bytes: value(5).unwrap_or(0.0) as u64,
    })
}

fn measure_one(args: &BenchAttentionArgs, one: &str, choice: DeviceChoice) -> Result<()> {
    let parts: Vec<&str> = one.split(':').collect();
    let [name, t, d] = parts[..] else { bail!("--one takes IMPL:T:D, got {one:?}") };
    let (algorithm, tuning) = named_attention(name).map_err(anyhow::Error::msg)?;
    let (t, d): (usize, usize) = (t.parse()?, d.parse()?);
    let (device, _) = devices::select(choice)?;
    // The naive path, and Burn's built-in under autodiff, hold the B·h·T×T scores in one buffer: past the adapter's
    // storage-binding limit wgpu refuses the dispatch, and the timings would be of nothing.
    let scores = (args.batch * args.heads * t * t * args.dtype.bytes()) as u64;
    let binding = devices::adapter(choice).map(|a| a.limits.max_storage_buffer_binding_size);
    if let Some(limit) = binding.filter(|&l| scores > l && algorithm != AttentionAlgorithm::Ember) {
        bail!(
            "not run: its T×T scores, {} MiB, exceed the adapter's {} MiB storage-binding limit",
            scores >> 20,
            limit >> 20
        );
    }
    let shape = [args.batch, args.heads, t, d];
    let spec = AttentionSpec::causal(d).computed_by(algorithm, tuning);
    let x = |device: &Device| {
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), device).cast(params::float_dtype(args.dtype))
    };
    let (q, k, v) = (x(&device), x(&device), x(&device));
    let forward =
        time((args.iters, args.calls), &device, || ember_kernels::attention(q.clone(), k.clone(), v.clone(), &spec))?;
    let largest = || device_memory(&device).map_or(0, |m| m.largest_allocation);
    let forward_bytes = largest();
    let output = ember_kernels::attention(q.clone(), k.clone(), v.clone(), &spec);
    let inputs = [last_head(&q)?, last_head(&k)?, last_head(&v)?];
    let forward_error = sampled_error(&inputs, &last_head(&output)?, Pass::Forward, d);
    let autodiff = device.clone().autodiff();
    let (q, k, v) = (x(&autodiff).require_grad(), x(&autodiff).require_grad(), x(&autodiff).require_grad());
    let dq = || {
        let grads = ember_kernels::attention(q.clone(), k.clone(), v.clone(), &spec).sum().backward();
        q.grad(&grads).expect("a gradient")
    };
    let backward = time((args.iters, args.calls), &device, dq)?;
    let all_bytes = largest();
    let inputs = [last_head(&q)?, last_head(&k)?, last_head(&v)?];
    let backward_error = sampled_error(&inputs, &last_head(&dq())?, Pass::Backward, d);
    println!(
        "measured {:.4} {:.4} {:.4} {:.4} {forward_bytes} {all_bytes} {forward_error:e} {backward_error:e}",
        forward.median, forward.min, backward.median, backward.min
    );
    Ok(())
}

/// The last batch element's last head of a [B, h, T, d] tensor, read back as T·d values.
fn last_head(x: &Tensor<4>) -> Result<Vec<f32>> {
    let [b, h, t, d] = x.dims();
    let head = x.clone().slice([b - 1..b, h - 1..h, 0..t, 0..d]);
    let data = head.try_into_data().map_err(|e| {
        let first = format!("{e}").lines().next().unwrap_or_default().to_string();
        anyhow::anyhow!("the device failed to run it ({first})")
    })?;
    data.convert::<f32>().try_to_vec::<f32>().map_err(|e| anyhow::anyhow!("reading f32 values: {e:?}"))
}

#[derive(Clone, Copy, PartialEq)]
enum Pass {
    /// O = softmax(QKᵀ/√d + causal mask) V.
    Forward,
    /// dQ of Σ O: dS_ij = P_ij (Σ_c V_jc − D_i), D_i = Σ_j P_ij Σ_c V_jc, dQ_i = Σ_j dS_ij K_j / √d.
    Backward,
}

/// The largest |Δ| / (1 + |reference|) of `got` (O or dQ of one head, T×d) against an f64 reference, over four query
/// rows spread along the sequence.
fn sampled_error([q, k, v]: &[Vec<f32>; 3], got: &[f32], pass: Pass, d: usize) -> f64 {
    let t = got.len() / d;
    let row = |x: &[f32], i: usize| x[i * d..(i + 1) * d].iter().map(|&e| f64::from(e)).collect::<Vec<_>>();
    let scale = 1.0 / (d as f64).sqrt();
    let mut worst = 0.0f64;
    for i in [0, 1.min(t - 1), t / 2, t - 1] {
        let qi = row(q, i);
        let scores: Vec<f64> =
            (0..=i).map(|j| scale * row(k, j).iter().zip(&qi).map(|(a, b)| a * b).sum::<f64>()).collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let z: f64 = weights.iter().sum();
        let p: Vec<f64> = weights.iter().map(|w| w / z).collect();
        let mut expected = vec![0.0; d];
        match pass {
            Pass::Forward => {
                for (j, pj) in p.iter().enumerate() {
                    row(v, j).iter().zip(&mut expected).for_each(|(vj, e)| *e += pj * vj);
                }
            }
            Pass::Backward => {
                let dp: Vec<f64> = (0..=i).map(|j| row(v, j).iter().sum()).collect();
                let di: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..=i {
                    let ds = p[j] * (dp[j] - di) * scale;
                    row(k, j).iter().zip(&mut expected).for_each(|(kj, e)| *e += ds * kj);
                }
            }
        }
        for (g, e) in row(got, i).iter().zip(&expected) {
            worst = worst.max((g - e).abs() / (1.0 + e.abs()));
        }
    }
    worst
}

/// Per-call milliseconds of `run`: two untimed calls (shader compilation, autotuning), then `iters` repetitions of
/// `calls` calls queued back to back, their results kept until one device sync ends the repetition.
pub(super) fn time<const D: usize>(
    (iters, calls): (usize, usize),
    device: &Device,
    mut run: impl FnMut() -> Tensor<D>,
) -> Result<Timing> {
    let sync = || device.sync().map_err(|e| anyhow::anyhow!("the device failed: {e:?}"));
    let warm: Vec<_> = (0..2).map(|_| run()).collect();
    sync()?;
    drop(warm);
    let calls = calls.max(1);
    let mut ms = Vec::with_capacity(iters.max(1));
    for _ in 0..iters.max(1) {
        let start = Instant::now();
        let kept: Vec<_> = (0..calls).map(|_| run()).collect();
        sync()?;
        ms.push(start.elapsed().as_secs_f64() * 1e3 / calls as f64);
        drop(kept);
    }
    let min = ms.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(Timing { median: median(&mut ms), min })
}
