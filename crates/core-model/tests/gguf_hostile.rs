//! Crafted GGUF files, written here byte by byte: a tiny valid llama model loads, and each malformation is an error
//! naming it instead of a panic, an abort or a smaller model than the file holds (head count 0, a head size whose
//! products overflow, a wrongly shaped tensor, tensors past the block count, an impossible alignment, metadata
//! arrays nested a hundred thousand deep, tensor dimensions whose product overflows).

use std::path::PathBuf;

use ember_core_model::import::gguf_model;

/// A metadata value: GGUF type code and its little-endian payload.
struct Meta(u32, Vec<u8>);

fn string_bytes(s: &str) -> Vec<u8> {
    [(s.len() as u64).to_le_bytes().to_vec(), s.as_bytes().to_vec()].concat()
}

fn u32_meta(v: u32) -> Meta {
    Meta(4, v.to_le_bytes().to_vec())
}

fn str_meta(s: &str) -> Meta {
    Meta(8, string_bytes(s))
}

fn strs_meta(items: &[&str]) -> Meta {
    let mut b = [8u32.to_le_bytes().to_vec(), (items.len() as u64).to_le_bytes().to_vec()].concat();
    items.iter().for_each(|s| b.extend(string_bytes(s)));
    Meta(9, b)
}

/// A tensor: name, row-major shape (GGUF stores it fastest dimension first), f32 values.
type Tensor = (String, Vec<usize>, Vec<f32>);

/// A GGUF v3 header announcing `n_tensors`, with its metadata.
fn header(meta: &[(&str, Meta)], n_tensors: usize) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((n_tensors as u64).to_le_bytes());
    b.extend((meta.len() as u64).to_le_bytes());
    for (key, Meta(ty, payload)) in meta {
        b.extend(string_bytes(key));
        b.extend(ty.to_le_bytes());
        b.extend(payload);
    }
    b
}

/// A GGUF v3 file of `meta` and F32 `tensors`, data aligned to 32 bytes.
fn gguf(meta: &[(&str, Meta)], tensors: &[Tensor]) -> Vec<u8> {
    let mut b = header(meta, tensors.len());
    let mut offset = 0u64;
    for (name, shape, values) in tensors {
        b.extend(string_bytes(name));
        b.extend((shape.len() as u32).to_le_bytes());
        shape.iter().rev().for_each(|&d| b.extend((d as u64).to_le_bytes()));
        b.extend(0u32.to_le_bytes()); // F32
        b.extend(offset.to_le_bytes());
        offset += (values.len() * 4).next_multiple_of(32) as u64;
    }
    b.resize(b.len().next_multiple_of(32), 0);
    for (_, _, values) in tensors {
        values.iter().for_each(|v| b.extend(v.to_le_bytes()));
        b.resize(b.len().next_multiple_of(32), 0);
    }
    b
}

