//! Imported checkpoints against Hugging Face: the fixtures come from scripts/reference/hf_fixtures.py.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::bundle::load_tensors;
use ember_core_model::import;
use ember_core_model::nn::projection::Projection;
use ember_core_model::seq2seq::Seq2Seq;
use ember_core_model::weights::WeightFormat;
use ember_core_model::{Build, CausalLm, tokenizer};
use ember_formats::config::AttentionKind;
use ember_formats::rope::RopeScaling;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf")
}

/// Imports a tiny random-init HF model and compares its logits for the stored inputs (f32, 1e-4 absolute).
fn logits_match(name: &str) {
    let (config, tensors) = import::hf::load(&fixtures().join(name)).unwrap();
    model_matches(name, &CausalLm::load(&config, &tensors, &Device::flex()).unwrap());
}

/// `model`'s logits for the inputs stored with the fixture `name` against transformers' (f32, 1e-4 absolute).
fn model_matches(name: &str, model: &CausalLm) {
    let (dir, device) = (fixtures().join(name), Device::flex());
    let (expected, _) = load_tensors(&dir.join("expected.safetensors")).unwrap();
    let ids: Vec<i64> = expected["input_ids"].as_slice::<f32>().unwrap().iter().map(|&x| x as i64).collect();
    let shape = expected["input_ids"].shape().to_vec();
    let idx = Tensor::<2, Int>::from_data(TensorData::new(ids, [shape[0], shape[1]]), &device);
    let logits = model.forward(idx).into_data();
    let want = expected["logits"].as_slice::<f32>().unwrap();
    let got = logits.as_slice::<f32>().unwrap();
    let diff = ember_test_support::max_abs_diff(got, want);
    assert!(diff <= 1e-4, "{name}: max |Ember − HF| = {diff}");
}

#[test]
fn gpt2_logits_match_hugging_face() {
    logits_match("gpt2-tiny");
}

#[test]
fn llama_gqa_logits_match_hugging_face() {
    let (config, _) = import::hf::load(&fixtures().join("llama-tiny")).unwrap();
    assert_eq!((config.n_heads, config.kv_heads(), config.rope_theta, config.tie_embeddings), (4, 2, 1000.0, false));
    logits_match("llama-tiny");
}

/// Qwen2 (q, k, v biases, output tied to the embedding), Qwen3 (RMSNorm of each head's q and k, head_dim 16 at
/// width 32) and Mistral (a sliding window of 5 keys over 12 tokens) against transformers' logits.
#[test]
fn qwen2_qwen3_and_mistral_logits_match_hugging_face() {
    let config = |name: &str| import::hf::load(&fixtures().join(name)).unwrap().0;
    let (qwen2, qwen3, mistral) = (config("qwen2-tiny"), config("qwen3-tiny"), config("mistral-tiny"));
    assert_eq!((qwen2.qkv_bias(), qwen2.tie_embeddings, qwen2.window), (true, true, None));
    assert_eq!((qwen3.qk_norm, qwen3.head_dim(), qwen3.qkv_bias()), (true, 16, false));
    assert_eq!((mistral.window, mistral.qk_norm), (Some(5), false));
    for name in ["qwen2-tiny", "qwen3-tiny", "mistral-tiny"] {
        logits_match(name);
    }
}

/// Phi-3 (q, k, v in one qkv_proj, gate and up in one gate_up_proj, a sliding window of 5 keys) against transformers'
/// logits; a Phi config that rotates part of each head is refused by name.
#[test]
fn phi3_logits_match_hugging_face_and_partial_rotary_is_refused() {
    let (config, _) = import::hf::load(&fixtures().join("phi3-tiny")).unwrap();
    assert_eq!((config.window, config.kv_heads(), config.tie_embeddings), (Some(5), 2, false));
    logits_match("phi3-tiny");
    let text = std::fs::read_to_string(fixtures().join("phi3-tiny/config.json")).unwrap();
    let partial = text.replace("\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 0.75");
    assert_ne!(partial, text);
    let err = ember_formats::hf::config(&partial).unwrap_err();
    assert_eq!(err, "partial rotary embeddings (partial_rotary_factor = 0.75) are not supported");
}

