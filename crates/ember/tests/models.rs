//! Every architecture variant trains with `ember train` and samples with `ember generate`; real checkpoints import,
//! generate and inspect through the CLI.

mod common;

use common::{assert_clean_error, ember, gemma3, small_corpus, smollm2, step_losses, tiny_config, train_ok};

const VARIANTS: &[(&str, &[&str])] = &[
    (
        "llama: RMSNorm, SwiGLU, RoPE, MQA, untied, no biases",
        &["norm=rmsnorm", "ffn=swiglu", "positions=rope", "n_kv_heads=1", "bias=false", "tie_embeddings=false"],
    ),
    ("mla", &["norm=rmsnorm", "positions=rope", "attention=mla", "mla_latent_dim=8", "mla_rope_dim=4"]),
    ("post-LN, sinusoidal, ReLU", &["norm_placement=post", "positions=sinusoidal", "ffn=relu"]),
    (
        "peri-LN, sliding window, no positions, GELU-tanh",
        &["norm_placement=peri", "window=8", "positions=none", "ffn=gelu_tanh"],
    ),
    ("linear attention (elu + 1), RoPE, GQA", &["attention_kernel=linear", "positions=rope", "n_kv_heads=1"]),
    ("FAVOR+ attention, 16 random features", &["attention_kernel=favor", "favor_features=16"]),
    (
        "gemma 3: sandwich norms, q/k norms, GeGLU, √d embeddings, local/global layers",
        &[
            "norm=rmsnorm",
            "norm_placement=sandwich",
            "qk_norm=true",
            "ffn=geglu",
            "embedding_scale=true",
            "positions=rope",
            "n_kv_heads=1",
            "window=8",
            "global_every=2",
            "rope_local_theta=100.0",
            "bias=false",
        ],
    ),
];

#[test]
fn every_variant_trains_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = small_corpus(dir.path(), 20_000);
    for (i, (name, sets)) in VARIANTS.iter().enumerate() {
        let run = dir.path().join(format!("run{i}"));
        let config = tiny_config(dir.path(), &corpus, &run, "");
        let mut args = vec!["--device".to_string(), "cpu".into(), "--config".into(), config.display().to_string()];
        for s in ["train.max_steps=6", "train.eval_interval=6"].iter().copied().chain(sets.iter().map(|s| s.to_owned()))
        {
            let s = if s.starts_with("train.") { s.to_string() } else { format!("model.{s}") };
            args.extend(["--set".to_string(), s]);
        }
        train_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let losses = step_losses(&run);
        assert!(losses.len() == 6 && losses.iter().all(|(_, l)| l.is_finite()), "{name}: {losses:?}");
        let run = run.display().to_string();
        for device in ["cpu", "ndarray"] {
            let args = ["generate", "--device", device, "--model", &run, "--prompt", "To be", "--max-new-tokens", "8"];
            let out = ember(&args);
            assert!(out.status.success(), "{name} on {device}: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8(out.stdout).unwrap();
            assert!(text.starts_with("To be") && text.trim_end().chars().count() > "To be".len(), "{name}: {text:?}");
        }
    }
}

