//! Chat fine-tuning's loss against TRL's SFTTrainer (assistant_only_loss) on the same batch: a tiny random Llama,
//! four conversations rendered with a template that marks the assistant's turns with `{% generation %}`
//! (fixture from scripts/reference/sft_loss.py). The same token ids, the same assistant masks, the same loss within
//! 1e-4.

use std::path::Path;

use burn::tensor::Device;
use ember_core_model::{Build, CausalLm, import};
use ember_train::chats::{self, Example};
use ember_train::loss::lm_loss;

#[test]
fn the_chat_loss_is_trls() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sft-llama-tiny");
    let (config, weights, tok, chat) = import::read(&dir).unwrap();
    let device = Device::flex();
    let model = CausalLm::load_packed(&config, &weights.dense, &weights.packed, &device).unwrap();
    let examples = chats::examples(&dir.join("chats.jsonl"), &tok, &chat, config.block_size).unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let want = expected["examples"].as_array().unwrap();
    assert_eq!(examples.len(), want.len());
    for (i, (got, want)) in examples.iter().zip(want).enumerate() {
        let ids: Vec<u32> = serde_json::from_value(want["input_ids"].clone()).unwrap();
        let mask: Vec<bool> = want["assistant_masks"].as_array().unwrap().iter().map(|m| m == 1).collect();
        assert_eq!(got, &Example { ids, learned: mask }, "conversation {i}");
    }
    let longest = examples.iter().map(|e| e.ids.len()).max().unwrap();
    let rows: Vec<&Example> = examples.iter().collect();
    let (batch, mask) = chats::batch(&rows, longest - 1, &device);
    let loss = lm_loss(model.forward(batch.x), batch.y, Some(mask)).into_scalar::<f32>() as f64;
    let trl = expected["trl_loss"].as_f64().unwrap();
    assert!((loss - trl).abs() < 1e-4, "Ember {loss} vs TRL {trl}");
}
