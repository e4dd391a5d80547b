//! `ember`: train a GPT from a TOML config, sample from a run directory, benchmark, and list devices.

mod admission;
mod allocator;
mod bench;
mod config;
mod convert;
mod devices;
mod eval;
mod inspect;
mod progress;
mod ranks;
mod run_dir;
mod serve;
mod train;
mod translate;

use ember_core_model::weights::WeightFormat;
use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;

use anyhow::{Result, bail};
use clap::{Args, Parser, Subcommand};
use ember_core_model::{bundle, import, params};
use ember_serve::SampleConfig;
use ember_train::collective::Collective;

use crate::devices::DeviceChoice;
use ember_core_model::config::Precision;

#[global_allocator]
static ALLOCATOR: allocator::Recycling = allocator::Recycling::new();

/// Returns the memory freed while loading a model to the system (see [`allocator::Recycling::release`]).
pub(crate) fn release_load_buffers() {
    ALLOCATOR.release();
}

#[derive(Parser)]
#[command(name = "ember", version, about = "Train and run Transformer language models on Burn")]
struct Cli {
    /// Where to run: cpu, ndarray, flex, wgpu, or auto (a real GPU when there is one, else cpu).
    #[arg(long, global = true, value_enum, default_value = "auto")]
    device: DeviceChoice,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model from a TOML config, then print a sample from it.
    Train(train::TrainArgs),
    /// Generate text from a run directory, a Hugging Face directory or a GGUF file.
    Generate(GenerateArgs),
    /// Convert a Hugging Face directory or a GGUF file into an Ember run directory.
    Import(ImportArgs),
    /// Convert a trained model's attention: MHA / GQA → multi-head latent attention, by truncated SVD.
    Convert(convert::ConvertArgs),
    /// Print a model's parameters per part and its KV-cache size.
    Inspect(inspect::InspectArgs),
    /// Serve a model over HTTP with the OpenAI completions API.
    Serve(serve::ServeArgs),
    /// Measure performance.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Score outputs: BLEU of files, or of a translation model on a test set.
    Eval(eval::EvalArgs),
    /// Translate sentences (one a line) with a translation run directory.
    Translate(translate::TranslateArgs),
    /// Average the last checkpoints of a translation run into a new run directory.
    Average(translate::AverageArgs),
    /// List the devices Ember can run on.
    Devices,
}

#[derive(Args)]
struct GenerateArgs {
    /// A run directory (`ember train` / `ember import`), a Hugging Face directory, or a .gguf file.
    #[arg(long)]
    model: PathBuf,
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
    /// Where keys and values live between steps: contiguous, paged, int8, int4, state (linear attention's fixed
    /// recurrent state) or none (recompute); by default state for linear-attention models, else contiguous.
    #[arg(long)]
    kv_cache: Option<ember_serve::KvKind>,
    /// Tokens per page of the paged store.
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    /// Values per scale of the int8 / int4 stores.
    #[arg(long, default_value_t = 32)]
    kv_group: usize,
    /// Print load time and prompt / generation speed to stderr.
    #[arg(long)]
    stats: bool,
    /// How projections and the token embedding are held on the CPU and wgpu: native (a GGUF file's blocks, used as they are;
    /// a run directory as stored), f32, or converted to f16, bf16, q8_0, q4_0, q4_1, q5_0 or q5_1.
    #[arg(long, default_value = "native")]
    weights: WeightFormat,
    /// f16: weights (dense, from any stored format), activations and the KV store in f16, on wgpu adapters with
    /// `SHADER_F16` (elsewhere f32, with a note).
    #[arg(long, default_value = "f32")]
    dtype: Precision,
}

#[derive(Args)]
struct ImportArgs {
    /// A Hugging Face directory (config.json + model.safetensors + tokenizer.json) or a .gguf file.
    source: PathBuf,
    /// The run directory to write; it must not hold a model already.
    #[arg(long)]
    out: PathBuf,
    /// Store the projections and token embedding in this ggml format (f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1);
    /// by default everything is f32.
    #[arg(long)]
    quantize: Option<WeightFormat>,
}