/// Gemma 2 (sandwich norms with Gemma's 1 + w gains, GeGLU, √d embeddings, a window of 5 on layer 0 only, scores
/// capped at 2 and logits at 3, and a query_pre_attn_scalar of 24 for heads of 16) and Gemma 3's text model (per-head
/// q/k norms; five windowed layers with RoPE base 10,000, then a global one with base 1000 stretched 4 times) against
/// transformers' logits.
#[test]
fn gemma2_and_gemma3_logits_match_hugging_face() {
    let (config, _) = import::hf::load(&fixtures().join("gemma2-tiny")).unwrap();
    assert_eq!((config.window, config.global_every, config.layer_window(1)), (Some(5), Some(2), None));
    assert_eq!((config.attention_softcap, config.logit_softcap, config.attention_scale), (Some(2.0), Some(3.0), None));
    assert!(config.tie_embeddings && config.embedding_scale);
    logits_match("gemma2-tiny");
    let (scaled, _) = import::hf::load(&fixtures().join("gemma2-scalar-tiny")).unwrap();
    assert_eq!(scaled.attention_scale, Some(1.0 / 24f64.sqrt()));
    logits_match("gemma2-scalar-tiny");
    let (gemma3, _) = import::hf::load(&fixtures().join("gemma3-tiny")).unwrap();
    assert_eq!(
        (gemma3.global_every, gemma3.rope_theta, gemma3.rope_local_theta, gemma3.qk_norm),
        (Some(6), 1000.0, Some(10_000.0), true)
    );
    assert_eq!(
        (gemma3.layer_rope_scaling(0), gemma3.layer_rope_scaling(5)),
        (None, Some(&RopeScaling::Linear { factor: 4.0 }))
    );
    logits_match("gemma3-tiny");
}

/// DeepSeek-V2 with dense layers (multi-head latent attention: the latent RMSNorm'd, queries through a rank-24
/// bottleneck, the RoPE rows' interleaved pairs reordered), plain and with its YaRN (scores scaled by mscale²), against
/// transformers' logits; a config with mixture-of-experts layers is refused by name.
#[test]
fn deepseek_v2_logits_match_hugging_face_and_moe_layers_are_refused() {
    let (config, _) = import::hf::load(&fixtures().join("deepseek2-tiny")).unwrap();
    let mla = (config.mla_latent_dim, config.mla_rope_dim, config.mla_q_rank, config.mla_latent_norm);
    assert_eq!(
        (config.attention, config.head_dim(), mla),
        (AttentionKind::Mla, 8, (Some(16), Some(8), Some(24), true))
    );
    logits_match("deepseek2-tiny");
    let (yarn, _) = import::hf::load(&fixtures().join("deepseek2-yarn-tiny")).unwrap();
    let mscale = 0.1 * 0.707 * 4f64.ln() + 1.0;
    assert!((yarn.attention_scale.unwrap() - mscale * mscale / 4.0).abs() < 1e-12, "{:?}", yarn.attention_scale);
    logits_match("deepseek2-yarn-tiny");
    let text = std::fs::read_to_string(fixtures().join("deepseek2-tiny/config.json")).unwrap();
    let moe = text.replace("\"first_k_dense_replace\": 2", "\"first_k_dense_replace\": 1");
    assert_ne!(moe, text);
    let err = ember_formats::hf::config(&moe).unwrap_err();
    assert_eq!(err, "mixture-of-experts layers (1 of 2 layers, 4 routed experts) are not supported");
}