/// The metadata of a llama with d = 4, 2 heads, 1 KV head, FFN 8, one block, 3 tokens; `edit` changes it.
fn llama_meta(edit: impl FnOnce(&mut Vec<(&'static str, Meta)>)) -> Vec<(&'static str, Meta)> {
    let mut meta = vec![
        ("general.architecture", str_meta("llama")),
        ("llama.attention.head_count", u32_meta(2)),
        ("llama.attention.head_count_kv", u32_meta(1)),
        ("llama.embedding_length", u32_meta(4)),
        ("llama.block_count", u32_meta(1)),
        ("llama.context_length", u32_meta(8)),
        ("llama.feed_forward_length", u32_meta(8)),
        ("llama.attention.layer_norm_rms_epsilon", Meta(6, 1e-5f32.to_le_bytes().to_vec())),
        ("tokenizer.ggml.model", str_meta("gpt2")),
        ("tokenizer.ggml.tokens", strs_meta(&["a", "b", "c"])),
        ("tokenizer.ggml.merges", strs_meta(&[])),
    ];
    edit(&mut meta);
    meta
}

fn tensor(name: &str, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    (name.to_string(), shape.to_vec(), (0..n).map(|i| (i as f32 * 0.37).sin() * 0.1).collect())
}

/// The tensors of [`llama_meta`]'s model.
fn llama_tensors() -> Vec<Tensor> {
    [
        ("token_embd.weight", vec![3, 4]),
        ("blk.0.attn_norm.weight", vec![4]),
        ("blk.0.ffn_norm.weight", vec![4]),
        ("blk.0.attn_q.weight", vec![4, 4]),
        ("blk.0.attn_k.weight", vec![2, 4]),
        ("blk.0.attn_v.weight", vec![2, 4]),
        ("blk.0.attn_output.weight", vec![4, 4]),
        ("blk.0.ffn_gate.weight", vec![8, 4]),
        ("blk.0.ffn_up.weight", vec![8, 4]),
        ("blk.0.ffn_down.weight", vec![4, 8]),
        ("output_norm.weight", vec![4]),
    ]
    .iter()
    .map(|(name, shape)| tensor(name, shape))
    .collect()
}

/// Writes `bytes` as a .gguf file and loads it; the error's text, or "loaded".
fn load(bytes: Vec<u8>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    match gguf_model::load(&path) {
        Ok(_) => "loaded".into(),
        Err(e) => e.to_string(),
    }
}

fn set(meta: &mut [(&'static str, Meta)], key: &str, value: Meta) {
    meta.iter_mut().find(|(k, _)| *k == key).unwrap().1 = value;
}

#[test]
fn the_tiny_llama_loads() {
    assert_eq!(load(gguf(&llama_meta(|_| {}), &llama_tensors())), "loaded");
}

#[test]
fn a_head_count_of_zero_is_an_error() {
    let meta = llama_meta(|m| set(m, "llama.attention.head_count", u32_meta(0)));
    let err = load(gguf(&meta, &llama_tensors()));
    assert!(err.contains("n_heads"), "{err}");
}

#[test]
fn a_head_size_whose_products_overflow_is_an_error() {
    let meta = llama_meta(|m| m.push(("llama.attention.key_length", Meta(10, (1u64 << 62).to_le_bytes().to_vec()))));
    let err = load(gguf(&meta, &llama_tensors()));
    assert_ne!(err, "loaded");
}

#[test]
fn a_wrongly_shaped_tensor_is_named() {
    let mut tensors = llama_tensors();
    tensors[3] = tensor("blk.0.attn_q.weight", &[16]);
    let err = load(gguf(&llama_meta(|_| {}), &tensors));
    assert!(err.contains("tensor blk.0.attn_q.weight has shape [16]; the metadata needs [4, 4]"), "{err}");
}

#[test]
fn tensors_past_the_block_count_are_an_error_not_a_smaller_model() {
    let mut tensors = llama_tensors();
    tensors.push(tensor("blk.1.attn_norm.weight", &[4]));
    let err = load(gguf(&llama_meta(|_| {}), &tensors));
    assert!(
        err.contains("1 tensor(s) are not part of the 1-layer model the metadata describes: blk.1.attn_norm.weight")
    );
}

#[test]
fn an_impossible_alignment_is_an_error() {
    let meta = llama_meta(|m| m.push(("general.alignment", Meta(10, u64::MAX.to_le_bytes().to_vec()))));
    let err = load(gguf(&meta, &llama_tensors()));
    assert!(err.contains("general.alignment 18446744073709551615 is not a power of two"), "{err}");
}

#[test]
fn deeply_nested_metadata_arrays_are_an_error_not_a_stack_overflow() {
    // An array of one array of one array … 100,000 deep.
    let mut payload = Vec::new();
    for _ in 0..100_000 {
        payload.extend(9u32.to_le_bytes());
        payload.extend(1u64.to_le_bytes());
    }
    let meta = llama_meta(|m| m.push(("deep", Meta(9, payload))));
    let err = load(gguf(&meta, &llama_tensors()));
    assert!(err.contains("metadata arrays nested deeper than 8"), "{err}");
}

#[test]
fn tensor_dimensions_whose_product_overflows_are_an_error() {
    // One tensor directory entry of ten dimensions of 100: 10^20 elements.
    let mut bytes = header(&llama_meta(|_| {}), 1);
    bytes.extend(string_bytes("huge"));
    bytes.extend(10u32.to_le_bytes());
    (0..10).for_each(|_| bytes.extend(100u64.to_le_bytes()));
    bytes.extend(0u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.resize(bytes.len() + 64, 0);
    let err = load(bytes);
    assert!(err.contains("tensor huge: dimensions [100, 100"), "{err}");
}

/// Files that would load wrongly rather than fail are errors naming the problem: metadata of the wrong type (an
/// alignment written as the string "64" would read the weights at shifted offsets, a KV head count as a string would
/// give MHA), a tensor or a key given twice (which one a reader takes would be a guess), a mixture of experts (it
/// would load as a dense model).
#[test]
fn metadata_of_the_wrong_type_duplicates_and_experts_are_errors() {
    let with = |key: &'static str, value: Meta| {
        llama_meta(move |m| match m.iter().position(|(k, _)| *k == key) {
            Some(i) => m[i].1 = value,
            None => m.push((key, value)),
        })
    };
    let mut twice = llama_tensors();
    twice.push(tensor("output_norm.weight", &[4]));
    let cases = [
        (with("general.alignment", str_meta("64")), llama_tensors(), "general.alignment is not an unsigned integer"),
        (
            with("llama.attention.head_count_kv", str_meta("1")),
            llama_tensors(),
            "head_count_kv is not an unsigned integer",
        ),
        (with("llama.rope.freq_base", str_meta("10000")), llama_tensors(), "llama.rope.freq_base is not a number"),
        (
            llama_meta(|m| m.push(("llama.block_count", u32_meta(1)))),
            llama_tensors(),
            "llama.block_count appears twice",
        ),
        (llama_meta(|_| {}), twice, "tensor output_norm.weight appears twice"),
        (
            with("llama.expert_count", u32_meta(8)),
            llama_tensors(),
            "mixture-of-experts layers (1 of 1 layers, 8 experts) are not supported",
        ),
    ];
    for (meta, tensors, expected) in cases {
        let err = load(gguf(&meta, &tensors));
        assert!(err.contains(expected), "{expected}: {err}");
    }
}

/// A GGUF file is mapped, not read whole: a model followed by 35 GiB of (sparse) padding opens, and loads, reading
/// only its header and its tensors' pages.
#[test]
fn a_35_gib_file_is_mapped_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, gguf(&llama_meta(|_| {}), &llama_tensors())).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(35 << 30).unwrap();
    assert_eq!(gguf_model::load_config(&path).unwrap().n_layers, 1);
    assert!(gguf_model::load(&path).is_ok());
}
