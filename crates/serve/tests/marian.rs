//! A MarianMT model imported from transformers (scripts/reference/marian_fixture.py) translates with beam 4 as
//! transformers' generate(num_beams=4, length_penalty=0, early_stopping=True) does: 20 sources, one at a time and as
//! one padded batch, with one vocabulary for both sides and with one each.

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::Build;
use ember_core_model::bundle::load_tensors;
use ember_core_model::import::marian;
use ember_core_model::seq2seq::Seq2Seq;
use ember_serve::beam::{BeamConfig, translate_batch};

#[test]
fn marian_beam_search_matches_transformers_generate() {
    for name in ["marian-tiny", "marian-separate-tiny"] {
        beam_matches(name);
    }
}

fn beam_matches(name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core-model/tests/fixtures/hf").join(name);
    let device = Device::flex();
    let (config, tensors, ids) = marian::load(&dir).unwrap();
    let model = Seq2Seq::load(&config, &tensors, &device).unwrap();
    let (expected, _) = load_tensors(&dir.join("expected.safetensors")).unwrap();
    let values =
        |name: &str| -> Vec<u32> { expected[name].as_slice::<f32>().unwrap().iter().map(|&x| x as u32).collect() };
    let (src, lengths, out) = (values("beam_src"), values("beam_lengths"), values("beam_out"));
    let (width, out_width) = (expected["beam_src"].shape()[1], expected["beam_out"].shape()[1]);
    // transformers' output after the start token, up to </s> or the padding.
    let want: Vec<Vec<u32>> = out
        .chunks(out_width)
        .map(|row| row.iter().copied().take_while(|&t| t != ids.eos && t != ids.pad).collect())
        .collect();
    // Some beams end in </s>, others run to their limit.
    let ended = out.chunks(out_width).filter(|row| row.contains(&ids.eos)).count();
    assert!(ended > 0 && ended < want.len(), "{name}: {ended} of {} end in </s>", want.len());
    let beam = BeamConfig { beam: 4, alpha: 0.0, bos: ids.decoder_start, eos: ids.eos, extra_len: 4 };
    let rows = |from: usize, n: usize| {
        let values: Vec<i64> = src[from * width..(from + n) * width].iter().map(|&t| i64::from(t)).collect();
        Tensor::<2, Int>::from_data(TensorData::new(values, [n, width]), &device)
    };
    let lengths: Vec<usize> = lengths.iter().map(|&n| n as usize).collect();
    for (i, want) in want.iter().enumerate() {
        let got = translate_batch(&model, rows(i, 1), &lengths[i..=i], beam, &device);
        assert_eq!(&got[0], want, "{name}: sentence {i}");
    }
    assert_eq!(translate_batch(&model, rows(0, 20), &lengths, beam, &device), want);
}
