//! Bad input: each gives a one-line error naming the problem and a non-zero exit, never a panic.

mod common;

use common::*;
use std::process::Command;

#[test]
fn missing_config() {
    let out = ember(&["train", "--device", "cpu", "--config", "/nonexistent/run.toml"]);
    assert_clean_error(&out, "/nonexistent/run.toml");
}

#[test]
fn unknown_key() {
    let tiny = Tiny::new(20_000, "learning_speed = 3\n");
    assert_clean_error(&tiny.train(&[]), "unknown field `learning_speed`");
}

#[test]
fn invalid_value() {
    let tiny = Tiny::new(20_000, "");
    assert_clean_error(
        &tiny.train(&["--set", "model.n_heads=3"]),
        "model.d_model = 32: must be a multiple of model.n_heads = 3",
    );
    for (set, error) in [
        ("model.dtype=f8", "unknown variant `f8`, expected `f32` or `f16`"),
        ("train.loss_scale=0.5", "train.loss_scale = 0.5: a finite number ≥ 1"),
        ("train.loss_scale_growth_interval=0", "train.loss_scale_growth_interval = 0: at least 1"),
    ] {
        assert_clean_error(&tiny.train(&["--set", set]), error);
    }
}

/// f16 asked of the CPU: a note, and the run trains in f32.
#[test]
fn f16_training_on_the_cpu_says_so_and_runs_f32() {
    let tiny = Tiny::new(20_000, "");
    let out = train_ok(&[
        "--device",
        "cpu",
        "--config",
        tiny.config(),
        "--set",
        "model.dtype=f16",
        "--set",
        "train.max_steps=2",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("note: f16 runs on wgpu adapters with SHADER_F16; the CPU runs in f32"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("parameters in f32 on cpu"));
}

/// `ember train` of the tiny config on a corpus `name` holding `contents` (none: the file is missing).
fn train_on_corpus(name: &str, contents: Option<&[u8]>) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join(name);
    if let Some(bytes) = contents {
        std::fs::write(&corpus, bytes).unwrap();
    }
    let config = tiny_config(dir.path(), &corpus, &dir.path().join("run"), "");
    ember(&["train", "--device", "cpu", "--config", config.to_str().unwrap()])
}

#[test]
fn missing_corpus() {
    assert_clean_error(&train_on_corpus("absent.txt", None), "absent.txt does not exist");
}

#[test]
fn empty_corpus() {
    assert_clean_error(&train_on_corpus("empty.txt", Some(b"")), "empty.txt is empty");
}

#[test]
fn non_utf8_corpus() {
    let latin1 = b"To be, or not to be: caf\xe9\n".repeat(100);
    assert_clean_error(&train_on_corpus("latin1.txt", Some(&latin1)), "is not UTF-8 text (invalid byte at offset 24)");
}

#[test]
fn resume_without_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = ember(&["train", "--device", "cpu", "--resume", dir.path().to_str().unwrap()]);
    assert_clean_error(&out, "has no checkpoint or weights to resume from");
}

#[test]
fn corrupt_checkpoint() {
    let tiny = Tiny::new(50_000, "");
    let run = &tiny.run;
    train_ok(&["--device", "cpu", "--config", tiny.config(), "--set", "train.max_steps=2"]);
    let ckpt = run.join("checkpoint.safetensors");
    let bytes = std::fs::read(&ckpt).unwrap();
    std::fs::write(&ckpt, &bytes[..bytes.len() / 2]).unwrap();
    let out = ember(&["train", "--device", "cpu", "--resume", run.to_str().unwrap(), "--set", "train.max_steps=4"]);
    assert_clean_error(&out, "checkpoint.safetensors: not a valid safetensors file");
    std::fs::write(run.join("model.safetensors"), b"garbage").unwrap();
    let out = ember(&["generate", "--device", "cpu", "--model", run.to_str().unwrap(), "--max-new-tokens", "3"]);
    assert_clean_error(&out, "model.safetensors: not a valid safetensors file");
}

