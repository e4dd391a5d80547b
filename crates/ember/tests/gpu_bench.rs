//! scripts/gpu-bench.sh --quick, the one-command GPU benchmark at tiny sizes, on the binary this build made (on
//! lavapipe where there is no GPU): every section runs and its table holds figures. The PyTorch sections skip where
//! python3 has no CUDA. Under CI a missing adapter fails the test.

use std::path::Path;
use std::process::Command;

use ember_test_support::wgpu_test_device;

/// The first number after `prefix` at the start of a line of `text`.
fn figure(text: &str, prefix: &str) -> f64 {
    let rest = text.lines().find_map(|l| l.strip_prefix(prefix)).unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}"));
    let value = rest.split([' ', '|']).find(|w| !w.is_empty()).unwrap_or_default();
    value.parse().unwrap_or_else(|_| panic!("{prefix:?} is followed by {rest:?}, not a number"))
}

#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn the_quick_gpu_benchmark_fills_every_table() {
    let Some(_) = wgpu_test_device() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().unwrap();
    let run = Command::new("bash")
        .arg(root.join("scripts/gpu-bench.sh"))
        .arg("--quick")
        .arg(out.path())
        .env("EMBER", env!("CARGO_BIN_EXE_ember"))
        .output()
        .expect("bash runs scripts/gpu-bench.sh");
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "gpu-bench.sh --quick failed:\n{stdout}\n{stderr}");
    let read = |name: &str| std::fs::read_to_string(out.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));

    let attention = read("attention-h2-b1.md");
    assert!(!attention.contains("failed"), "{attention}");
    // lavapipe runs both WGSL tiers (its subgroups have 8 lanes).
    for path in ["portable", "subgroup", "burn", "naive"] {
        for t in [64, 128] {
            let row = format!("| {t} | 64 | {path} | ");
            assert!(figure(&attention, &row) > 0.0, "{row} has no forward time:\n{attention}");
        }
    }
    // f16: f32 inputs through f16 tiles, then f16 inputs through every path.
    let f16 = read("attention-f16.md");
    assert!(!f16.contains("failed"), "{f16}");
    let (f32_inputs, f16_inputs) = f16.split_once("causal, f16;").expect("an f16-input table");
    for (table, paths) in
        [(f32_inputs, &["portable-f16", "subgroup-f16"][..]), (f16_inputs, &["portable", "burn", "naive"])]
    {
        for path in paths {
            let row = format!("| 128 | 64 | {path} | ");
            assert!(figure(table, &row) > 0.0, "{row} has no forward time:\n{f16}");
        }
    }
    let gemm = read("gemm.md");
    for shape in ["64×64×64", "100×37×300"] {
        assert!(figure(&gemm, &format!("| {shape} | burn f32 | ")) > 0.0, "{shape}:\n{gemm}");
    }
    for table in ["train-llama-tiny-auto.md", "train-llama-tiny-auto-f16.md", "train-gpt2-124m.md"] {
        assert!(figure(&read(table), "ember median: ") > 0.0, "{table}");
    }
    let decode = read("decode.md");
    assert!(decode.contains("134,515,008"), "the SmolLM2-shaped config's parameter count:\n{decode}");
    // The cached tokens/s of Ember alone, or Ember's row beside transformers where python3 has torch with CUDA.
    let ember = if decode.contains("| Ember | ") { "| Ember | " } else { "| 4 | " };
    let (full, half) = decode.split_once("\nf16 (transformers in bf16):").expect("an f16 decode table");
    assert!(figure(full, ember) > 0.0, "{decode}");
    assert!(half.contains(", f16, ") && figure(half, ember) > 0.0, "Ember decoding in f16:\n{decode}");

    let summary = read("summary.md");
    for section in ["devices", "attention", "gemm", "train", "decode"] {
        assert!(summary.contains(&format!("| {section} | ok |")), "{section} did not pass:\n{summary}");
    }
    assert!(summary.contains("ember --device wgpu bench attention"), "the commands are listed:\n{summary}");
}