/// Gemma 3 270M (gemma3 architecture, SentencePiece tokenizer, K-quants) continues the README's three prompts with
/// the 16 greedy tokens transformers gives on the same file dequantized (crates/core-model/tests/fixtures/gemma3.json,
/// from scripts/reference/gemma3_fixture.py); with the file's blocks as they are it starts as transformers does.
#[test]
#[ignore = "needs the Gemma 3 GGUF: scripts/prepare-data.sh gemma3 (scripts/test.sh runs it)"]
fn gemma3_gguf_continues_as_transformers() {
    let gguf = gemma3().display().to_string();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../core-model/tests/fixtures/gemma3.json");
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let generate = |prompt: &str, weights: &str| {
        let args = ["--prompt", prompt, "--temperature", "0", "--max-new-tokens", "16", "--weights", weights];
        let out = ember(&[&["generate", "--device", "cpu", "--model", &gguf], &args[..]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    for record in fixture["records"].as_array().unwrap() {
        let prompt = record["prompt"].as_str().unwrap();
        let expected = format!("{prompt}{}\n", record["greedy_text"].as_str().unwrap());
        assert_eq!(generate(prompt, "f32"), expected);
        let native = generate(prompt, "native");
        let first_words: String = expected.chars().take(prompt.len() + 12).collect();
        assert!(native.starts_with(&first_words), "{native:?} against transformers' {expected:?}");
    }
}

#[test]
#[ignore = "needs the SmolLM2 GGUF: scripts/prepare-data.sh smollm2 (scripts/test.sh runs it)"]
fn smollm2_gguf_says_paris_and_imports_into_a_run_directory() {
    let gguf = smollm2().display().to_string();
    let greedy = ["--prompt", "The capital of France is", "--temperature", "0", "--max-new-tokens", "8"];
    let generate = |model: &str, more: &[&str]| {
        let out = ember(&[&["generate", "--device", "cpu", "--model", model], &greedy[..], more].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // The file's Q4_1 blocks as they are (the default), and dequantized to f32.
    let text = generate(&gguf, &[]);
    assert!(text.starts_with("The capital of France is Paris."), "{text:?}");
    assert_eq!(generate(&gguf, &["--kv-cache", "none"]), text, "cached and uncached greedy text are identical");
    let f32 = generate(&gguf, &["--weights", "f32"]);
    assert!(f32.starts_with("The capital of France is Paris."), "{f32:?}");
    // Hugging Face continues " Paris.\n\nThe answer is: …"; a stop string ends the text before it.
    let stop = ["--max-new-tokens", "16", "--stop", "answer", "--weights", "f32"];
    let out = ember(&[&["generate", "--device", "cpu", "--model", &gguf], &greedy[..4], &stop[..]].concat());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "The capital of France is Paris.\n\nThe \n");

    // `import` writes f32 weights; `import --quantize q8_0` writes Q8_0 blocks, a quarter of the bytes, which
    // generate as the file's weights converted to Q8_0 at load do.
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("smollm2").display().to_string();
    let out = ember(&["import", &gguf, "--out", &run]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(generate(&run, &[]), f32, "the imported run directory generates the same");
    assert_clean_error(&ember(&["import", &gguf, "--out", &run]), "already holds a model");
    let quantized = dir.path().join("smollm2-q8_0").display().to_string();
    let out = ember(&["import", &gguf, "--out", &quantized, "--quantize", "q8_0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = |dir: &str| std::fs::metadata(std::path::Path::new(dir).join("model.safetensors")).unwrap().len();
    assert!(bytes(&quantized) * 3 < bytes(&run), "Q8_0 {} bytes against f32 {}", bytes(&quantized), bytes(&run));
    let q8 = generate(&quantized, &[]);
    assert!(q8.starts_with("The capital of France is Paris."), "{q8:?}");
    assert_eq!(generate(&gguf, &["--weights", "q8_0"]), q8);
    let out = ember(&["import", &gguf, "--out", "/tmp/never", "--quantize", "q4_k"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("unknown weight format \"q4_k\""), "{stderr}");

    let out = ember(&["inspect", "--model", &run]);
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(report.contains("30 layers, d 576, 9 heads of 64 (GQA g 3)"), "{report}");
}

#[test]
fn inspect_reproduces_the_llama2_7b_kv_cache_table() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/llama2-7b.toml");
    let out = ember(&["inspect", "--config", config, "--length", "8192", "--bytes", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(report.contains("the same model as MHA 4.00 GiB, GQA g = 8 1.00 GiB, MQA 128.00 MiB"), "{report}");
    for preset in ["llama3-70b", "gemma3-27b", "deepseek-v2", "gpt2-124m", "llama-tiny", "mla-tiny"] {
        let path = format!("{}/../../configs/{preset}.toml", env!("CARGO_MANIFEST_DIR"));
        let out = ember(&["inspect", "--config", &path]);
        assert!(out.status.success(), "{preset}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let deepseek = format!("{}/../../configs/deepseek-v2.toml", env!("CARGO_MANIFEST_DIR"));
    let report = String::from_utf8(ember(&["inspect", "--config", &deepseek]).stdout).unwrap();
    assert!(report.contains("d_c + d_R = 576 elements"), "{report}");
}

/// The published parameter counts of Qwen2.5 7B, Qwen3 8B, Mistral 7B, Llama 3.1 8B, Phi-3 mini and Gemma 2 2B,
/// from their shapes.
#[test]
fn inspect_counts_the_published_parameters_of_qwen_mistral_phi3_llama_3_1_and_gemma_2() {
    for (preset, total) in [
        ("qwen2.5-7b", "7,615,616,512"),
        ("qwen3-8b", "8,190,735,360"),
        ("mistral-7b", "7,241,732,096"),
        ("llama3.1-8b", "8,030,261,248"),
        ("phi3-mini", "3,821,079,552"),
        ("gemma2-2b", "2,614,341,888"),
    ] {
        let path = format!("{}/../../configs/{preset}.toml", env!("CARGO_MANIFEST_DIR"));
        let out = ember(&["inspect", "--config", &path]);
        assert!(out.status.success(), "{preset}: {}", String::from_utf8_lossy(&out.stderr));
        let report = String::from_utf8(out.stdout).unwrap();
        let line = report.lines().find(|l| l.trim_start().starts_with("total")).unwrap_or_default();
        assert!(line.ends_with(total), "{preset}: {line:?}");
    }
}

#[test]
fn a_model_path_that_is_nothing_is_a_clear_error() {
    let out = ember(&["generate", "--device", "cpu", "--model", "/nonexistent/x.gguf", "--prompt", "a"]);
    assert_clean_error(&out, "/nonexistent/x.gguf: no such file or directory");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"not a gguf file at all").unwrap();
    assert_clean_error(
        &ember(&["generate", "--device", "cpu", "--model", bad.to_str().unwrap(), "--prompt", "a"]),
        "not a GGUF file",
    );
}

/// `ember bench kernel` runs a trained softmax model with FAVOR+ and with sampled keys in place of softmax: a row per
/// r and per s, each with an output error between 0 and 1 and a loss near the exact model's, and the SVG of both.
#[test]
fn bench_kernel_runs_a_softmax_model_with_favor_features_and_sampled_keys() {
    let dir = tempfile::tempdir().unwrap();
    let run = common::tiny_run(dir.path(), 10);
    let (text, svg) = (dir.path().join("corpus.txt"), dir.path().join("kernel.svg"));
    let args =
        ["--device", "cpu", "bench", "kernel", "--model", run.to_str().unwrap(), "--text", text.to_str().unwrap()];
    let options = ["--tokens", "200", "--features", "4,32", "--keys", "2,8", "--draws", "2", "--svg"];
    let out = ember(&[&args[..], &options, &[svg.to_str().unwrap()]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let exact: f64 =
        stdout.lines().find_map(|l| l.strip_prefix("exact softmax: ")?.split(' ').next()?.parse().ok()).unwrap();
    let column = |line: &str, n: usize| -> f64 {
        line.split('|').nth(n).unwrap().split_whitespace().next().unwrap().parse().unwrap()
    };
    let rows: Vec<(f64, f64)> = stdout
        .lines()
        .filter(|l| ["| 4 |", "| 32 |", "| 2 |", "| 8 |"].iter().any(|p| l.starts_with(p)))
        .map(|l| (column(l, 2), column(l, 4)))
        .collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    // Ten steps leave attention nearly uniform, so the approximations land close to the exact loss.
    assert!(rows.iter().all(|&(error, loss)| (0.0..1.0).contains(&error) && (loss - exact).abs() < 0.5), "{stdout}");
    let svg = std::fs::read_to_string(svg).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 6);
}

/// `ember convert --to mla` at full rank keeps a trained GPT's loss (no RoPE: the factorisation is exact), at a lower
/// rank caches fewer bytes per token, refuses a latent past the rank, and `ember train --resume` fine-tunes the
/// converted run from step 0 with its run config and token splits.
#[test]
fn convert_to_mla_keeps_the_loss_at_full_rank_and_fine_tunes_with_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = common::tiny_run(dir.path(), 30);
    let text = dir.path().join("corpus.txt");
    let loss = |model: &std::path::Path| -> f64 {
        let args = ["--device", "cpu", "eval", "perplexity", "--model", model.to_str().unwrap()];
        let out = ember(&[&args[..], &["--text", text.to_str().unwrap(), "--tokens", "500"]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        stdout
            .split("loss ")
            .nth(1)
            .and_then(|s| s.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{stdout}"))
    };
    let convert = |latent: &str, out: &std::path::Path| {
        ember(&[
            "convert",
            "--to",
            "mla",
            "--latent-dim",
            latent,
            run.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let (full, low) = (dir.path().join("mla-full"), dir.path().join("mla-8"));
    // d = 32 with biases: [W_K | W_V; b_K | b_V] has rank 33.
    let out = convert("33", &full);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // 2 layers × (d_L 33 + d_R 2) floats against 2 layers × 2·32.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("KV cache 512 → 280 bytes per token"), "{stdout}");
    let original = loss(&run);
    assert!((loss(&full) - original).abs() < 1e-4, "full rank: {} vs {original}", loss(&full));
    assert_clean_error(&convert("34", &dir.path().join("too-wide")), "at most 33");
    // --config must be a run config: without [data] and [train] the converted run could not be fine-tuned.
    let model_only = dir.path().join("model-only.toml");
    std::fs::write(&model_only, "[model]\nn_layers = 2\n").unwrap();
    let bare = dir.path().join("bare");
    let args = ["convert", "--to", "mla", "--latent-dim", "8", run.to_str().unwrap(), "--config"];
    let out = ember(&[&args[..], &[model_only.to_str().unwrap(), "--out", bare.to_str().unwrap()]].concat());
    assert_clean_error(&out, "model-only.toml: no [data] table: --config takes a run config");
    assert!(!bare.exists(), "nothing is written");
    assert!(convert("8", &low).status.success());
    // A resumed run trains on the tokens stored with it: a data override would be silently ignored.
    let data =
        ember(&["train", "--device", "cpu", "--resume", low.to_str().unwrap(), "--set", "data.val_fraction=0.5"]);
    assert_clean_error(&data, "--set data.val_fraction=0.5: a resumed run keeps the data it was trained on");
    train_ok(&["--device", "cpu", "--resume", low.to_str().unwrap(), "--set", "train.max_steps=5"]);
    assert!(loss(&low).is_finite());
    let metrics = std::fs::read_to_string(low.join("metrics.jsonl")).unwrap();
    assert!(metrics.lines().count() >= 5, "five fine-tuning steps logged");
}

/// `ember bench context` times softmax and linear attention at each T (a row each, every time positive) and plots
/// both; `ember bench convert` reports the full-rank conversion of a GPT without a loss change.
#[test]
fn bench_context_and_bench_convert_report_a_row_per_length_and_width() {
    let dir = tempfile::tempdir().unwrap();
    let run = common::tiny_run(dir.path(), 10);
    let svg = dir.path().join("context.svg");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, ember_test_support::model_table(2, 2, 32, 32)).unwrap();
    let out = ember(&[
        "--device",
        "cpu",
        "bench",
        "context",
        "--config",
        config.to_str().unwrap(),
        "--lengths",
        "16,80",
        "--rounds",
        "1",
        "--decode-tokens",
        "3",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| 16 |") || l.starts_with("| 80 |")).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(rows.iter().all(|r| r.matches(" ms |").count() + r.matches(" s |").count() == 4), "{stdout}");
    assert_eq!(std::fs::read_to_string(&svg).unwrap().matches("<polyline").count(), 4);

    let text = dir.path().join("corpus.txt");
    let args =
        ["--device", "cpu", "bench", "convert", "--model", run.to_str().unwrap(), "--text", text.to_str().unwrap()];
    let out = ember(&[&args[..], &["--tokens", "300", "--latent-dims", "0,8"]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let full = stdout.lines().find(|l| l.starts_with("| MLA d_L = 33 | 280 |")).unwrap_or_else(|| panic!("{stdout}"));
    let change: f64 = full.split('|').nth(4).unwrap().trim().parse().unwrap();
    assert!(change.abs() < 1e-3, "{stdout}");
    assert!(stdout.contains("| MLA d_L = 8 | 80 |"), "{stdout}");
}
