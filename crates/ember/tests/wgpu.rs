//! The same models on wgpu (lavapipe without a GPU): logits equal the CPU's for every architecture, and training
//! lowers the loss; in f16, logits, SmolLM2's greedy text and training (the language model and the translator, loss
//! scaling included) stay within stated bounds of f32.
//! Under CI a missing adapter fails the test.

mod common;

use std::path::PathBuf;

use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};
use ember_core_model::config::{AttentionKernel, NormPlacement};
use ember_core_model::seq2seq::{Seq2Seq, Seq2SeqConfig};
use ember_core_model::{Build, CausalLm, ModelConfig, Rng};
use ember_serve::{KvKind, KvSpec};
use ember_test_support::{max_abs_diff, metric, values, wgpu_test_device};

/// The baby GPT and the other architectures: Llama-style (RMSNorm, SwiGLU, RoPE, GQA, untied), MLA with a sliding
/// window and Peri-LN, the 2017 layout (Post-LN, sinusoidal, ReLU), and linear (elu + 1, with RoPE and GQA) and
/// FAVOR+ attention.
/// A tiny GPT run on `bytes` of text in a fresh directory (its config file and run directory), where a wgpu
/// adapter exists.
fn tiny_run_with_wgpu(bytes: usize) -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
    wgpu_test_device()?;
    let dir = tempfile::tempdir().unwrap();
    let (config, run) = common::tiny_setup(dir.path(), bytes);
    Some((dir, config, run))
}

fn variants() -> Vec<ModelConfig> {
    let gpt = ModelConfig::gpt(71, 4, 4, 128, 64);
    let llama = ModelConfig { tie_embeddings: false, ..gpt.clone().llama_style(2) };
    let mla = ModelConfig { window: Some(16), norm_placement: NormPlacement::Peri, ..llama.clone().mla_style(32, 8) };
    let post = gpt.clone().paper_style();
    let linear = ModelConfig { attention_kernel: AttentionKernel::Linear, ..llama.clone() };
    let favor = ModelConfig { attention_kernel: AttentionKernel::Favor, favor_features: Some(64), ..gpt.clone() };
    vec![gpt, llama, mla, post, linear, favor]
}

#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn forward_logits_match_the_cpu_within_1e_4() {
    let Some(gpu) = wgpu_test_device() else { return };
    let cpu = Device::flex();
    for config in variants() {
        let on_cpu = CausalLm::new(&config, &mut Rng::new(11), &cpu);
        let on_gpu = CausalLm::new(&config, &mut Rng::new(11), &gpu);
        let mut rng = Rng::new(5);
        let ids: Vec<i64> = (0..3 * 64).map(|_| rng.below(71) as i64).collect();
        let x = |d: &Device| Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [3, 64]), d);
        let a = on_cpu.forward(x(&cpu)).into_data().try_to_vec::<f32>().unwrap();
        let b = on_gpu.forward(x(&gpu)).into_data().try_to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&a, &b);
        assert!(diff <= 1e-4, "max |cpu − wgpu| = {diff} for {config:?}");
        assert!(a.iter().any(|&z| z.abs() > 1e-3), "logits are not trivially zero");
    }
}

#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn twenty_training_steps_lower_the_loss() {
    let Some((_dir, config, run)) = tiny_run_with_wgpu(100_000) else { return };
    let out =
        common::train_ok(&["--device", "wgpu", "--config", config.to_str().unwrap(), "--set", "train.max_steps=20"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("on wgpu"), "{stdout}");
    let losses = common::step_losses(&run);
    assert_eq!(losses.len(), 20);
    let first: f64 = losses[..3].iter().map(|l| l.1).sum::<f64>() / 3.0;
    let last: f64 = losses[17..].iter().map(|l| l.1).sum::<f64>() / 3.0;
    assert!(last < first - 0.1, "loss {first:.3} -> {last:.3}");
}

/// Greedy decoding of 58 tokens after a 6-token prompt by a store on `gpu` and by `reference` on the CPU: the largest
/// logit difference.
fn decode_against(model: (&CausalLm, &CausalLm), gpu: &Device, store: KvSpec, reference: KvSpec) -> f32 {
    let cpu = Device::flex();
    let mut cached = ember_serve::Decoder::new(model.0, store, gpu);
    let mut other = ember_serve::Decoder::new(model.1, reference, &cpu);
    let mut ids: Vec<u32> = vec![3, 14, 15, 9, 2, 6];
    let (mut seen, mut worst) = (0, 0.0f32);
    for _ in 0..64 - ids.len() {
        let a = cached.next_logits(&ids, seen);
        let b = other.next_logits(&ids, seen);
        worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
        seen = ids.len();
        ids.push(ember_serve::sampling::argmax(&b));
    }
    worst
}

