//! `ember bench decode`: generation tokens/s with the KV cache against recomputing the context every step, at
//! several lengths, side by side in one run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use ember_core_model::config::PositionKind;
use ember_core_model::{Build, CausalLm, Rng, params};
use ember_serve::sampling::argmax;
use ember_serve::{Decoder, KvKind};

use super::median;
use super::memory::Memory;
use crate::devices::DeviceChoice;
use crate::inference::{HoldFlags, Placement, load_for_inference};
use crate::inspect::model_config;

#[derive(Args)]
pub struct BenchDecodeArgs {
    /// A config whose [model] is built with random weights (speed does not depend on the values); its context is
    /// raised to fit the longest run.
    #[arg(long, conflicts_with = "model")]
    config: Option<PathBuf>,
    /// A run directory, Hugging Face directory or GGUF file.
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    hold: HoldFlags,
    /// Generated tokens per measurement (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "128,512,1024")]
    lengths: Vec<usize>,
    /// Prompt tokens before generation.
    #[arg(long, default_value_t = 16)]
    prompt_tokens: usize,
    /// Rounds; cached and uncached alternate and the median is reported.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// A Python with torch and transformers: times its greedy `generate` (scripts/reference/hf_generate.py),
    /// alternating with Ember's cached decoding, for time to first token, prompt tokens/s and decode tokens/s over
    /// the longest length. With --model (a GGUF) both run the same weights; with --config (a Llama-style [model])
    /// both build the shape with random weights.
    #[arg(long, value_name = "PYTHON")]
    transformers: Option<String>,
    /// The transformers reference to run (default: the copy of scripts/reference/hf_generate.py built in).
    #[arg(long, value_name = "FILE", requires = "transformers")]
    script: Option<std::path::PathBuf>,
    /// With --transformers: the device transformers runs on (cpu, cuda).
    #[arg(long, default_value = "cpu")]
    transformers_device: String,
    /// With --transformers: its weights' and activations' type (f32, bf16, f16).
    #[arg(long, default_value = "f32")]
    transformers_dtype: String,
    /// Alternate rounds with llama.cpp's `llama-bench` (this path) on the same GGUF file and thread count: prompt
    /// and decode tokens/s side by side, Ember's measured as in --transformers.
    #[arg(long, value_name = "LLAMA_BENCH", requires = "model", conflicts_with = "transformers")]
    llama_bench: Option<std::path::PathBuf>,
}