/// The same models converted to GGUF by llama.cpp's convert_hf_to_gguf.py (scripts/reference/gguf_fixtures.py) give
/// transformers' logits through the GGUF importer: Qwen2's q, k, v biases and Qwen3's per-head q/k norms and head
/// width from the metadata (both stored in rotate-half order), Phi-3's fused attn_qkv and gate-and-up ffn_up and its
/// sliding window, Gemma 2's norms, window pattern and soft-capping, DeepSeek-V2's latent attention with its k_b and
/// v_b put back together (and its YaRN as llama.cpp reads it), linear and YaRN RoPE scaling from `llama.rope.scaling.*`, Llama 3's from a `rope_freqs` tensor and
/// LongRoPE's from `rope_factors_short` and `rope_factors_long`.
#[test]
fn qwen2_qwen3_phi3_gemma_deepseek2_and_rope_scaled_gguf_files_from_llama_cpp_match_hugging_face() {
    for name in GGUF_FAMILIES {
        let (config, weights, _, _) = import::gguf_model::load(&fixtures().join(format!("{name}.gguf"))).unwrap();
        let hf = import::hf::load(&fixtures().join(name)).unwrap().0;
        let key = |c: &ember_core_model::ModelConfig| {
            let gemma = (c.global_every, c.rope_local_theta, c.attention_softcap, c.logit_softcap, c.norm_placement);
            let mla = (c.attention, c.mla_latent_dim, c.mla_rope_dim, c.mla_q_rank, c.mla_latent_norm);
            (c.qkv_bias(), c.qk_norm, c.head_dim(), c.kv_heads(), c.rope_theta, c.tie_embeddings, c.window, gemma, mla)
        };
        assert_eq!(key(&config), key(&hf), "{name}");
        // DeepSeek's mscale reaches the GGUF as an f32.
        let scale = |c: &ember_core_model::ModelConfig| c.attention_scale.unwrap_or(1.0);
        assert!(
            (scale(&config) / scale(&hf) - 1.0).abs() < 1e-6,
            "{name}: {:?} vs {:?}",
            config.attention_scale,
            hf.attention_scale
        );
        // The same frequencies inside and past the original context, and the same magnitude, however stored (Llama
        // 3's as a rope_freqs tensor; LongRoPE's attention factor as an f32).
        let (dh, theta) = (hf.head_dim(), hf.rope_theta);
        let rotation = |s: &Option<RopeScaling>| -> Vec<f64> {
            let Some(s) = s else { return vec![] };
            let at = |length| (0..dh / 2).map(move |i| s.frequency(i, dh, theta, length));
            at(1).chain(at(64)).chain([s.magnitude()]).collect()
        };
        let (got, want) = (rotation(&config.rope_scaling), rotation(&hf.rope_scaling));
        assert_eq!(got.len(), want.len(), "{name}: {:?} vs {:?}", config.rope_scaling, hf.rope_scaling);
        for (a, b) in got.into_iter().zip(want) {
            assert!((a / b - 1.0).abs() < 1e-6, "{name}: {a} vs {b}");
        }
        let model = CausalLm::load_packed(&config, &weights.dense, &weights.packed, &Device::flex()).unwrap();
        model_matches(name, &model);
    }
}

/// The fixtures scripts/reference/gguf_fixtures.py converts with llama.cpp.
const GGUF_FAMILIES: [&str; 11] = [
    "qwen2-tiny",
    "qwen3-tiny",
    "phi3-tiny",
    "gemma2-tiny",
    "gemma3-tiny",
    "deepseek2-tiny",
    "deepseek2-yarn-tiny",
    "linear-rope-tiny",
    "yarn-rope-tiny",
    "llama3-rope-tiny",
    "longrope-tiny",
];

/// Llama 3.1's RoPE scaling (the head's frequencies in all three of its bands), linear scaling, YaRN, dynamic NTK
/// and Phi-3's LongRoPE, from transformers 5's `rope_parameters`, against its logits over 64 positions: twice the
/// original context of 32 (dynamic NTK and LongRoPE change their frequencies past it).
#[test]
fn every_rope_scaling_matches_hugging_face_past_the_original_context() {
    let scaling = |name: &str| import::hf::load(&fixtures().join(name)).unwrap().0.rope_scaling.unwrap();
    let llama3 = RopeScaling::Llama3 { factor: 4.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_context: 32 };
    assert_eq!(scaling("llama3-rope-tiny"), llama3);
    assert_eq!(scaling("linear-rope-tiny"), RopeScaling::Linear { factor: 4.0 });
    assert_eq!(scaling("dynamic-rope-tiny"), RopeScaling::Dynamic { factor: 4.0, original_context: 32 });
    // Dynamic NTK's max_position_embeddings is the original context; the model serves 4 times as much.
    assert_eq!(import::hf::load(&fixtures().join("dynamic-rope-tiny")).unwrap().0.block_size, 128);
    let RopeScaling::Yarn { factor, original_context, beta_fast, beta_slow, attention_factor } =
        scaling("yarn-rope-tiny")
    else {
        panic!("{:?}", scaling("yarn-rope-tiny"))
    };
    assert_eq!((factor, original_context, beta_fast, beta_slow), (4.0, 32, 32.0, 1.0));
    assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
    // Phi-3 grows its context from 32 to 128: s = 4, attention factor √(1 + ln 4 / ln 32).
    let long = RopeScaling::LongRope {
        short: vec![1.0, 1.25, 1.5, 2.0],
        long: vec![1.0, 3.0, 6.0, 12.0],
        original_context: 32,
        attention_factor: (1.0 + 4f64.ln() / 32f64.ln()).sqrt(),
    };
    assert_eq!(scaling("longrope-tiny"), long);
    for name in ["llama3-rope-tiny", "linear-rope-tiny", "yarn-rope-tiny", "dynamic-rope-tiny", "longrope-tiny"] {
        logits_match(name);
    }
}

