//! The encoder–decoder model against PyTorch's torch.nn.Transformer (Post-LN, ReLU, shared tied embeddings scaled by
//! √d, sinusoidal positions; fixture from `scripts/reference/seq2seq_fixture.py`): logits of a padded batch equal
//! within 1e-4 with the same weights.

use std::path::Path;

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::bundle::load_tensors;
use ember_core_model::seq2seq::{Seq2Seq, Seq2SeqConfig};
use ember_core_model::{Build, ModelConfig, Rng};
use serde_json::Value;

fn fixture() -> (Value, std::path::PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/seq2seq");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    (json, dir.join("model.safetensors"))
}

/// The 2017 layout at the fixture's size: Post-LN, ReLU FFN, sinusoidal positions, one tied embedding.
fn paper_config(vocab: usize, d: usize, heads: usize, d_ff: usize, layers: usize) -> Seq2SeqConfig {
    let model =
        ModelConfig { d_ff: Some(d_ff), dropout: 0.0, ..ModelConfig::gpt(vocab, layers, heads, d, 64).paper_style() };
    Seq2SeqConfig::joint(model, layers, layers, vocab)
}

fn ids(v: &Value) -> (Vec<i64>, [usize; 2]) {
    let rows: Vec<Vec<i64>> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect())
        .collect();
    let shape = [rows.len(), rows[0].len()];
    (rows.concat(), shape)
}

#[test]
fn logits_equal_torch_nn_transformer_within_1e_4() {
    let (json, weights) = fixture();
    let n = |k: &str| json[k].as_u64().unwrap() as usize;
    let config = paper_config(n("vocab"), n("d_model"), n("n_heads"), n("d_ff"), n("layers"));
    let device = Device::flex();
    let (tensors, _) = load_tensors(&weights).unwrap();
    let model = Seq2Seq::load(&config, &tensors, &device).unwrap();
    let ((src, src_shape), (tgt, tgt_shape)) = (ids(&json["src"]), ids(&json["tgt"]));
    let lengths: Vec<usize> =
        json["src_lengths"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let src = Tensor::<2, Int>::from_data(TensorData::new(src, src_shape), &device);
    let tgt = Tensor::<2, Int>::from_data(TensorData::new(tgt, tgt_shape), &device);
    let logits = model.forward(src, &lengths, tgt).into_data().try_to_vec::<f32>().unwrap();
    let expected: Vec<f32> = json["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            s.as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32))
        })
        .collect();
    let diff = ember_test_support::max_abs_diff(&logits, &expected);
    let scale = expected.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(diff <= 1e-4, "max |ember − torch| = {diff} (logits up to {scale})");
}

#[test]
fn attention_dropout_acts_while_training_only() {
    let mut config = paper_config(40, 16, 2, 32, 1);
    config.model.attention_dropout = 0.5;
    let run = |device: &Device| {
        let model = Seq2Seq::new(&config, &mut Rng::new(0), device);
        let src = Tensor::<2, Int>::from_data(TensorData::new(vec![5i64, 6, 7, 8, 9, 2], [1, 6]), device);
        let tgt = Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 10, 11, 12], [1, 4]), device);
        let logits = |model: &Seq2Seq| model.forward(src.clone(), &[6], tgt.clone()).into_data();
        (logits(&model), logits(&model))
    };
    let (a, b) = run(&Device::flex());
    assert_eq!(a, b, "no dropout at inference");
    let (a, b) = run(&Device::flex().autodiff());
    assert_ne!(a, b, "attention probabilities are dropped while training");
}
