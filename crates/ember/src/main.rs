//! `ember`: train a GPT from a TOML config, sample from a run directory, benchmark, and list devices.

mod admission;
mod allocator;
mod bench;
mod config;
mod convert;
mod devices;
mod eval;
mod export;
mod generate;
mod inference;
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
use ember_core_model::{Build, bundle, import};
use ember_train::collective::Collective;

use crate::devices::DeviceChoice;

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
    Generate(generate::GenerateArgs),
    /// Convert a Hugging Face directory or a GGUF file into an Ember run directory.
    Import(ImportArgs),
    /// Write a model for other tools: a GGUF file (llama.cpp) or a Hugging Face directory (transformers).
    Export(export::ExportArgs),
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
    /// A run config whose [data], [train] and [sample] the run directory takes, so that `ember train --resume`
    /// fine-tunes the imported weights (`data.format = "chat"`: on conversations, with the model's chat template).
    #[arg(long)]
    config: Option<PathBuf>,
}

fn main() -> ExitCode {
    allocator::keep_heap();
    match allocator::Recycling::budget_from_env() {
        Ok(Some(bytes)) => allocator::ALLOCATOR.set_budget(bytes),
        Ok(None) => {}
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = ember_kernels::level::CpuLevel::requested() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
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
        Command::Generate(args) => generate::generate(args, cli.device),
        Command::Import(args) => import(args),
        Command::Export(args) => export::export(args),
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
    admission::admit_model_files(&args.source)?;
    let setup = args.config.as_deref().map(convert::fine_tuning_table).transpose()?;
    let (config, weights, tokenizer, chat) = import::read(&args.source)?;
    let weights = weights.convert(format).map_err(|e| anyhow::anyhow!("{}: {e}", args.source.display()))?;
    // The weights must build the model they claim to be before they are written.
    ember_core_model::CausalLm::load_packed(&config, &weights.dense, &weights.packed, &burn::tensor::Device::flex())
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.source.display()))?;
    bundle::save_weights(&args.out, &config, &weights, &tokenizer)?;
    if chat != Default::default() {
        bundle::write_chat(&args.out, &chat, config.block_size)?;
    }
    if let Some(mut table) = setup {
        table.insert("model".into(), toml::Value::try_from(&config)?);
        bundle::write_atomic(&args.out.join(bundle::CONFIG), table.to_string().as_bytes())?;
    }
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
        // Each configuration wgpu reports: M×N×K, A and B's scalar → C's.
        let configurations: Vec<String> = a
            .cooperative
            .iter()
            .map(|p| format!("{}×{}×{} {:?}→{:?}", p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type))
            .collect();
        let cooperative = match a.features.contains(ember_kernels::adapters::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            true => format!("yes [{}]", configurations.join(", ")),
            false => "no".into(),
        };
        println!(
            "wgpu     {} | {:?} | {:?} | driver {} | subgroups {subgroups}, f16 {}, f32 atomics {}, cooperative matrix {cooperative} (attention forward {}); attention tiers {:?} \
             (default {:?}) | workgroup memory {} B, invocations/workgroup {}, storage binding {} MiB, buffer {} MiB",
            a.name,
            a.kind,
            a.backend,
            a.driver,
            has(ember_kernels::adapters::Features::SHADER_F16),
            has(ember_kernels::adapters::Features::SHADER_FLOAT32_ATOMIC),
            match a.cooperative_sides().first() {
                Some(n) => format!("on {n}×{n} f16 → f32"),
                None => "no".into(),
            },
            a.tiers(),
            a.default_tier(),
            a.limits.max_compute_workgroup_storage_size,
            a.limits.max_compute_invocations_per_workgroup,
            a.limits.max_storage_buffer_binding_size >> 20,
            a.limits.max_buffer_size >> 20,
        );
    }
}