pub fn bench_decode(args: BenchDecodeArgs, choice: DeviceChoice) -> Result<()> {
    if args.lengths.contains(&0) || args.prompt_tokens == 0 || args.rounds == 0 {
        bail!("--lengths, --prompt-tokens and --rounds must be at least 1");
    }
    let placement = Placement::new(choice, args.hold.dtype)?;
    let precision = placement.precision;
    let longest = args.prompt_tokens + args.lengths.iter().copied().max().unwrap_or(0);
    let (model, source) = match (&args.config, &args.model) {
        (Some(path), _) => {
            let mut config = model_config(path)?;
            config.vocab_size.get_or_insert(256);
            if config.positions == PositionKind::Learned || config.block_size < longest {
                config.block_size = config.block_size.max(longest);
            }
            if placement.host {
                crate::admission::admit_built_model(&config, 1)?;
            }
            let model = params::in_precision(CausalLm::new(&config, &mut Rng::new(0), &placement.device), precision);
            (model, format!("{} (random weights)", path.display()))
        }
        (None, Some(path)) => (load_for_inference(path, args.hold, &placement, 1)?.model, path.display().to_string()),
        (None, None) => bail!("give --config FILE or --model PATH"),
    };
    let device = placement.device;
    let description = format!("{}, {}", placement.description, precision.name());
    if let Some(python) = &args.transformers {
        // The reference loads the same GGUF file, or builds the config's shape with random weights.
        let mut model_args: Vec<OsString> = match (&args.config, &args.model) {
            (Some(path), _) => vec![OsString::from("--config"), OsString::from(path)],
            (None, Some(path)) => vec![OsString::from(path)],
            (None, None) => unreachable!("a model was built above"),
        };
        for (flag, value) in [("--device", &args.transformers_device), ("--dtype", &args.transformers_dtype)] {
            model_args.extend([OsString::from(flag), OsString::from(value)]);
        }
        let n = args.lengths.iter().copied().max().unwrap_or(128);
        let script = super::reference::HF_GENERATE.script(args.script.as_deref())?;
        let python = (python.as_str(), script.path(), model_args.as_slice());
        let run = (args.prompt_tokens, n, args.rounds);
        return against_transformers(&model, python, &source, run, &device, &description);
    }
    if let (Some(llama_bench), Some(gguf)) = (&args.llama_bench, &args.model) {
        let n = args.lengths.iter().copied().max().unwrap_or(128);
        return against_llama_cpp(
            &model,
            (llama_bench, gguf),
            (args.prompt_tokens, n, args.rounds),
            &device,
            &description,
        );
    }
    if model.block_size() < longest {
        bail!("the model's context is {} tokens; the longest run needs {longest}", model.block_size());
    }
    println!("bench decode: {source} on {description}, {}-token prompt, greedy", args.prompt_tokens);
    println!("\n| generated tokens | cached tokens/s | uncached tokens/s | cached / uncached |");
    println!("|---|---|---|---|");
    let vocab = model.config().vocab();
    let mut rng = Rng::new(1);
    let prompt: Vec<u32> = (0..args.prompt_tokens.max(1)).map(|_| rng.below(vocab) as u32).collect();
    for &n in &args.lengths {
        let (mut cached, mut uncached) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds.max(1) {
            // The prompt's own pass is not counted: n timed steps after it.
            cached.push(greedy_timed(&model, KvKind::for_model(model.config()), &prompt, n + 1, &device).1);
            uncached.push(greedy_timed(&model, KvKind::None, &prompt, n + 1, &device).1);
        }
        let (c, u) = (median(&mut cached), median(&mut uncached));
        println!("| {n} | {c:.1} | {u:.1} | {:.1}x |", c / u);
    }
    print_memory();
    Ok(())
}