/// A new run does not replace a checkpoint; a prompt, a checkpoint of another shape and a tokenizer that does not fit
/// the model are each named.
#[test]
fn fresh_run_refuses_to_overwrite_a_checkpoint_and_prompt_outside_vocabulary_is_named() {
    let tiny = Tiny::new(50_000, "");
    let run = &tiny.run;
    let args = ["train", "--device", "cpu", "--no-sample", "--config", tiny.config(), "--set", "train.max_steps=1"];
    assert!(ember(&args).status.success());
    let before = std::fs::read(run.join("checkpoint.safetensors")).unwrap();
    assert_clean_error(&ember(&args), "already holds a checkpoint");
    assert_eq!(std::fs::read(run.join("checkpoint.safetensors")).unwrap(), before, "saved work is untouched");
    // A checkpoint of another shape is named once, not once more as the error's cause.
    let resume = ["train", "--device", "cpu", "--resume", run.to_str().unwrap(), "--set", "model.n_layers=3"];
    let out = ember(&resume);
    assert_clean_error(&out, "checkpoint does not fit the configured model");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let detail = stderr.split("configured model: ").nth(1).unwrap_or_default().trim();
    assert_eq!(stderr.matches(detail).count(), 1, "{stderr}");
    let out = generate_on_cpu(run, &["--prompt", "€", "--max-new-tokens", "3"]);
    assert_clean_error(&out, "prompt");
    // A tokenizer with an id past the model's vocabulary (an embedding lookup out of bounds) is refused on load.
    let path = run.join("tokenizer.json");
    let mut tokenizer: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    tokenizer["model"]["vocab"]["e"] = 5000.into();
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    let corpus = tiny.dir.path().join("corpus.txt");
    let eval = ["--device", "cpu", "eval", "perplexity", "--model", run.to_str().unwrap(), "--text"];
    let out = ember(&[&eval[..], &[corpus.to_str().unwrap()]].concat());
    assert_clean_error(&out, "token \"e\" has id 5000, past the model's vocabulary of");
}

/// A directory that holds someone's model (a run directory's weights, a Hugging Face or PyTorch directory, a GGUF
/// file, a tokenizer alone) but no checkpoint is not silently overwritten by a new run; `--force` overwrites it on
/// purpose.
#[test]
fn fresh_run_refuses_a_directory_holding_a_model_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 50_000);
    for file in ["model.safetensors", "config.json", "pytorch_model.bin", "llama.gguf", "tokenizer.json"] {
        let run = dir.path().join(format!("holds-{file}"));
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(run.join("tokenizer.json"), b"someone's tokenizer").unwrap();
        std::fs::write(run.join(file), b"someone's model").unwrap();
        let config = tiny_config(dir.path(), &corpus, &run, "");
        let args = ["train", "--device", "cpu", "--no-sample", "--config", config.to_str().unwrap()];
        let args = [&args[..], &["--set", "train.max_steps=1"]].concat();
        assert_clean_error(&ember(&args), &format!("already holds a model ({file})"));
        assert_eq!(std::fs::read(run.join(file)).unwrap(), b"someone's model", "{file} is untouched");
        if file != "tokenizer.json" {
            assert_eq!(std::fs::read(run.join("tokenizer.json")).unwrap(), b"someone's tokenizer");
        }
        let forced = ember(&[&args[..], &["--force"]].concat());
        assert!(forced.status.success(), "--force overwrites: {}", String::from_utf8_lossy(&forced.stderr));
    }
}

/// A second trainer on a run directory that a first one holds fails at once, before writing anything there.
#[test]
fn a_second_trainer_on_a_locked_run_directory_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 50_000);
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let held = std::fs::File::create(run.join(".lock")).unwrap();
    held.try_lock().expect("the test takes the lock first");
    let config = tiny_config(dir.path(), &corpus, &run, "");
    let args = ["train", "--device", "cpu", "--no-sample", "--config", config.to_str().unwrap()];
    assert_clean_error(&ember(&args), "in use by another trainer");
    assert!(!run.join("config.toml").exists(), "nothing written while the directory is held");
    drop(held);
    let args = [&args[..], &["--set", "train.max_steps=1"]].concat();
    assert!(ember(&args).status.success(), "the released directory trains");
}

/// The sample printed after training is checked before the first step: an unencodable or over-long prompt fails at
/// once, naming the character or the lengths, and nothing is trained.
#[test]
fn sample_prompt_is_checked_before_training() {
    let tiny = Tiny::new(50_000, "");
    let long = format!("\"{}\"", "e".repeat(40));
    for (prompt, needle) in
        [("\"€\"", "[sample] prompt: text cannot be encoded: the character '€' (U+20AC)"), (&long[..], "context of 32")]
    {
        let set = format!("sample.prompt={prompt}");
        assert_clean_error(&tiny.train(&["--set", &set]), needle);
        assert!(!tiny.run.join("model.safetensors").exists(), "nothing trained");
    }
}

