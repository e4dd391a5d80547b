//! The translation commands end to end on real data (the first 600 English–Spanish verse pairs, a tiny model):
//! `ember train` on a `[seq2seq]` config writes checkpoints and BLEU metrics, `ember translate` keeps input order and
//! maps an empty line to an empty line, cuts an over-long line with a warning, and gives the same greedy output on
//! wgpu as on the CPU; `ember average` and `ember eval --model --data` work on the run; bad input is reported.

mod common;

use common::*;

#[test]
fn train_translate_average_and_evaluate() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let config = tiny_translation_config(dir.path(), &run);
    let out = ember(&["--device", "cpu", "train", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("val BLEU") && stdout.contains("BLEU = "), "{stdout}");
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("val_bleu") && metrics.contains("val_loss"), "{metrics}");
    let kept: Vec<_> = std::fs::read_dir(run.join("checkpoints")).unwrap().collect();
    assert_eq!(kept.len(), 3, "the last 3 checkpoints are kept");

    // Input order, empty lines, and an over-long line cut with a warning.
    let long = "and the word ".repeat(60);
    let input = dir.path().join("input.txt");
    std::fs::write(
        &input,
        format!("In the beginning God created the heaven and the earth.\n\n{long}\nAnd God saw the light.\n"),
    )
    .unwrap();
    let translate = |device: &str, beam: &str| {
        let args =
            ["--device", device, "translate", "--model", run.to_str().unwrap(), "--input", input.to_str().unwrap()];
        let out = ember(&[&args[..], &["--beam", beam]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (greedy_cpu, warnings) = translate("cpu", "1");
    let lines: Vec<&str> = greedy_cpu.lines().collect();
    assert_eq!(lines.len(), 4, "{greedy_cpu}");
    assert_eq!(lines[1], "", "an empty line translates to an empty line");
    assert!(!lines[0].is_empty() && !lines[3].is_empty(), "{greedy_cpu}");
    assert!(warnings.contains("line 3") && warnings.contains("cut"), "{warnings}");
    let (beam_cpu, _) = translate("cpu", "4");
    assert_eq!(beam_cpu.lines().count(), 4);
    if ember_test_support::wgpu_test_device().is_some() {
        let (greedy_gpu, _) = translate("wgpu", "1");
        assert_eq!(greedy_gpu, greedy_cpu, "greedy translations on wgpu and on the CPU");
    }

    let averaged = dir.path().join("averaged");
    let out = ember(&["average", "--model", run.to_str().unwrap(), "--last", "3", "--out", averaged.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = dir.path().join("valid.tsv");
    let out =
        ember(&["--device", "cpu", "eval", "--model", averaged.to_str().unwrap(), "--data", data.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("BLEU = "), "{out:?}");

    assert_clean_error(&ember(&["average", "--model", run.to_str().unwrap(), "--last", "9"]), "holds 3 checkpoints");
}

/// A test set that cannot be read fails the run before its first step, not after its last; a training line without
/// a tab is named with its number.
#[test]
fn a_missing_test_set_and_a_tsv_line_without_a_tab_are_reported_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let config = tiny_translation_config(dir.path(), &run);
    let set = format!("data.test=\"{}\"", dir.path().join("absent.tsv").display());
    let out = ember(&["--device", "cpu", "train", "--config", config.to_str().unwrap(), "--set", &set]);
    assert_clean_error(&out, "absent.tsv");
    assert!(!run.join("checkpoint.safetensors").exists(), "no step was trained");
    let train = dir.path().join("train.tsv");
    let mut text = std::fs::read_to_string(&train).unwrap();
    text.push_str("a line with no tab\n");
    std::fs::write(&train, text).unwrap();
    let out = ember(&["--device", "cpu", "train", "--config", config.to_str().unwrap()]);
    assert_clean_error(&out, "train.tsv:601: no tab between source and target");
}

#[test]
fn separate_vocabularies_give_each_side_its_own_bpe_and_embedding() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let config = tiny_translation_config(dir.path(), &run);
    let config = config.to_str().unwrap();
    let separate = ["--set", "data.joint_vocab=false", "--set", "train.max_steps=6"];

    // One embedding cannot serve two vocabularies.
    let out = ember(&[&["--device", "cpu", "train", "--config", config], &separate[..]].concat());
    assert_clean_error(&out, "seq2seq.share_embeddings");

    let unshared = ["--set", "seq2seq.share_embeddings=false"];
    let out = ember(&[&["--device", "cpu", "train", "--config", config], &separate[..], &unshared[..]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(source) and"), "{out:?}");
    let source = std::fs::read_to_string(run.join("source_tokenizer.json")).unwrap();
    let target = std::fs::read_to_string(run.join("tokenizer.json")).unwrap();
    assert_ne!(source, target, "English and Spanish BPEs differ");
    let weights = std::fs::read(run.join("model.safetensors")).unwrap();
    let header_len = u64::from_le_bytes(weights[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8_lossy(&weights[8..8 + header_len]);
    assert!(header.contains("\"src_emb.weight\"") && header.contains("\"tgt_emb.weight\""), "{header}");

    // Averaging keeps both vocabularies, and the averaged run translates and scores.
    let averaged = dir.path().join("averaged");
    let out = ember(&["average", "--model", run.to_str().unwrap(), "--last", "2", "--out", averaged.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(averaged.join("source_tokenizer.json").exists());
    let data = dir.path().join("valid.tsv");
    let out =
        ember(&["--device", "cpu", "eval", "--model", averaged.to_str().unwrap(), "--data", data.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("BLEU = "), "{out:?}");
}

/// A MarianMT directory (scripts/reference/marian_fixture.py: OPUS-MT's layout, SentencePiece source and target
/// models with one vocab.json or one per side, a tiny model trained on ten English–Spanish pairs, an OPUS-MT
/// generation_config.json) translates 20 sentences with the directory's defaults exactly as transformers'
/// MarianTokenizer and generate() do; `ember eval` scores it on the same pairs; `ember inspect` counts the parameters
/// transformers does.
#[test]
fn a_marian_directory_translates_as_transformers() {
    for name in ["marian-tiny", "marian-separate-tiny"] {
        marian_translates(name);
    }
}

fn marian_translates(name: &str) {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core-model/tests/fixtures/hf").join(name);
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("translations.json")).unwrap()).unwrap();
    let cases = expected.as_array().unwrap();
    let (sources, want): (Vec<&str>, Vec<&str>) =
        cases.iter().map(|c| (c["source"].as_str().unwrap(), c["translation"].as_str().unwrap())).unzip();
    assert_eq!(sources.len(), 20);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.txt");
    std::fs::write(&input, sources.join("\n") + "\n").unwrap();
    let args = ["translate", "--model", model.to_str().unwrap(), "--input", input.to_str().unwrap()];
    let out = ember(&[&["--device", "cpu"][..], &args[..]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = String::from_utf8(out.stdout).unwrap();
    assert_eq!(got.lines().collect::<Vec<_>>(), want, "{name}");
    let pairs = dir.path().join("pairs.tsv");
    let tsv: Vec<String> = sources.iter().zip(&want).map(|(s, t)| format!("{s}\t{t}")).collect();
    std::fs::write(&pairs, tsv.join("\n") + "\n").unwrap();
    let eval = ["eval", "--model", model.to_str().unwrap(), "--data", pairs.to_str().unwrap()];
    let out = ember(&[&["--device", "cpu"][..], &eval[..]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(report.starts_with("BLEU = 100.00") && report.contains("beam 4, lenpen 1)"), "{report}");
    // transformers' num_parameters() (49,536 and 50,432) counts its two fixed sinusoidal tables (2 × 64 × 32, which
    // Ember computes) and not the final logits bias (a buffer there: 84 and 51).
    let total = match name {
        "marian-tiny" => "45,524",
        _ => "46,387",
    };
    let out = ember(&["inspect", "--model", model.to_str().unwrap()]);
    let report = String::from_utf8(out.stdout).unwrap();
    let line = report.lines().find(|l| l.trim_start().starts_with("total")).unwrap_or_default();
    assert_eq!(line.split_whitespace().last(), Some(total), "{report}");
}

/// A MarianMT directory with a broken part is one error line naming the part: a SentencePiece model that is not one,
/// a vocabulary id past the model's embeddings, a config Ember's encoder–decoder cannot run.
#[test]
fn a_broken_marian_directory_is_a_clear_error() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../core-model/tests/fixtures/hf/marian-tiny");
    let translate = |edit: &dyn Fn(&std::path::Path)| {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&fixture).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
        edit(dir.path());
        let input = dir.path().join("input.txt");
        std::fs::write(&input, "the cat sits on the mat\n").unwrap();
        let model = dir.path().to_str().unwrap().to_string();
        ember(&["--device", "cpu", "translate", "--model", &model, "--input", input.to_str().unwrap()])
    };
    let truncated = |dir: &std::path::Path| {
        let spm = std::fs::read(dir.join("source.spm")).unwrap();
        std::fs::write(dir.join("source.spm"), &spm[..spm.len() / 2]).unwrap();
    };
    assert_clean_error(&translate(&truncated), "source.spm");
    let past = |dir: &std::path::Path| {
        let text = std::fs::read_to_string(dir.join("vocab.json")).unwrap();
        std::fs::write(dir.join("vocab.json"), text.replacen("\"<unk>\": 1", "\"<unk>\": 5000", 1)).unwrap();
    };
    assert_clean_error(&translate(&past), "\"<unk>\" has id 5000, past the model's 84 tokens");
    let pre_norm = |dir: &std::path::Path| {
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        std::fs::write(dir.join("config.json"), text.replacen("{", "{\"normalize_before\": true,", 1)).unwrap();
    };
    assert_clean_error(&translate(&pre_norm), "normalize_before = true is not supported");
    let penalised = |dir: &std::path::Path| {
        let text = std::fs::read_to_string(dir.join("generation_config.json")).unwrap();
        let text = text.replacen("{", "{\"repetition_penalty\": 1.3,", 1);
        std::fs::write(dir.join("generation_config.json"), text).unwrap();
    };
    assert_clean_error(&translate(&penalised), "generation_config.json: repetition_penalty = 1.3 is not supported");
}