/// Time to first token, prompt tokens/s and decode tokens/s of Ember's cached greedy decoding against transformers'
/// `generate` (`python script model_args...`), on the prompt ids (i · 7919 + 13) mod V that
/// scripts/reference/hf_generate.py also uses; `run` is (prompt tokens, new tokens, rounds).
fn against_transformers(
    model: &CausalLm,
    (python, script, model_args): (&str, &std::path::Path, &[OsString]),
    source: &str,
    (prompt_tokens, n, rounds): (usize, usize, usize),
    device: &burn::tensor::Device,
    description: &str,
) -> Result<()> {
    let prompt = reference_prompt(model, prompt_tokens);
    println!("bench decode: {source} on {description}, {prompt_tokens}-token prompt + {n} new tokens, greedy");
    // One untimed run first, as the reference warms up too (on wgpu: shader compilation and autotuning).
    greedy_timed(model, KvKind::for_model(model.config()), &prompt, n.clamp(2, 4), device);
    let (mut ember, mut hf) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let (ttft, decode) = greedy_timed(model, KvKind::for_model(model.config()), &prompt, n, device);
        println!("ember:        time to first token {ttft:.3} s, decode {decode:.2} tokens/s");
        ember.push((ttft, decode));
        let out = std::process::Command::new(python)
            .arg(script)
            .args(model_args)
            .args(["--prompt-tokens", &prompt_tokens.to_string(), "--new-tokens", &n.to_string()])
            .output()
            .with_context(|| format!("running {python} {}", script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let field = |key: &str| stdout.split_whitespace().find_map(|w| w.strip_prefix(key)?.parse::<f64>().ok());
        let (Some(ttft), Some(decode)) = (field("ttft_s="), field("decode_tokens_per_s=")) else {
            bail!("transformers failed: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default());
        };
        println!("transformers: time to first token {ttft:.3} s, decode {decode:.2} tokens/s");
        hf.push((ttft, decode));
    }
    let med = |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| median(&mut xs.iter().map(f).collect::<Vec<_>>());
    let (e_ttft, e_dec) = (med(&ember, |x| x.0), med(&ember, |x| x.1));
    let (h_ttft, h_dec) = (med(&hf, |x| x.0), med(&hf, |x| x.1));
    // The time to first token holds the prompt's pass (and one sample): prompt tokens/s is the prompt over it.
    let p = prompt_tokens as f64;
    println!("\n| | time to first token | prompt tokens/s | decode tokens/s |");
    println!("|---|---|---|---|");
    println!("| Ember | {e_ttft:.3} s | {:.1} | {e_dec:.2} |", p / e_ttft);
    println!("| transformers | {h_ttft:.3} s | {:.1} | {h_dec:.2} |", p / h_ttft);
    println!(
        "| speed ratio Ember / transformers | {:.2}× | {:.2}× | {:.2}× |",
        h_ttft / e_ttft,
        h_ttft / e_ttft,
        e_dec / h_dec
    );
    print_memory();
    Ok(())
}

/// The prompt ids (i · 7919 + 13) mod V both sides of a comparison decode after.
fn reference_prompt(model: &CausalLm, tokens: usize) -> Vec<u32> {
    let vocab = model.config().vocab();
    (0..tokens).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

/// Prompt and decode tokens/s of Ember's cached greedy decoding against `llama-bench -p P -n N -d 0,P -t T -r 1` on
/// the same GGUF file, rounds alternating; T is Ember's thread count. Both decode their N tokens after a P-token
/// context: llama.cpp's generation test at depth P (at depth 0 it would attend over P fewer keys each step).
fn against_llama_cpp(
    model: &CausalLm,
    (llama_bench, gguf): (&std::path::Path, &std::path::Path),
    (prompt_tokens, n, rounds): (usize, usize, usize),
    device: &burn::tensor::Device,
    description: &str,
) -> Result<()> {
    let prompt = reference_prompt(model, prompt_tokens);
    let threads = rayon::current_num_threads().to_string();
    println!(
        "bench decode: {} on {description} against llama-bench -t {threads}, {prompt_tokens}-token prompt + {n} new tokens",
        gguf.display()
    );
    greedy_timed(model, KvKind::for_model(model.config()), &prompt, n.clamp(2, 4), device);
    let (mut ember, mut llama) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let (ttft, decode) = greedy_timed(model, KvKind::for_model(model.config()), &prompt, n, device);
        println!("ember:       prompt {:.1} tokens/s, decode {decode:.2} tokens/s", prompt_tokens as f64 / ttft);
        ember.push((prompt_tokens as f64 / ttft, decode));
        let out = std::process::Command::new(llama_bench)
            .arg("-m")
            .arg(gguf)
            .args(["-p", &prompt_tokens.to_string(), "-n", &n.to_string(), "-d", &format!("0,{prompt_tokens}")])
            .args(["-t", &threads, "-r", "1", "-o", "csv"])
            .output()
            .with_context(|| format!("running {}", llama_bench.display()))?;
        let (pp, tg) = llama_bench_rates(&String::from_utf8_lossy(&out.stdout), prompt_tokens).with_context(|| {
            format!("llama-bench failed: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default())
        })?;
        println!("llama.cpp:   prompt {pp:.1} tokens/s, decode {tg:.2} tokens/s");
        llama.push((pp, tg));
    }
    let med = |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| median(&mut xs.iter().map(f).collect::<Vec<_>>());
    let (e_pp, e_tg, l_pp, l_tg) =
        (med(&ember, |x| x.0), med(&ember, |x| x.1), med(&llama, |x| x.0), med(&llama, |x| x.1));
    println!("\n| | prompt tokens/s | decode tokens/s |");
    println!("|---|---|---|");
    println!("| Ember | {e_pp:.1} | {e_tg:.2} |");
    println!("| llama.cpp | {l_pp:.1} | {l_tg:.2} |");
    println!("| Ember / llama.cpp | {:.2}× | {:.2}× |", e_pp / l_pp, e_tg / l_tg);
    print_memory();
    Ok(())
}

/// (prompt tokens/s, decode tokens/s) from `llama-bench -o csv`: the `avg_ts` of its prompt row at depth 0 (n_gen 0)
/// and of its generation row (n_prompt 0) at depth `depth`.
fn llama_bench_rates(csv: &str, depth: usize) -> Option<(f64, f64)> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next()?.split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name);
    let (n_prompt, n_gen, n_depth, avg) =
        (column("n_prompt")?, column("n_gen")?, column("n_depth")?, column("avg_ts")?);
    let depth = depth.to_string();
    let (mut pp, mut tg) = (None, None);
    for line in lines {
        let fields: Vec<&str> = line.split(',').map(|f| f.trim_matches('"')).collect();
        let rate = fields.get(avg)?.parse::<f64>().ok();
        match (*fields.get(n_prompt)?, *fields.get(n_gen)?, *fields.get(n_depth)?) {
            ("0", _, d) if d == depth => tg = rate,
            (_, "0", "0") => pp = rate,
            _ => {}
        }
    }
    Some((pp?, tg?))
}

/// Ember's resident memory (the reference runs in its own process): the weights as loaded plus the runs' KV stores.
fn print_memory() {
    let memory = Memory::now();
    println!("\nember resident memory: {:.0} MiB now, {:.0} MiB at the peak", memory.resident_mib, memory.peak_mib);
}

/// `n` greedy steps after the prompt: seconds to the first new token (the prompt's pass and one sample), and
/// tokens/s of the other n − 1.
pub(super) fn greedy_timed(
    model: &CausalLm,
    kv: KvKind,
    prompt: &[u32],
    n: usize,
    device: &burn::tensor::Device,
) -> (f64, f64) {
    let mut decoder = Decoder::new(model, kv, device);
    let mut ids = prompt.to_vec();
    let mut seen = 0;
    let started = Instant::now();
    let mut ttft = 0.0;
    for step in 0..n {
        let logits = decoder.next_logits(&ids, seen);
        seen = ids.len();
        ids.push(argmax(&logits));
        if step == 0 {
            ttft = started.elapsed().as_secs_f64();
        }
    }
    (ttft, (n - 1) as f64 / (started.elapsed().as_secs_f64() - ttft))
}

#[cfg(test)]
mod tests {
    use super::llama_bench_rates;

    #[test]
    fn llama_bench_csv_gives_prompt_and_decode_rates() {
        let csv = "model_type,n_prompt,n_gen,n_depth,avg_ns,avg_ts,stddev_ts\n\
                   \"llama 256M Q4_1\",\"128\",\"0\",\"0\",\"1\",\"359.32\",\"1.76\"\n\
                   \"llama 256M Q4_1\",\"0\",\"128\",\"0\",\"1\",\"157.56\",\"1.61\"\n\
                   \"llama 256M Q4_1\",\"128\",\"0\",\"128\",\"1\",\"301.10\",\"2.02\"\n\
                   \"llama 256M Q4_1\",\"0\",\"128\",\"128\",\"1\",\"134.89\",\"8.14\"\n";
        assert_eq!(llama_bench_rates(csv, 128), Some((359.32, 134.89)));
        assert_eq!(llama_bench_rates(csv, 0), Some((359.32, 157.56)));
        assert_eq!(llama_bench_rates(csv, 64), None);
        assert_eq!(llama_bench_rates("model_type,n_prompt\n", 128), None);
    }
}