#[test]
fn bleu_of_files_that_are_not_line_aligned_or_not_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let (hyp, reference, binary) = (dir.path().join("hyp"), dir.path().join("ref"), dir.path().join("bin"));
    std::fs::write(&hyp, "a b c d e\nf g h i\n").unwrap();
    std::fs::write(&reference, "a b c\n").unwrap();
    std::fs::write(&binary, [0xff, 0xfe, b'\n']).unwrap();
    let bleu = |h: &std::path::Path, r: &std::path::Path| {
        ember(&["eval", "bleu", "--hyp", h.to_str().unwrap(), "--ref", r.to_str().unwrap()])
    };
    assert_clean_error(&bleu(&hyp, &reference), "line-aligned");
    assert_clean_error(&bleu(&binary, &reference), "not UTF-8");
    let same = bleu(&hyp, &hyp);
    assert!(String::from_utf8_lossy(&same.stdout).starts_with("BLEU = 100.00"), "{same:?}");
}

/// KV-cache sizes from command-line counts of any size are computed without overflow.
#[test]
fn inspect_with_the_largest_batch_does_not_overflow() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/gpt2-124m.toml");
    let out = ember(&["inspect", "--config", config.to_str().unwrap(), "--batch", &usize::MAX.to_string()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(" × 1024 tokens 603979776.00 EiB"), "{stdout}");
}

/// A page larger than the model's context is refused (it used to be allocated whole: 8 GB for five tokens).
#[test]
fn a_page_larger_than_the_context_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = tiny_run(dir.path(), 2);
    let out = generate_on_cpu(&run, &["--prompt", "A", "--kv-cache", "paged", "--page-size", "1000000"]);
    assert_clean_error(&out, "--page-size 1000000 is larger than the model's context of 32 tokens");
}

/// A model or batch too large for the machine is refused before anything is allocated, naming what it would need
/// (it used to abort on a failed allocation, or allocate for a minute first).
#[test]
fn a_model_or_batch_too_large_for_the_machine_is_refused_before_allocating() {
    let tiny = Tiny::new(20_000, "");
    for set in ["model.d_model=1048576", "model.vocab_size=1000000000", "train.batch_size=1000000000000"] {
        let out = tiny.train(&["--no-sample", "--set", set]);
        assert_clean_error(&out, "GiB, more than the");
        assert!(String::from_utf8_lossy(&out.stderr).contains("needs at least"), "{set}");
    }
}

/// A config, tokenizer or model path that leads to a device (here a symlink to /dev/zero) is refused at once, not
/// read until memory runs out or forever.
#[test]
fn paths_to_devices_are_refused_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let zero = dir.path().join("config.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    assert_clean_error(&ember(&["train", "--config", zero.to_str().unwrap()]), "not a regular file");

    let run = tiny_run(dir.path(), 1);
    std::fs::remove_file(run.join("tokenizer.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", run.join("tokenizer.json")).unwrap();
    assert_clean_error(&generate_on_cpu(&run, &["--prompt", "A"]), "not a regular file");
}

/// `ember serve` names a bad limit, origin or model in one line and exits non-zero (it listens before loading, so a
/// model that does not load still ends the process).
#[test]
fn serve_names_bad_limits_origins_and_models() {
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--device", "cpu", "--port", "0", "--model", "/nonexistent/model.gguf"];
        args.extend_from_slice(extra);
        ember(&args)
    };
    assert_clean_error(&serve(&["--request-timeout", "0"]), "--request-timeout must be a positive number of seconds");
    assert_clean_error(&serve(&["--header-timeout", "nan"]), "--header-timeout must be a positive number of seconds");
    assert_clean_error(&serve(&["--cors-origin", "http://a.example\u{1}"]), "is not a valid origin");
    assert_clean_error(&serve(&[]), "/nonexistent/model.gguf");
}

/// Values that used to be accepted and then panicked, aborted, ran something else or trained into the wrong place: a
/// bench of zero rounds or a zero-dimensional sketch, a beam of 0 or 10⁹, a length penalty of NaN, an infinite RoPE
/// base, an empty run directory, attention benches of zero or impossible sizes, 10¹² FAVOR+ features.
/// A CPU kernel level the kernels do not have is refused at start; a known one lower than the CPU's runs, and
/// the command names the level it ran at.
#[test]
fn an_unknown_cpu_level_is_refused_and_a_lower_one_runs() {
    let tiny = Tiny::new(20_000, "");
    let bench = |level: &str| {
        Command::new(env!("CARGO_BIN_EXE_ember"))
            .env("EMBER_CPU_LEVEL", level)
            .args(["--device", "cpu", "bench", "train", "--config", tiny.config(), "--steps", "1", "--warmup", "0"])
            .args(["--rounds", "1"])
            .output()
            .unwrap()
    };
    let bad = bench("avx3");
    assert_clean_error(&bad, "EMBER_CPU_LEVEL=\"avx3\": the CPU kernel level is one of portable, avx2, avx512");
    let portable = bench("portable");
    assert!(portable.status.success(), "{}", String::from_utf8_lossy(&portable.stderr));
    assert!(String::from_utf8_lossy(&portable.stdout).contains("CPU kernels portable"));
}

