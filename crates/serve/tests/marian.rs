//! A MarianMT model imported from transformers (scripts/reference/marian_fixture.py) translates with beam 4 as
//! transformers' generate() does: 20 sources, one at a time and as one padded batch, with one vocabulary for both
//! sides and with one each; both with the canonical search (num_beams=4, length_penalty=0, early_stopping=True) and
//! with the directory's own defaults (generation_config.json: |y|^1 normalisation, early_stopping False, the pad
//! banned, </s> forced at the limit).

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::Build;
use ember_core_model::bundle::load_tensors;
use ember_core_model::import::marian;
use ember_core_model::seq2seq::Seq2Seq;
use ember_formats::generation::{self, EarlyStopping};
use ember_serve::beam::{BeamConfig, Limit, Search, translate_batch};

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
    let (src, lengths) = (values("beam_src"), values("beam_lengths"));
    let (width, out_width) = (expected["beam_src"].shape()[1], expected["beam_out"].shape()[1]);
    // transformers' output after the start token, up to </s> or the padding.
    let outputs = |key: &str| -> Vec<Vec<u32>> {
        values(key)
            .chunks(out_width)
            .map(|row| row.iter().copied().take_while(|&t| t != ids.eos && t != ids.pad).collect())
            .collect()
    };
    let (canonical, defaults) = (outputs("beam_out"), outputs("beam_default"));
    let lengths: Vec<usize> = lengths.iter().map(|&n| n as usize).collect();
    // Some beams end in </s> of their own accord, others run to their limit of the source's length + 4.
    let ended = canonical.iter().zip(&lengths).filter(|(y, n)| y.len() < *n + 4).count();
    assert!(ended > 0 && ended < canonical.len(), "{name}: {ended} of {} end early", canonical.len());
    // The two searches disagree on most sentences, so each rule is held to its own output.
    assert!(canonical.iter().zip(&defaults).filter(|(a, b)| a != b).count() >= 10, "{name}");
    let plain = BeamConfig {
        beam: 4,
        alpha: 0.0,
        search: Search::Fairseq,
        bos: ids.decoder_start,
        eos: ids.eos,
        limit: Limit::PastSource(4),
        banned: Vec::new(),
        forced_eos: false,
    };
    let text = std::fs::read_to_string(dir.join("generation_config.json")).unwrap();
    let g = generation::read(&text, config.tgt_vocab).unwrap();
    assert_eq!((g.num_beams, g.length_penalty, g.early_stopping), (4, 1.0, EarlyStopping::Heuristic));
    let directory = BeamConfig {
        alpha: g.length_penalty,
        search: Search::Transformers(g.early_stopping),
        banned: g.banned,
        forced_eos: g.forced_eos == Some(ids.eos),
        ..plain.clone()
    };
    let rows = |from: usize, n: usize| {
        let values: Vec<i64> = src[from * width..(from + n) * width].iter().map(|&t| i64::from(t)).collect();
        Tensor::<2, Int>::from_data(TensorData::new(values, [n, width]), &device)
    };
    for (beam, want) in [(&plain, &canonical), (&directory, &defaults)] {
        for (i, want) in want.iter().enumerate() {
            let got = translate_batch(&model, rows(i, 1), &lengths[i..=i], beam, &device);
            assert_eq!(&got[0], want, "{name}: sentence {i} with {:?}", beam.search);
        }
        assert_eq!(&translate_batch(&model, rows(0, 20), &lengths, beam, &device), want, "{name}: {:?}", beam.search);
    }
}