/// Contiguous and paged stores on wgpu (paged: the paged decoding kernel reads keys through the page table) equal
/// recomputation on the CPU within 1e-4. The int8 store on wgpu (the int8 kernel dequantizes in place) stays within
/// 1e-3 of the int8 store on the CPU: keys that differ by float rounding between devices can round to neighbouring
/// codes (the kernel itself is compared code for code in `ember-serve`'s `int8_kernel` test).
#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn cached_decoding_on_wgpu_equals_recomputation_on_the_cpu_within_1e_4() {
    let Some(gpu) = wgpu_test_device() else { return };
    for config in variants().into_iter().take(3) {
        let on_gpu = CausalLm::new(&config, &mut Rng::new(3), &gpu);
        let on_cpu = CausalLm::new(&config, &mut Rng::new(3), &Device::flex());
        let pair = (&on_gpu, &on_cpu);
        for store in [KvSpec::from(KvKind::Contiguous), KvSpec { page_size: 5, ..KvKind::Paged.into() }] {
            let worst = decode_against(pair, &gpu, store, KvKind::None.into());
            assert!(worst <= 1e-4, "{:?}: max |cached wgpu − recomputed cpu| = {worst} for {config:?}", store.kind);
        }
        let int8 = KvSpec { group: 8, ..KvKind::Int8.into() };
        let worst = decode_against(pair, &gpu, int8, int8);
        assert!(worst <= 1e-3, "int8: max |wgpu − cpu| = {worst} for {config:?}");
    }
}

/// The encoder–decoder model on wgpu (encoder self-attention over padded sources and cross-attention through the
/// kernels' key lengths) equals the CPU within 1e-4, teacher-forced and decoding step by step with a cache.
#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn seq2seq_on_wgpu_matches_the_cpu_within_1e_4() {
    use ember_core_model::seq2seq::{Seq2Seq, Seq2SeqConfig};
    let Some(gpu) = wgpu_test_device() else { return };
    let cpu = Device::flex();
    let config = Seq2SeqConfig::joint(ModelConfig::gpt(40, 2, 4, 64, 64).paper_style(), 2, 2, 40);
    let (on_cpu, on_gpu) =
        (Seq2Seq::new(&config, &mut Rng::new(4), &cpu), Seq2Seq::new(&config, &mut Rng::new(4), &gpu));
    let mut rng = Rng::new(6);
    let src: Vec<i64> = (0..3 * 11).map(|_| rng.below(40) as i64).collect();
    let tgt: Vec<i64> = (0..3 * 8).map(|_| rng.below(40) as i64).collect();
    let lengths = [11, 3, 7];
    let run = |model: &Seq2Seq, device: &Device| {
        let src = Tensor::<2, Int>::from_data(TensorData::new(src.clone(), [3, 11]), device);
        let memories = model.encode(src, &lengths);
        let full = model.decode(&memories, Tensor::from_data(TensorData::new(tgt.clone(), [3, 8]), device));
        let mut cache = ember_serve::kv::ContiguousCache::new(4);
        let first = Tensor::<2, Int>::from_data(TensorData::new(vec![tgt[0], tgt[8], tgt[16]], [3, 1]), device);
        let step = model.decode_step(&memories, first, &mut cache);
        (full.into_data().try_to_vec::<f32>().unwrap(), step.into_data().try_to_vec::<f32>().unwrap())
    };
    let ((full_cpu, step_cpu), (full_gpu, step_gpu)) = (run(&on_cpu, &cpu), run(&on_gpu, &gpu));
    let diff = max_abs_diff;
    assert!(diff(&full_cpu, &full_gpu) <= 1e-4, "teacher-forced logits differ by {}", diff(&full_cpu, &full_gpu));
    assert!(diff(&step_cpu, &step_gpu) <= 1e-4, "cached step logits differ by {}", diff(&step_cpu, &step_gpu));
}