#[test]
fn zero_counts_non_finite_numbers_and_an_empty_out_dir_are_refused() {
    let tiny = Tiny::new(20_000, "");
    let config = tiny.config();
    let missing = tiny.dir.path().join("absent").to_str().unwrap().to_string();
    // A (sparse) file of 1 TiB: loading it is refused by its size before a byte is read.
    let huge = tiny.dir.path().join("huge.gguf");
    std::fs::File::create(&huge).unwrap().set_len(1 << 40).unwrap();
    let huge = huge.to_str().unwrap();
    for (args, needle) in [
        (vec!["generate", "--model", huge], "huge.gguf needs at least 1024.0 GiB"),
        (vec!["import", huge, "--out", &missing], "huge.gguf needs at least 1024.0 GiB"),
        (
            vec!["convert", "--to", "mla", huge, "--out", &missing, "--latent-dim", "8"],
            "huge.gguf needs at least 1024.0 GiB",
        ),
        (vec!["eval", "perplexity", "--model", huge, "--text", &missing], "huge.gguf needs at least 1024.0 GiB"),
        (vec!["bench", "kv", "--model", huge, "--text", &missing], "huge.gguf needs at least 1024.0 GiB"),
        (vec!["bench", "weights", "--model", huge, "--text", &missing], "huge.gguf needs at least 1024.0 GiB"),
        (vec!["bench", "kernel", "--model", huge, "--text", &missing], "huge.gguf needs at least 1024.0 GiB"),
        (vec!["bench", "convert", "--model", huge, "--text", &missing], "huge.gguf needs at least 1024.0 GiB"),
        (vec!["bench", "train", "--config", config, "--rounds", "0"], "--rounds and --steps must be at least 1"),
        (
            vec!["bench", "kernel", "--model", &missing, "--text", &missing, "--sketch", "0"],
            "--sketch must be at least 1",
        ),
        (vec!["eval", "--model", &missing, "--data", &missing, "--beam", "0"], "--beam must be from 1 to 1024, not 0"),
        (vec!["translate", "--model", &missing, "--beam", "1000000000"], "--beam must be from 1 to 1024"),
        (vec!["translate", "--model", &missing, "--lenpen", "NaN"], "--lenpen must be a finite number, not NaN"),
        (vec!["train", "--config", config, "--set", "model.rope_theta=inf"], "model.rope_theta = inf: a finite number"),
        (vec!["train", "--config", config, "--set", "train.out_dir=\"\""], "train.out_dir = \"\": a directory"),
        (vec!["train", "--config", config, "--set", "model.d_model=1000000000"], "model.d_model = 1000000000: at most"),
        (vec!["bench", "train", "--config", config, "--set", "model.d_model=1000000000"], "model.d_model = 1000000000"),
        (
            vec!["bench", "decode", "--config", concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/llama3-70b.toml")],
            "parameters) with 1 KV store(s) of its",
        ),
        (vec!["bench", "attention", "--lengths", "0"], "--lengths, --head-dims, --heads, --batch, --iters and --calls"),
        (vec!["bench", "attention", "--heads", "0"], "must be at least 1"),
        (vec!["bench", "attention", "--lengths", "100000000000"], "attention at T = 100000000000, d = 64 needs"),
        (
            vec!["bench", "kernel", "--model", &missing, "--text", &missing, "--features", "1000000000000"],
            "--features and --keys take at most 1048576",
        ),
    ] {
        assert_clean_error(&ember(&[&["--device", "cpu"], &args[..]].concat()), needle);
    }
    assert!(!tiny.dir.path().join("config.toml").exists() && !std::path::Path::new("config.toml").exists());
    // Sizes past 2^64 bytes are an answer of inspect's, not an overflow.
    let max = u64::MAX.to_string();
    let out = ember(&["inspect", "--config", config, "--length", &max, "--batch", &max, "--bytes", &max]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("more than 2^128 B"));
}