/// Tiny MarianMT models (Post-LN, SiLU FFN, Marian's half-sines-half-cosines positions, a final logits bias; one
/// embedding for both sides, or each side its own vocabulary and embedding; scripts/reference/marian_fixture.py) give
/// transformers' logits for teacher-forced decoder inputs against a padded source batch (1e-4).
#[test]
fn marian_logits_match_hugging_face() {
    let device = Device::flex();
    for (name, shape) in
        [("marian-tiny", (83, 0, 83, 84, 84, true)), ("marian-separate-tiny", (2, 0, 2, 61, 51, false))]
    {
        let dir = fixtures().join(name);
        let (config, tensors, m) = import::marian::load(&dir).unwrap();
        assert_eq!((m.decoder_start, m.eos, m.pad, m.src_vocab, m.tgt_vocab, m.shared), shape, "{name}");
        let model = Seq2Seq::load(&config, &tensors, &device).unwrap();
        let (expected, _) = load_tensors(&dir.join("expected.safetensors")).unwrap();
        let ids = |name: &str| -> Tensor<2, Int> {
            let values: Vec<i64> = expected[name].as_slice::<f32>().unwrap().iter().map(|&x| x as i64).collect();
            let shape = expected[name].shape().to_vec();
            Tensor::from_data(TensorData::new(values, [shape[0], shape[1]]), &device)
        };
        let lengths: Vec<usize> =
            expected["src_lengths"].as_slice::<f32>().unwrap().iter().map(|&x| x as usize).collect();
        assert_eq!(lengths, [12, 9]);
        let logits = model.forward(ids("src"), &lengths, ids("tgt")).into_data();
        let want = expected["logits"].as_slice::<f32>().unwrap();
        let diff = ember_test_support::max_abs_diff(logits.as_slice::<f32>().unwrap(), want);
        assert!(diff <= 1e-4, "{name}: max |Ember − HF| = {diff}");
    }
}

#[test]
fn a_directory_that_is_no_model_is_a_clear_error() {
    let err = import::load(&fixtures(), &Device::flex()).err().unwrap().to_string();
    assert!(err.contains("neither an Ember run directory"), "{err}");
    let err = import::load(Path::new("/nonexistent/model.gguf"), &Device::flex()).err().unwrap().to_string();
    assert!(err.ends_with("no such file or directory"), "{err}");
}

/// Shards named in `model.safetensors.index.json` must be files of the model's directory: `..` and absolute paths are
/// refused before anything is opened.
#[test]
fn shards_outside_the_model_directory_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(fixtures().join("gpt2-tiny/config.json"), dir.join("config.json")).unwrap();
    std::fs::copy(fixtures().join("gpt2-tiny/model.safetensors"), root.path().join("outside.safetensors")).unwrap();
    for shard in ["../outside.safetensors", "/etc/passwd"] {
        let index = format!(r#"{{"weight_map": {{"wte.weight": "{shard}"}}}}"#);
        std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
        let err = import::hf::load(&dir).expect_err("refused").to_string();
        assert!(err.contains(&format!("shard {shard:?} is outside the model directory")), "{err}");
    }
}

