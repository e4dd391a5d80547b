//! `ember bench train`: tokens/s and peak memory of training steps, optionally side by side with the PyTorch
//! reference script (alternating rounds, medians, ratio).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use ember_kernels::{device_memory, named_attention};
use ember_train::collective::Collective;
use ember_train::{StepPhases, Trainer, corpus};

use crate::config::RunConfig;
use crate::devices::{self, DeviceChoice};

use super::median;
use super::memory::Memory;

#[derive(Args)]
pub struct BenchTrainArgs {
    #[arg(long)]
    config: PathBuf,
    /// Override a config value (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Timed steps per round.
    #[arg(long, default_value_t = 50)]
    steps: u64,
    /// Untimed steps before each round.
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Rounds; with --pytorch, Ember and PyTorch alternate.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A Python with torch: runs the PyTorch reference trainer on the same config, same machine, in turns.
    #[arg(long, value_name = "PYTHON")]
    pytorch: Option<String>,
    /// The PyTorch reference trainer to run (default: the copy of scripts/reference/gpt_train.py built in).
    #[arg(long, value_name = "FILE", requires = "pytorch")]
    script: Option<PathBuf>,
    /// With --pytorch: the device PyTorch trains on (cpu, cuda).
    #[arg(long, default_value = "cpu")]
    pytorch_device: String,
    /// With --pytorch: PyTorch's precisions, each timed once per round (f32; bf16 is f32 weights under bf16
    /// autocast).
    #[arg(long, value_delimiter = ',', default_value = "f32")]
    pytorch_dtype: Vec<String>,
    /// Attention implementation: auto (Ember's kernels: WGSL on wgpu, Rust on the CPU), a WGSL tuning of them
    /// (portable, subgroup, portable-f16, cooperative, ...), burn (Burn's built-in) or naive.
    #[arg(long, default_value = "auto")]
    attention: String,
}