fn main() -> ExitCode {
    allocator::keep_heap();
    match allocator::Recycling::budget_from_env() {
        Ok(Some(bytes)) => ALLOCATOR.set_budget(bytes),
        Ok(None) => {}
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    let cli = Cli::parse();
    // Training commands join an `mpiexec` launch (in builds with the `mpi` feature); the ranks on a machine split
    // its cores before rayon's pool starts.
    let trains = matches!(cli.command, Command::Train(_) | Command::Bench(bench::BenchCommand::Train(_)));
    let launch = match if trains { ranks::join() } else { Ok(ranks::single()) } {
        Ok(launch) => launch,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = ranks::share_cores(&launch) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    let command = move || {
        // The CPU kernels keep rayon's workers looking for work between kernels for the whole command.
        let _awake = ember_kernels::keep_workers_awake();
        run(cli, ranks::shared(launch))
    };
    match on_worker(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// `f` run on one of rayon's worker threads, so that each kernel's parallel loop starts on the core that calls it,
/// which keeps part of the loop while the other worker steals the rest, instead of handing the whole loop to the
/// workers and sleeping until they finish (two more thread switches per kernel call).
fn on_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

fn run(cli: Cli, collective: Rc<dyn Collective>) -> Result<()> {
    match cli.command {
        Command::Train(args) => train::train(args, cli.device, collective),
        Command::Generate(args) => generate(args, cli.device),
        Command::Import(args) => import(args),
        Command::Convert(args) => convert::convert(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Serve(args) => serve::serve(args, cli.device),
        Command::Bench(command) => {
            let result = bench::bench(command, cli.device, collective.clone());
            ranks::end_all_on_error(result, &*collective)
        }
        Command::Eval(args) => eval::eval(args, cli.device),
        Command::Translate(args) => translate::translate(args, cli.device),
        Command::Average(args) => translate::average(args),
        Command::Devices => {
            list_devices();
            Ok(())
        }
    }
}

fn generate(args: GenerateArgs, choice: DeviceChoice) -> Result<()> {
    let (device, _, precision) = devices::select_in(choice, args.dtype)?;
    let started = std::time::Instant::now();
    let mut run = import::load_as(&args.model, &device, devices::weights_in(precision, args.weights)?)?;
    run.model = params::in_precision(run.model, precision);
    release_load_buffers();
    if devices::on_host(choice) {
        admission::admit_kv_stores(&run.config, 1)?;
    }
    let load_seconds = started.elapsed().as_secs_f64();
    let defaults = SampleConfig::default();
    let settings = SampleConfig {
        prompt: args.prompt.unwrap_or(defaults.prompt),
        max_new_tokens: args.max_new_tokens.unwrap_or(defaults.max_new_tokens),
        temperature: args.temperature.unwrap_or(defaults.temperature),
        top_k: args.top_k.or(defaults.top_k),
        top_p: args.top_p.or(defaults.top_p),
        repetition_penalty: args.repetition_penalty.unwrap_or(defaults.repetition_penalty),
        frequency_penalty: args.frequency_penalty.unwrap_or(defaults.frequency_penalty),
        presence_penalty: args.presence_penalty.unwrap_or(defaults.presence_penalty),
        stop: args.stop,
        seed: args.seed.unwrap_or(defaults.seed),
    };
    settings.validate()?;
    let kind = args.kv_cache.unwrap_or(ember_serve::KvKind::for_model(run.model.config()));
    let kv = ember_serve::KvSpec { kind, page_size: args.page_size, group: args.kv_group };
    kv.check(run.model.config()).map_err(anyhow::Error::msg)?;
    let g = train::print_sample(&run.model, &run.tokenizer, &settings, kv, &device)?;
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

fn import(args: ImportArgs) -> Result<()> {
    if args.out.join(bundle::CONFIG).exists() || args.out.join(bundle::MODEL).exists() {
        bail!("{}: already holds a model; choose another --out", args.out.display());
    }
    let started = std::time::Instant::now();
    let format = match args.quantize {
        None => WeightFormat::F32,
        Some(WeightFormat::Packed(format)) => WeightFormat::Packed(format),
        Some(other) => bail!("--quantize {other}: give a ggml format (f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1)"),
    };
    let (config, weights, tokenizer, _) = import::read(&args.source)?;
    let weights = weights.convert(format).map_err(|e| anyhow::anyhow!("{}: {e}", args.source.display()))?;
    // The weights must build the model they claim to be before they are written.
    ember_core_model::Gpt::load_packed(&config, &weights.dense, &weights.packed, &burn::tensor::Device::flex())
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.source.display()))?;
    bundle::save_weights(&args.out, &config, &weights, &tokenizer)?;
    let params = ember_core_model::inspect::total_params(&config);
    println!(
        "imported {} ({} parameters) into {} in {:.1} s",
        args.source.display(),
        params,
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn list_devices() {
    println!(
        "cpu      burn-flex (default `cpu`), {} threads",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("ndarray  burn-ndarray");
    let adapters = ember_kernels::wgpu_adapters();
    if adapters.is_empty() {
        println!("wgpu     no adapter found");
    }
    for a in adapters {
        let has = |f: ember_kernels::adapters::Features| if a.features.contains(f) { "yes" } else { "no" };
        let subgroups = match a.features.contains(ember_kernels::adapters::Features::SUBGROUP) {
            true => format!("{}–{} lanes", a.subgroup_sizes.0, a.subgroup_sizes.1),
            false => "no".into(),
        };
        println!(
            "wgpu     {} | {:?} | {:?} | driver {} | subgroups {subgroups}, f16 {}, f32 atomics {}, cooperative matrix {} (attention forward {}); attention tiers {:?} \
             (default {:?}) | workgroup memory {} B, invocations/workgroup {}, storage binding {} MiB, buffer {} MiB",
            a.name,
            a.kind,
            a.backend,
            a.driver,
            has(ember_kernels::adapters::Features::SHADER_F16),
            has(ember_kernels::adapters::Features::SHADER_FLOAT32_ATOMIC),
            has(ember_kernels::adapters::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            if a.cooperative_attention() { "16×16 f16 → f32: yes" } else { "no" },
            a.tiers(),
            a.default_tier(),
            a.limits.max_compute_workgroup_storage_size,
            a.limits.max_compute_invocations_per_workgroup,
            a.limits.max_storage_buffer_binding_size >> 20,
            a.limits.max_buffer_size >> 20,
        );
    }
}