/// The real SmolLM2-135M-Instruct GGUF (Q4_1, dequantized): `scripts/prepare-data.sh smollm2` fetches it, and
/// scripts/test.sh runs that before the tests.
#[test]
#[ignore = "needs the SmolLM2 GGUF: scripts/prepare-data.sh smollm2 (scripts/test.sh runs it)"]
fn smollm2_gguf_tokenizes_and_continues_greedily_as_hugging_face() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.is_file(), "{} is missing: run scripts/prepare-data.sh smollm2", gguf.display());
    let device = Device::flex();
    let bundle = import::load(&gguf, &device).unwrap();
    let c = &bundle.config;
    assert_eq!((c.n_layers, c.d_model, c.n_heads, c.kv_heads(), c.vocab()), (30, 576, 9, 3, 49152));
    // The chat template and special tokens the file carries: the template transformers' fixture renders, and a
    // rendered `bos_token` tokenizes to the one BOS id, with nothing added by tokenization.
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../formats/tests/fixtures/chat_templates.json");
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    assert_eq!(bundle.chat.template.as_deref(), fixture["templates"]["smollm2"].as_str());
    assert_eq!((bundle.chat.bos_token.as_str(), bundle.chat.eos_token.as_str()), ("<|im_start|>", "<|im_end|>"));
    let bos = bundle.tokenizer.token_to_id("<|im_start|>").unwrap();
    let ids = tokenizer::encode(&bundle.tokenizer, "<|im_start|>user\nHi<|im_end|>").unwrap();
    assert_eq!((ids[0], ids.iter().filter(|&&id| id == bos).count()), (bos, 1), "{ids:?}");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("smollm2_greedy.json")).unwrap()).unwrap();
    for record in expected["records"].as_array().unwrap() {
        let ids = |key: &str| -> Vec<u32> {
            record[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
        };
        let prompt = record["prompt"].as_str().unwrap();
        let mut tokens = tokenizer::encode(&bundle.tokenizer, prompt).unwrap();
        assert_eq!(tokens, ids("prompt_ids"), "tokenization of {prompt:?}");
        let want = ids("greedy_ids");
        for _ in 0..want.len() {
            let n = tokens.len();
            let idx = TensorData::new(tokens.iter().map(|&t| t as i64).collect::<Vec<_>>(), [1, n]);
            let logits = bundle.model.forward(Tensor::<2, Int>::from_data(idx, &device));
            let last = logits.slice([0..1, n - 1..n]).reshape([c.vocab()]);
            tokens.push(last.argmax(0).into_scalar::<i64>() as u32);
        }
        let got = &tokens[tokens.len() - want.len()..];
        let text = tokenizer::decode(&bundle.tokenizer, got).unwrap();
        assert_eq!(got, want.as_slice(), "{prompt:?} continued as {text:?}, Hugging Face: {}", record["greedy_text"]);
    }
}