/// SmolLM2's 16 greedy tokens after `prompt` with `args` (device, weights, …): stdout.
fn smollm2_greedy(prompt: &str, args: &[&str]) -> String {
    let gguf = common::smollm2().display().to_string();
    let greedy = ["generate", "--model", &gguf, "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "16"];
    let out = common::ember(&[&greedy[..], args].concat());
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// SmolLM2 with its weights as Q8_0 blocks (`--weights q8_0`) continues the README's three prompts on wgpu, where the
/// shader dequantizes the blocks against f32 activations, as on the CPU, where 8-bit activations meet them in
/// integer dot products: the same 16 greedy tokens.
#[test]
#[ignore = "needs a wgpu adapter and the SmolLM2 GGUF (scripts/test.sh provides both)"]
fn smollm2_q8_0_blocks_generate_on_wgpu_as_on_the_cpu() {
    if wgpu_test_device().is_none() {
        return;
    }
    for prompt in ["The capital of France is", "Once upon a time,", "def fibonacci(n):"] {
        let generate = |device| smollm2_greedy(prompt, &["--device", device, "--weights", "q8_0"]);
        assert_eq!(generate("wgpu"), generate("cpu"), "{prompt:?}");
    }
}

/// SmolLM2 with `--dtype f16` on wgpu (weights dequantized from the GGUF's Q4_1 blocks, then rounded to f16;
/// activations and the KV store, contiguous or paged, in f16) writes the same 16 greedy tokens as the same dense
/// weights in f32 on the CPU, for the README's three prompts; the CPU asked for f16 runs f32 and says so, and f16
/// with packed weights is refused.
#[test]
#[ignore = "needs a wgpu adapter and the SmolLM2 GGUF (scripts/test.sh provides both)"]
fn smollm2_in_f16_on_wgpu_writes_the_f32_greedy_text() {
    if wgpu_test_device().is_none() {
        return;
    }
    let gguf = common::smollm2().display().to_string();
    let prompts = [
        ("The capital of France is", "contiguous"),
        ("Once upon a time,", "paged"),
        ("def fibonacci(n):", "contiguous"),
    ];
    for (prompt, kv) in prompts {
        let f16 = smollm2_greedy(prompt, &["--device", "wgpu", "--dtype", "f16", "--weights", "f32", "--kv-cache", kv]);
        assert_eq!(f16, smollm2_greedy(prompt, &["--device", "cpu", "--weights", "f32"]), "{prompt:?}");
    }
    // The CPU runs f32 and says so; f16 with packed weights is refused in one line.
    let short = ["--prompt", "Hi", "--max-new-tokens", "2"];
    let cpu =
        common::ember(&[&["generate", "--device", "cpu", "--model", &gguf, "--dtype", "f16"][..], &short].concat());
    let stderr = String::from_utf8_lossy(&cpu.stderr);
    assert!(cpu.status.success() && stderr.contains("the CPU runs in f32"), "{stderr}");
    let packed = ["generate", "--device", "wgpu", "--model", &gguf, "--dtype", "f16", "--weights", "q8_0"];
    let refused = common::ember(&[&packed[..], &short].concat());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("--weights q8_0 cannot go with it"), "{stderr}");
}

/// f16 logits against f32 on wgpu: max |f16 − f32| over the largest |f32 logit| (at least 1). Weights, activations
/// and attention in f16 round to 11 significant bits (4.9e-4 relative) at every layer; the six 4-layer variants
/// measure 0.87–1.6e-3 on lavapipe.
const F16_TOLERANCE: f32 = 5e-3;

#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn f16_logits_are_within_the_stated_tolerance_of_f32() {
    let Some(gpu) = wgpu_test_device() else { return };
    for config in variants() {
        let model = CausalLm::new(&config, &mut Rng::new(11), &gpu);
        let half = ember_core_model::params::cast_params(model.clone(), FloatDType::F16);
        let mut rng = Rng::new(5);
        let ids: Vec<i64> = (0..3 * 64).map(|_| rng.below(71) as i64).collect();
        let x = || Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [3, 64]), &gpu);
        let (a, b) = (model.forward(x()), half.forward(x()));
        assert_eq!(b.dtype(), burn::tensor::DType::F16, "the f16 model computes in f16");
        let (a, b) = (values(a), values(b));
        let scale = a.iter().fold(1.0f32, |m, z| m.max(z.abs()));
        let error = max_abs_diff(&a, &b) / scale;
        eprintln!("f16 logits: max error {error:e} of the largest logit for {config:?}");
        assert!(error <= F16_TOLERANCE, "f16 logits {error:e} from f32's for {config:?}");
    }
    // The encoder–decoder (Post-LN, sinusoidal, cross-attention), a padded source batch.
    let config = Seq2SeqConfig::joint(ModelConfig::gpt(71, 2, 4, 128, 64).paper_style(), 2, 2, 71);
    let model = Seq2Seq::new(&config, &mut Rng::new(3), &gpu);
    let half = ember_core_model::params::cast_params(model.clone(), FloatDType::F16);
    let mut rng = Rng::new(8);
    let mut batch = |t: usize| {
        let ids: Vec<i64> = (0..2 * t).map(|_| rng.below(71) as i64).collect();
        Tensor::<2, Int>::from_data(TensorData::new(ids, [2, t]), &gpu)
    };
    let (src, tgt) = (batch(20), batch(15));
    let a = values(model.forward(src.clone(), &[20, 13], tgt.clone()));
    let b = values(half.forward(src, &[20, 13], tgt));
    let error = max_abs_diff(&a, &b) / a.iter().fold(1.0f32, |m, z| m.max(z.abs()));
    eprintln!("f16 logits: max error {error:e} of the largest logit for the encoder–decoder");
    assert!(error <= F16_TOLERANCE, "f16 encoder–decoder logits {error:e} from f32's");
}

