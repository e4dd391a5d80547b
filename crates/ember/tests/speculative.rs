//! Speculative decoding by prompt lookup in `ember generate`: drafts checked in one forward pass and the store rolled
//! back past the rejected ones leave greedy text byte for byte what plain decoding writes.

mod common;

use std::path::Path;

use common::generate_on_cpu;
use common::server::tiny_model;

/// Greedy text with `--prompt-lookup K` (and the drafts it kept, from `--stats`).
fn greedy(model: &Path, prompt: &str, tokens: usize, lookup: usize, extra: &[&str]) -> (String, usize) {
    let (n, k) = (tokens.to_string(), lookup.to_string());
    let args =
        [&["--prompt", prompt, "--temperature", "0", "--max-new-tokens", &n, "--prompt-lookup", &k, "--stats"], extra];
    let out = generate_on_cpu(model, &args.concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let accepted =
        stderr.lines().find_map(|l| l.strip_prefix("prompt lookup: ")?.split(' ').next()?.parse().ok()).unwrap_or(0);
    (String::from_utf8(out.stdout).unwrap(), accepted)
}

/// A character model that repeats its corpus: with drafts of 1 to 8 tokens, over the contiguous and the paged store,
/// the same text as plain greedy decoding, over prompts whose continuation copies the context.
#[test]
fn prompt_lookup_leaves_greedy_text_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let (mut kept, mut paged_kept) = (0, 0);
    for prompt in &prompts[..4] {
        let prompt = prompt.repeat(3);
        let (plain, _) = greedy(&run, &prompt, 24, 0, &[]);
        for lookup in [1, 3, 8] {
            let (drafted, accepted) = greedy(&run, &prompt, 24, lookup, &[]);
            assert_eq!(drafted, plain, "{prompt:?} with drafts of {lookup}");
            kept += accepted;
        }
        // Pages of 4 tokens: rolling back frees the pages past the kept tokens and rewrites a page in part.
        let paged = ["--kv-cache", "paged", "--page-size", "4"];
        let (drafted, accepted) = greedy(&run, &prompt, 24, 5, &paged);
        assert_eq!(drafted, plain, "{prompt:?} paged");
        paged_kept += accepted;
    }
    assert!(kept > 0 && paged_kept > 0, "some drafts were kept ({kept}), over pages too ({paged_kept})");
}

/// SmolLM2-135M-Instruct with its weights dequantized, 20 prompts (half ask it to copy a passage, half are plain),
/// over the contiguous and the paged store: prompt lookup writes exactly plain greedy decoding's text. (With the Q4_1 blocks and 8-bit activations, a
/// verification pass of four or more rows multiplies through VNNI tiles, whose float rounding differs from the
/// one-row dots of a decoded token, so a near tie can go the other way.)
#[test]
#[ignore = "needs the SmolLM2 GGUF: scripts/prepare-data.sh smollm2 (scripts/test.sh runs it)"]
fn smollm2_greedy_text_is_unchanged_by_prompt_lookup() {
    let passages = [
        "The quick brown fox jumps over the lazy dog.",
        "It was a bright cold day in April, and the clocks were striking thirteen.",
        "All happy families are alike; each unhappy family is unhappy in its own way.",
        "Call me Ishmael. Some years ago I thought I would sail about a little.",
        "In the beginning God created the heaven and the earth.",
    ];
    let plain = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "Water boils at", "1, 2, 3, 4,"];
    let mut prompts: Vec<String> = Vec::new();
    for (i, passage) in passages.iter().enumerate() {
        prompts.push(format!(
            "<|im_start|>user\nCopy this exactly:\n{passage} {}<|im_end|>\n<|im_start|>assistant\n",
            passages[(i + 1) % 5]
        ));
        prompts.push(format!("Repeat after me. {passage}\nRepeat after me. "));
    }
    prompts.extend(plain.iter().map(|p| p.to_string()));
    prompts.extend(plain.iter().map(|p| format!("{p} {p} {p}")));
    assert_eq!(prompts.len(), 20);
    let model = common::smollm2();
    let mut kept = 0;
    for (i, prompt) in prompts.iter().enumerate() {
        // Every other prompt over pages of 4 tokens, which the drafts' rollback frees and rewrites in part.
        let flags: &[&str] = match i % 2 {
            0 => &["--weights", "f32"],
            _ => &["--weights", "f32", "--kv-cache", "paged", "--page-size", "4"],
        };
        let (reference, _) = greedy(&model, prompt, 40, 0, flags);
        let (drafted, accepted) = greedy(&model, prompt, 40, 6, flags);
        assert_eq!(drafted, reference, "{prompt:?} {flags:?}");
        kept += accepted;
    }
    assert!(kept > 100, "copying prompts keep most drafts: {kept}");
}