/// SmolLM2's Q4_1 blocks multiplied as they are (activations quantized to 8 bits per 32 values, as llama.cpp does)
/// continue the README's three prompts greedily as the dequantized f32 weights do. The logits differ by the
/// activations' rounding, compounded over 30 layers: at most 2.0 over all 49,152 logits of every step (measured
/// 1.0–1.5 per prompt; the logits' spread is ~3.5). Where the two picks differ, the f32 logits of the two tokens must
/// be within 0.5 (a near tie: measured 0.22 and 0.16, "The capital of France is" at its sixth token and "Once upon a
/// time," at its fourth), and the prompt is compared up to there.
#[test]
#[ignore = "needs the SmolLM2 GGUF: scripts/prepare-data.sh smollm2 (scripts/test.sh runs it)"]
fn smollm2_native_q4_1_weights_continue_as_the_dequantized_f32_ones() {
    const LOGITS: f32 = 2.0;
    const TIE: f32 = 0.5;
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.is_file(), "{} is missing: run scripts/prepare-data.sh smollm2", gguf.display());
    let device = Device::flex();
    let native = import::load_as(&gguf, &device, WeightFormat::Native).unwrap();
    let f32 = import::load_as(&gguf, &device, WeightFormat::F32).unwrap();
    assert!(matches!(native.model.blocks[0].mlp.c_fc, Projection::Packed(_)), "native weights stay packed");
    assert!(matches!(f32.model.blocks[0].mlp.c_fc, Projection::Dense(_)));
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("smollm2_greedy.json")).unwrap()).unwrap();
    let v = native.config.vocab();
    let last_logits = |model: &CausalLm, tokens: &[u32]| -> Vec<f32> {
        let n = tokens.len();
        let idx = TensorData::new(tokens.iter().map(|&t| t as i64).collect::<Vec<_>>(), [1, n]);
        let logits = model.forward(Tensor::<2, Int>::from_data(idx, &device));
        logits.slice([0..1, n - 1..n]).reshape([v]).into_data().try_to_vec::<f32>().unwrap()
    };
    let argmax = |x: &[f32]| (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
    for record in expected["records"].as_array().unwrap() {
        let prompt = record["prompt"].as_str().unwrap();
        let mut tokens = tokenizer::encode(&native.tokenizer, prompt).unwrap();
        let mut max_diff = 0.0f32;
        let mut same = true;
        for step in 0..16 {
            let (a, b) = (last_logits(&native.model, &tokens), last_logits(&f32.model, &tokens));
            max_diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(max_diff, f32::max);
            let (pick, want) = (argmax(&a), argmax(&b));
            if pick != want {
                let gap = b[want] - b[pick];
                eprintln!("{prompt:?} step {step}: native picks {pick}, f32 {want}, f32 gap {gap:.3}");
                assert!(gap <= TIE, "{prompt:?} step {step}: native picks {pick}, f32 {want}, f32 gap {gap}");
                same = false;
                break;
            }
            tokens.push(want as u32);
        }
        assert!(max_diff <= LOGITS, "{prompt:?}: logits differ by up to {max_diff}");
        eprintln!("{prompt:?}: max |Δ logit| {max_diff:.4}, 16 identical tokens: {same}");
    }
}

/// Gemma 3 270M's Q4_K_M GGUF (`scripts/prepare-data.sh gemma3`) read as transformers reads it
/// (`scripts/reference/gemma3_fixture.py`): the same token ids for four texts (BOS, spaces, digits, bytes outside the
/// vocabulary), and, with the weights dequantized to f32, the last position's logits of the first README prompt within
/// 1e-3 at 64 ids (its 16 largest and 48 spread over the vocabulary) and the same argmax.
#[test]
#[ignore = "needs the Gemma 3 GGUF: scripts/prepare-data.sh gemma3 (scripts/test.sh runs it)"]
fn gemma3_gguf_tokenizes_and_scores_as_hugging_face() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/gemma3/gemma-3-270m-q4_k_m.gguf");
    assert!(gguf.is_file(), "{} is missing: run scripts/prepare-data.sh gemma3", gguf.display());
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma3.json")).unwrap(),
    )
    .unwrap();
    let device = Device::flex();
    let bundle = import::load_as(&gguf, &device, WeightFormat::F32).unwrap();
    let c = &bundle.config;
    assert_eq!((c.n_layers, c.d_model, c.n_heads, c.kv_heads(), c.head_dim(), c.vocab()), (18, 640, 4, 1, 256, 262144));
    assert_eq!(
        (c.layer_window(0), c.layer_window(5), c.layer_rope_theta(0), c.layer_rope_theta(5)),
        (Some(512), None, 1e4, 1e6)
    );
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    for record in fixture["tokens"].as_array().unwrap() {
        let text = record["text"].as_str().unwrap();
        assert_eq!(tokenizer::encode(&bundle.tokenizer, text).unwrap(), ids(&record["ids"]), "{text:?}");
    }
    let want = &fixture["logits"];
    let tokens = tokenizer::encode(&bundle.tokenizer, want["prompt"].as_str().unwrap()).unwrap();
    let n = tokens.len();
    let idx = TensorData::new(tokens.iter().map(|&t| t as i64).collect::<Vec<_>>(), [1, n]);
    let logits = bundle.model.forward(Tensor::<2, Int>::from_data(idx, &device));
    let last = logits.slice([0..1, n - 1..n]).reshape([c.vocab()]).into_data().try_to_vec::<f32>().unwrap();
    let mut worst = 0.0f64;
    for (id, value) in ids(&want["ids"]).iter().zip(want["values"].as_array().unwrap()) {
        worst = worst.max((last[*id as usize] as f64 - value.as_f64().unwrap()).abs());
    }
    assert!(worst <= 1e-3, "logits differ from transformers' by up to {worst}");
    let argmax = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap();
    assert_eq!(argmax as u64, want["argmax"].as_u64().unwrap());
}