/// The steps of a run's metrics.jsonl that f16 training logged, with their loss scale and what it did to it.
fn scale_steps(run: &std::path::Path) -> Vec<(u64, f64, String)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Some((v["step"].as_u64()?, v.get("loss_scale")?.as_f64()?, v["change"].as_str()?.to_string()))
        })
        .collect()
}

/// How far f16 training's validation loss may be from f32's at every evaluation of the 200 steps: 0.05 nats. With
/// f32 master weights the two runs differ by f16's rounding of the forward and backward passes and by the steps f16
/// skips on overflow; lavapipe measures 0.027 at step 50 (two skipped steps behind) and 0.001 at step 200.
const F16_TRAINING_BAND: f64 = 0.05;

#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn two_hundred_f16_training_steps_follow_f32_within_the_stated_band() {
    let Some(_) = wgpu_test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let corpus = common::small_corpus(dir.path(), 100_000);
    let config = common::tiny_config(dir.path(), &corpus, &dir.path().join("unused"), "");
    let train = |dtype: &str| {
        let run = dir.path().join(dtype);
        let sets = [
            format!("model.dtype={dtype}"),
            format!("train.out_dir={}", run.display()),
            "train.max_steps=200".into(),
            "train.decay_steps=200".into(),
            "train.eval_interval=50".into(),
            "train.eval_iters=4".into(),
        ];
        let mut args = vec!["--device", "wgpu", "--config", config.to_str().unwrap()];
        for set in &sets {
            args.extend(["--set", set]);
        }
        let out = common::train_ok(&args);
        (run, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (f32_run, _) = train("f32");
    let (f16_run, stdout) = train("f16");
    assert!(stdout.contains("in f16 (f32 master weights"), "{stdout}");
    let (full, half) = (metric(&f32_run, "val_loss"), metric(&f16_run, "val_loss"));
    assert_eq!(full.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 50, 100, 150, 200]);
    for ((step, a), (_, b)) in full.iter().zip(&half) {
        eprintln!("step {step}: val loss f32 {a:.4}, f16 {b:.4}");
        assert!((a - b).abs() <= F16_TRAINING_BAND, "step {step}: f16 val loss {b:.4}, f32 {a:.4}");
    }
    assert!(half[4].1 < half[0].1 - 1.0, "f16 training learns: {half:?}");
    assert_eq!(scale_steps(&f16_run).len(), 200, "every f16 step logs its loss scale");
    assert!(scale_steps(&f32_run).is_empty(), "f32 has no loss scale");
    // Checkpoints stay f32: the master weights and AdamW's moments.
    let (tensors, _) = ember_core_model::bundle::load_tensors(&f16_run.join("checkpoint.safetensors")).unwrap();
    assert!(tensors.values().all(|t| t.dtype() == burn::tensor::DType::F32));
}

