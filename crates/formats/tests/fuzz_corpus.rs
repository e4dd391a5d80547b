//! Replays every fuzz target's corpus (`fuzz/corpus/TARGET`, seeds and the inputs libFuzzer kept) and every failure
//! the fuzzer ever found (`fuzz/artifacts/TARGET`) through the targets' entry points, on the stable toolchain: a
//! reader that panics on any of them fails here, without a nightly build.

use std::path::Path;

fn replay(target: &str) {
    let (_, run) = ember_formats::fuzz::TARGETS.iter().find(|(name, _)| *name == target).expect("a fuzz target");
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut inputs = 0;
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(outcome.is_ok(), "{target} panicked on {}", path.display());
            inputs += 1;
        }
    }
    assert!(inputs > 0, "fuzz/corpus/{target} holds no inputs (scripts/fuzz-seeds.py writes its seeds)");
}

#[test]
fn gguf_corpus() {
    replay("gguf");
}

#[test]
fn safetensors_corpus() {
    replay("safetensors");
}

#[test]
fn hf_config_corpus() {
    replay("hf_config");
}

#[test]
fn run_config_corpus() {
    replay("run_config");
}

#[test]
fn tokenizer_corpus() {
    replay("tokenizer");
}

#[test]
fn checkpoint_state_corpus() {
    replay("checkpoint_state");
}

#[test]
fn tsv_corpus() {
    replay("tsv");
}

#[test]
fn openai_request_corpus() {
    replay("openai_request");
}

#[test]
fn chat_template_corpus() {
    replay("chat_template");
}

#[test]
fn sentencepiece_corpus() {
    replay("sentencepiece");
}

#[test]
fn every_target_is_replayed() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/fuzz_targets");
    let mut files: Vec<String> =
        std::fs::read_dir(fuzz).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().replace(".rs", "")).collect();
    files.sort();
    let mut targets: Vec<&str> = ember_formats::fuzz::TARGETS.iter().map(|(name, _)| *name).collect();
    targets.sort();
    assert_eq!(files, targets, "fuzz/fuzz_targets and ember_formats::fuzz::TARGETS differ");
}
