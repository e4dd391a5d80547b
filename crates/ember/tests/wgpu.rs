//! The same models on wgpu (lavapipe without a GPU): logits equal the CPU's for every architecture, and training
//! lowers the loss.
//! Under CI a missing adapter fails the test.

mod common;

use burn::tensor::{Device, DeviceKind, Int, Tensor, TensorData};
use ember_core_model::config::{AttentionKind, FfnKind, NormPlacement, PositionKind};
use ember_core_model::{Gpt, ModelConfig, Rng};

fn wgpu_device() -> Option<Device> {
    if ember_kernels::wgpu_adapters().is_empty() {
        assert!(std::env::var_os("CI").is_none(), "CI requires a wgpu adapter (install mesa-vulkan-drivers)");
        eprintln!("no wgpu adapter: skipped outside CI");
        return None;
    }
    Some(Device::wgpu(DeviceKind::DefaultDevice))
}

/// The baby GPT and the other architectures: Llama-style (RMSNorm, SwiGLU, RoPE, GQA, untied), MLA with a sliding
/// window and Peri-LN, and the 2017 layout (Post-LN, sinusoidal, ReLU).
fn variants() -> Vec<ModelConfig> {
    let gpt = ModelConfig::gpt(71, 4, 4, 128, 64);
    let llama = ModelConfig { tie_embeddings: false, ..gpt.clone().llama_style(2) };
    let mla = ModelConfig {
        attention: AttentionKind::Mla,
        mla_latent_dim: Some(32),
        mla_rope_dim: Some(8),
        n_kv_heads: None,
        window: Some(16),
        norm_placement: NormPlacement::Peri,
        ..llama.clone()
    };
    let post = ModelConfig {
        norm_placement: NormPlacement::Post,
        positions: PositionKind::Sinusoidal,
        ffn: FfnKind::Relu,
        ..gpt.clone()
    };
    vec![gpt, llama, mla, post]
}

#[test]
fn forward_logits_match_the_cpu_within_1e_4() {
    let Some(gpu) = wgpu_device() else { return };
    let cpu = Device::flex();
    for config in variants() {
        let on_cpu = Gpt::new(&config, &mut Rng::new(11), &cpu);
        let on_gpu = Gpt::new(&config, &mut Rng::new(11), &gpu);
        let mut rng = Rng::new(5);
        let ids: Vec<i64> = (0..3 * 64).map(|_| rng.below(71) as i64).collect();
        let x = |d: &Device| Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [3, 64]), d);
        let a = on_cpu.forward(x(&cpu)).into_data().try_to_vec::<f32>().unwrap();
        let b = on_gpu.forward(x(&gpu)).into_data().try_to_vec::<f32>().unwrap();
        let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
        assert!(diff <= 1e-4, "max |cpu − wgpu| = {diff} for {config:?}");
        assert!(a.iter().any(|&z| z.abs() > 1e-3), "logits are not trivially zero");
    }
}

#[test]
fn twenty_training_steps_lower_the_loss() {
    let Some(_) = wgpu_device() else { return };
    let dir = tempfile::tempdir().unwrap();
    let corpus = common::small_corpus(dir.path(), 100_000);
    let run = dir.path().join("run");
    let config = common::tiny_config(dir.path(), &corpus, &run, "");
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

#[test]
fn cached_decoding_on_wgpu_equals_recomputation_on_the_cpu_within_1e_4() {
    let Some(gpu) = wgpu_device() else { return };
    let cpu = Device::flex();
    for config in variants().into_iter().take(3) {
        let on_gpu = Gpt::new(&config, &mut Rng::new(3), &gpu);
        let on_cpu = Gpt::new(&config, &mut Rng::new(3), &cpu);
        let mut cached = ember_serve::Decoder::new(&on_gpu, ember_serve::KvKind::Contiguous, &gpu);
        let mut full = ember_serve::Decoder::new(&on_cpu, ember_serve::KvKind::None, &cpu);
        let mut ids: Vec<u32> = vec![3, 14, 15, 9, 2, 6];
        let (mut seen, mut worst) = (0, 0.0f32);
        for _ in 0..64 - ids.len() {
            let a = cached.next_logits(&ids, seen);
            let b = full.next_logits(&ids, seen);
            worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
            seen = ids.len();
            ids.push(ember_serve::sampling::argmax(&b));
        }
        assert!(worst <= 1e-4, "max |cached wgpu − recomputed cpu| = {worst} for {config:?}");
    }
}