/// Under `mpiexec` every rank trains its shard of each batch and rank 0 reports global tokens/s, each rank's share
/// and the time spent averaging gradients.
pub fn bench_train(args: BenchTrainArgs, device: DeviceChoice, collective: Rc<dyn Collective>) -> Result<()> {
    if args.rounds == 0 || args.steps == 0 {
        bail!("--rounds and --steps must be at least 1");
    }
    let config = RunConfig::load(&args.config, &args.overrides)?;
    let (algorithm, tuning) = named_attention(&args.attention).map_err(anyhow::Error::msg)?;
    let (ranks, rank) = (collective.ranks(), collective.rank());
    if ranks > 1 && args.pytorch.is_some() {
        bail!("--pytorch runs beside one process; leave it out under mpiexec");
    }
    let on_host = devices::on_host(device);
    let (device, description, precision) =
        devices::select_local_in(device, collective.local_rank(), config.model.dtype)?;
    let scratch = tempfile::tempdir().context("creating a scratch run directory")?;
    let (tok, corpus) = corpus::prepare(&config.data, scratch.path(), false)?;
    let mut model_config = config.model.clone();
    // As `ember train`: a larger vocabulary in the config stands (GPT-2's 50257 over a small corpus's BPE).
    let vocab = ember_core_model::tokenizer::vocab_size(&tok);
    model_config.vocab_size = Some(model_config.vocab_size.map_or(vocab, |v| v.max(vocab)));
    if on_host {
        let seq_len = config.train.seq_len(&model_config);
        crate::admission::admit_training(&model_config, config.train.batch_size(), seq_len)?;
    }
    let resolved = scratch.path().join("config.toml");
    std::fs::write(&resolved, RunConfig { model: model_config.clone(), ..config.clone() }.to_toml())?;
    let threads = rayon::current_num_threads();
    let say = |line: String| {
        if rank == 0 {
            println!("{line}");
        }
    };
    say(format!(
        "bench train: {} in {precision} on {description}, {} warm-up + {} timed steps per round, {threads} threads, \
         attention {}{}",
        args.config.display(),
        args.warmup,
        args.steps,
        args.attention,
        if ranks > 1 { format!(", {ranks} ranks (data-parallel over MPI)") } else { String::new() }
    ));

    let script = super::reference::GPT_TRAIN.script(args.script.as_deref())?;
    let (mut ember, mut torch) = (Vec::new(), vec![Vec::new(); args.pytorch_dtype.len()]);
    for round in 1..=args.rounds {
        // PyTorch first in each round: its figures stand even when Ember's round is cut short.
        if let Some(python) = &args.pytorch {
            for (dtype, runs) in args.pytorch_dtype.iter().zip(&mut torch) {
                let (tps, cuda_mb) = pytorch_round(python, script.path(), &resolved, &args, threads, dtype)?;
                let memory = cuda_mb.map_or(String::new(), |mb| format!(", peak CUDA memory {mb:.1} MB"));
                println!("round {round}: pytorch {dtype} {tps:>10.0} tokens/s{memory}");
                runs.push(tps);
            }
        }
        let mut trainer =
            Trainer::new(model_config.clone(), config.train.clone(), corpus.clone(), scratch.path(), &device)
                .with_collective(collective.clone())
                .with_precision(precision);
        trainer.model = trainer.model.with_attention(algorithm, tuning);
        for _ in 0..args.warmup {
            trainer.step();
        }
        trainer.phases = StepPhases::default();
        let (started, cpu_started, stolen_started) = (Instant::now(), cpu_seconds(), stolen_seconds());
        for _ in 0..args.steps {
            trainer.step();
        }
        let wall = started.elapsed().as_secs_f64();
        let tps = (args.steps as usize * trainer.tokens_per_step()) as f64 / wall;
        let cpu_use = 100.0 * (cpu_seconds() - cpu_started) / wall;
        let steal = match (stolen_started, stolen_seconds()) {
            (Some(from), Some(to)) => format!(" (steal {:.0}%)", 100.0 * (to - from) / wall),
            _ => String::new(),
        };
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3 / args.steps as f64;
        let p = trainer.phases;
        let per_rank = match ranks {
            1 => String::new(),
            _ => format!(" ({:.0} per rank), all-reduce {:.1} ms/step,", tps / ranks as f64, ms(p.all_reduce)),
        };
        say(format!(
            "round {round}: ember   {tps:>10.0} tokens/s{per_rank}  ms/step: forward+loss {:.1}, backward {:.1}, \
             optimizer {:.1}; CPU use {cpu_use:.0}%{steal}",
            ms(p.forward),
            ms(p.backward),
            ms(p.optimizer)
        ));
        ember.push(tps);
    }
    let ember_median = median(&mut ember);
    say(format!("ember median: {ember_median:.0} tokens/s, peak memory {:.1} MiB (rank 0)", Memory::now().peak_mib));
    if let Some(memory) = device_memory(&device) {
        let mib = |bytes: u64| bytes as f64 / 1048576.0;
        println!(
            "ember device memory: {:.1} MiB reserved by the pools after the rounds, largest allocation {:.1} MiB",
            mib(memory.reserved),
            mib(memory.largest_allocation)
        );
    }
    for (dtype, runs) in args.pytorch_dtype.iter().zip(&mut torch) {
        if runs.is_empty() {
            continue;
        }
        let torch_median = median(runs);
        println!("pytorch {dtype} median: {torch_median:.0} tokens/s");
        println!("ratio ember / pytorch {dtype}: {:.2}x", ember_median / torch_median);
    }
    Ok(())
}

/// One PyTorch run: its tokens/s and, on CUDA, its peak allocated memory in MB.
fn pytorch_round(
    python: &str,
    script: &Path,
    config: &Path,
    args: &BenchTrainArgs,
    threads: usize,
    dtype: &str,
) -> Result<(f64, Option<f64>)> {
    let out = Command::new(python)
        .arg(script)
        .arg(config)
        .args([
            "--steps",
            &args.steps.to_string(),
            "--warmup",
            &args.warmup.to_string(),
            "--threads",
            &threads.to_string(),
            "--device",
            &args.pytorch_device,
            "--dtype",
            dtype,
        ])
        .output()
        .with_context(|| format!("running {python} {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "the PyTorch reference failed: {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default()
        );
    }
    let field = |key: &str| stdout.split_whitespace().find_map(|w| w.strip_prefix(key)?.parse::<f64>().ok());
    let tps = field("tokens_per_s=").context("the PyTorch reference printed no tokens_per_s")?;
    Ok((tps, field("cuda_peak_mb=")))
}

/// User + system CPU time of the whole process (all threads) so far, in seconds.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid rusage.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// CPU time that the hypervisor gave to other machines so far (Linux's steal time, all cores), in seconds: with
/// the process's CPU use and the idle time, it makes up the cores' 100 % each.
fn stolen_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: f64 = stat.lines().next()?.split_whitespace().nth(8)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks_per_second > 0).then(|| ticks / ticks_per_second as f64)
}
