//! Encoder–decoder decoding with cached cross-attention keys/values (computed once per sentence) and a KV cache for
//! the decoder's self-attention equals full recomputation of the decoder within 1e-5, for the 2017 layout and a
//! Pre-LN / RMSNorm / SwiGLU / RoPE / GQA variant, on a padded batch.

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::config::{FfnKind, NormKind, NormPlacement, PositionKind};
use ember_core_model::seq2seq::{Seq2Seq, Seq2SeqConfig};
use ember_core_model::{Build, ModelConfig, Rng};
use ember_serve::kv::ContiguousCache;

fn configs() -> Vec<Seq2SeqConfig> {
    let paper = ModelConfig::gpt(40, 2, 4, 32, 64).paper_style();
    let modern = ModelConfig {
        norm_placement: NormPlacement::Pre,
        norm: NormKind::RmsNorm,
        ffn: FfnKind::Swiglu,
        positions: PositionKind::Rope,
        n_kv_heads: Some(2),
        tie_embeddings: false,
        ..paper.clone()
    };
    let shared = |model: ModelConfig, share: bool| Seq2SeqConfig {
        model,
        encoder_layers: 2,
        decoder_layers: 3,
        src_vocab: 40,
        tgt_vocab: if share { 40 } else { 37 },
        share_embeddings: share,
        logits_bias: !share,
    };
    vec![shared(paper, true), shared(modern, false)]
}

#[test]
fn cached_decoding_equals_full_recomputation_within_1e_5() {
    let device = Device::flex();
    for config in configs() {
        let model = Seq2Seq::new(&config, &mut Rng::new(8), &device);
        let mut rng = Rng::new(2);
        let src: Vec<i64> = (0..2 * 9).map(|_| rng.below(40) as i64).collect();
        let lengths = [9, 5];
        let src = Tensor::<2, Int>::from_data(TensorData::new(src, [2, 9]), &device);
        let memories = model.encode(src, &lengths);
        let tgt: Vec<i64> = (0..2 * 12).map(|_| rng.below(config.tgt_vocab) as i64).collect();
        let full = model.decode(&memories, Tensor::from_data(TensorData::new(tgt.clone(), [2, 12]), &device));
        let mut cache = ContiguousCache::new(4);
        let mut worst = 0.0f32;
        for t in 0..12 {
            let step: Vec<i64> = (0..2).map(|b| tgt[b * 12 + t]).collect();
            let step = Tensor::<2, Int>::from_data(TensorData::new(step, [2, 1]), &device);
            let cached = model.decode_step(&memories, step, &mut cache);
            let v = cached.dims()[1];
            let reference = full.clone().slice([0..2, t..t + 1, 0..v]).reshape([2, v]);
            worst = worst.max((cached - reference).abs().max().into_scalar::<f32>());
        }
        assert!(worst <= 1e-5, "max |cached − full| = {worst} for {config:?}");
    }
}
