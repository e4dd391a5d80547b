//! Byte-level BPE files (GGUF's "gpt2" tokenizer model) split text as their family does upstream, by the name in
//! `tokenizer.ggml.pre`: Qwen2's own transformers tokenizer, Llama 3's, SmolLM's and GPT-2's pre-tokenizers give the
//! ids stored by scripts/reference/bpe_pretokenizers.py for the same tokens and merges.

use ember_formats::tokenizer::from_bpe;
use serde_json::Value;

#[test]
fn each_split_encodes_as_its_family_does_upstream() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/bpe_pretokenizers.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let strings = |key: &str| -> Vec<String> {
        fixture[key].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
    };
    let (tokens, merges) = (strings("tokens"), strings("merges"));
    for (pre, cases) in fixture["cases"].as_object().unwrap() {
        let tokenizer = from_bpe(&tokens, &merges, &[0], pre).unwrap();
        for case in cases.as_array().unwrap() {
            let text = case[0].as_str().unwrap();
            let want: Vec<u32> = case[1].as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as u32).collect();
            let got = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(got, want, "{pre}: {text:?}");
            assert_eq!(tokenizer.decode(&got, false).unwrap(), text_after_normalization(pre, text), "{pre}");
        }
    }
}

/// Qwen2 normalizes to NFC before it splits, so its decoded text is the NFC form.
fn text_after_normalization(pre: &str, text: &str) -> String {
    match pre {
        "qwen2" => text.replace("e\u{301}", "é"),
        _ => text.to_string(),
    }
}