/// A first loss scale of 2⁴⁰ overflows f16's gradients: each such step is skipped (the model unchanged) and the scale
/// halved, until it fits (after 10 or more overflows); 5 clean steps double it again; a resumed run continues from the checkpoint's scale.
#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn an_overflowing_loss_scale_skips_the_step_halves_and_grows_again() {
    let Some((_dir, config, run)) = tiny_run_with_wgpu(20_000) else { return };
    let config = config.to_str().unwrap();
    let sets = [
        "model.dtype=f16",
        "train.loss_scale=1099511627776",
        "train.loss_scale_growth_interval=5",
        "train.max_steps=40",
    ];
    let mut args = vec!["--device", "wgpu", "--config", config];
    for set in sets {
        args.extend(["--set", set]);
    }
    let stdout = String::from_utf8_lossy(&common::train_ok(&args).stdout).into_owned();
    assert!(
        stdout.contains(
            "step 1: gradients overflowed f16 at loss scale 1099511627776; step skipped, scale halved to 549755813888"
        ),
        "{stdout}"
    );
    let steps = scale_steps(&run);
    let halved = steps.iter().take_while(|s| s.2 == "halved").count();
    assert!((10..30).contains(&halved), "overflows then clean steps: {steps:?}");
    for (i, (_, scale, _)) in steps[..=halved].iter().enumerate() {
        assert_eq!(*scale, 2f64.powi(40 - i as i32), "the scale halves on every overflow");
    }
    let grown = steps.iter().position(|s| s.2 == "grown").expect("5 clean steps grow the scale");
    assert!(steps[grown].0 >= steps[halved].0 + 4, "{steps:?}");
    assert_eq!(steps[grown + 1].1, 2.0 * steps[grown].1, "{steps:?}");
    assert!(stdout.contains(&format!("step {}: loss scale grown from", steps[grown].0)), "{stdout}");
    // The skipped steps changed nothing: the evaluation after ten overflows equals the untrained model's.
    let evals = metric(&run, "val_loss");
    assert_eq!((evals[0].0, evals[1].0), (0, 10));
    assert_eq!(evals[0].1, evals[1].1, "skipped steps leave the weights as they were");
    assert!(evals.last().unwrap().1 < evals[0].1, "the clean steps train: {evals:?}");
    // Resuming continues from the checkpoint's scale.
    let (_, last_scale, last_change) = steps.last().unwrap().clone();
    let next = match last_change.as_str() {
        "halved" => last_scale / 2.0,
        "grown" => last_scale * 2.0,
        _ => last_scale,
    };
    common::train_ok(&["--device", "wgpu", "--resume", run.to_str().unwrap(), "--set", "train.max_steps=41"]);
    let resumed = scale_steps(&run);
    assert_eq!(resumed.len(), 41);
    assert_eq!(resumed[40].1, next, "step 41 uses the scale step 40 left");
}

/// The translator trains in f16 too (f32 master weights, loss scaling, greedy BLEU decoded by the f16 model through
/// the KV store): 6 steps of the tiny translation config end within the f16 band of f32's validation loss (lavapipe
/// measures 0.017).
#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn the_translator_trains_in_f16_within_the_band_of_f32() {
    let Some(_) = wgpu_test_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = common::tiny_translation_config(dir.path(), &dir.path().join("unused"));
    let val_loss = |dtype: &str| {
        let run = dir.path().join(dtype);
        let (dtype_set, out_set) = (format!("model.dtype={dtype}"), format!("train.out_dir={}", run.display()));
        let args = ["--device", "wgpu", "train", "--config", config.to_str().unwrap(), "--set", &dtype_set];
        let out = common::ember(&[&args[..], &["--set", &out_set, "--set", "train.max_steps=6"]].concat());
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(&format!("in {dtype} on wgpu")), "{stdout}");
        assert_eq!(scale_steps(&run).len(), if dtype == "f16" { 6 } else { 0 });
        metric(&run, "val_loss").last().expect("an evaluation").1
    };
    let (full, half) = (val_loss("f32"), val_loss("f16"));
    eprintln!("translator val loss after 6 steps: f32 {full:.4}, f16 {half:.4}");
    assert!((full - half).abs() <= F16_TRAINING_BAND, "f16 {half:.4} against f32 {full:.4}");
}