/// A copy of the fixture `name` in a temporary directory, with its config.json edited by `edit_config` and its
/// tensors by `edit_tensors`.
fn edited_fixture(
    name: &str,
    edit_config: impl FnOnce(&mut serde_json::Value),
    edit_tensors: impl FnOnce(&mut import::Tensors),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = fixtures().join(name);
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("config.json")).unwrap()).unwrap();
    edit_config(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let (mut tensors, _) = load_tensors(&source.join("model.safetensors")).unwrap();
    edit_tensors(&mut tensors);
    let tensors: Vec<(String, TensorData)> = tensors.into_iter().collect();
    ember_core_model::bundle::save_tensors(&dir.path().join("model.safetensors"), &tensors, Default::default())
        .unwrap();
    dir
}

/// A config.json of fewer layers than the weights, or a wrongly shaped tensor, is an error naming the tensors, not a
/// smaller model or an index panic.
#[test]
fn hugging_face_weights_that_disagree_with_config_json_are_named() {
    for (name, layers) in [("llama-tiny", "num_hidden_layers"), ("gpt2-tiny", "n_layer")] {
        let dir = edited_fixture(name, |c| c[layers] = 1.into(), |_| {});
        let err = import::hf::load(dir.path()).expect_err("refused").to_string();
        assert!(err.contains("are not part of the model config.json describes:"), "{name}: {err}");
        assert!(err.contains(".1."), "{name}: {err}");
    }
    let one_d = |t: &mut import::Tensors| {
        t.insert("model.layers.0.self_attn.q_proj.weight".into(), TensorData::new(vec![0f32; 32], [32]));
    };
    let dir = edited_fixture("llama-tiny", |_| {}, one_d);
    let err = import::hf::load(dir.path()).expect_err("refused").to_string();
    assert!(err.contains("tensor model.layers.0.self_attn.q_proj.weight has shape [32]; the config needs [32, 32]"));
}

/// A weight stored as integers is named with its dtype, not reported missing.
#[test]
fn an_integer_weight_is_named_with_its_dtype() {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = edited_fixture("llama-tiny", |_| {}, |_| {});
    let path = dir.path().join("model.safetensors");
    let (tensors, _) = load_tensors(&path).unwrap();
    let q = "model.layers.0.self_attn.q_proj.weight";
    let bytes: Vec<(String, Vec<u8>, Dtype, Vec<usize>)> = tensors
        .into_iter()
        .map(|(name, data)| {
            let dtype = if name == q { Dtype::I32 } else { Dtype::F32 };
            (name, data.as_bytes().to_vec(), dtype, data.shape().to_vec())
        })
        .collect();
    let views =
        bytes.iter().map(|(name, raw, dtype, shape)| (name, TensorView::new(*dtype, shape.clone(), raw).unwrap()));
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let err = import::hf::load(dir.path()).expect_err("refused").to_string();
    assert!(err.contains(&format!("tensor {q} is I32; Ember reads F32, F16 and BF16 tensors")), "{err}");
}

/// A run directory whose config.toml has fewer layers than its model.safetensors is an error naming the tensors
/// left over.
#[test]
fn a_run_directory_with_more_weights_than_its_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = import::load(&fixtures().join("llama-tiny"), &Device::flex());
    let err = run.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("tokenizer.json"), "the fixture has no tokenizer: {err}");
    let (config, tensors) = import::hf::load(&fixtures().join("llama-tiny")).unwrap();
    let model = CausalLm::load(&config, &tensors, &Device::flex()).unwrap();
    let tok = tokenizer::train_char("abc").unwrap();
    ember_core_model::bundle::save(dir.path(), &config, &model, &tok).unwrap();
    let toml_path = dir.path().join("config.toml");
    let text = std::fs::read_to_string(&toml_path).unwrap().replace("n_layers = 2", "n_layers = 1");
    std::fs::write(&toml_path, text).unwrap();
    let err = import::load(dir.path(), &Device::flex()).err().expect("refused").to_string();
    assert!(err.contains("stored tensor(s) are not parameters of the configured model"), "{err}");
    assert!(err.contains("blocks.1."), "{err}");
}
