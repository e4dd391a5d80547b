//! Every GGUF block format Ember reads dequantizes exactly as the `gguf` package (llama.cpp's gguf-py) does: random
//! blocks of each format and the first blocks of each format in SmolLM2's Q4_1 and Gemma 3 270M's Q4_K_M files, from
//! `scripts/reference/gguf_blocks.py`. The tolerance is zero: both compute in f32 in ggml's order of operations.

use ember_formats::ggml;
use serde_json::Value;

#[test]
fn blocks_dequantize_as_gguf_py_does() {
    let text = include_str!("fixtures/gguf_blocks.json");
    let fixture: Value = serde_json::from_str(text).unwrap();
    let mut formats = std::collections::BTreeSet::new();
    for block in fixture["blocks"].as_array().unwrap() {
        let (name, origin) = (block["type"].as_str().unwrap(), block["origin"].as_str().unwrap());
        let format =
            ggml::format(block["ggml_type"].as_u64().unwrap() as u32).unwrap_or_else(|| panic!("{name} is not read"));
        assert_eq!(format.name, name);
        let hex = block["bytes"].as_str().unwrap();
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let expected: Vec<f32> =
            block["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let values = ggml::dequantize(format, &bytes);
        assert_eq!(values.len(), expected.len(), "{name} ({origin})");
        for (i, (a, b)) in values.iter().zip(&expected).enumerate() {
            assert!(a == b, "{name} ({origin}) value {i}: {a} vs gguf-py's {b}");
        }
        formats.insert(name.to_string());
    }
    let all = "BF16 F16 Q4_0 Q4_1 Q4_K Q5_0 Q5_1 Q5_K Q6_K Q8_0";
    assert_eq!(formats.into_iter().collect::<Vec<_>>().join(" "), all);
}

/// Eight positions spread over n values (Fibonacci hashing), as scripts/reference/gguf_tensors.py picks them.
fn positions(n: usize) -> Vec<usize> {
    let mut at: Vec<usize> = (1..=8u64).map(|k| ((k * 2_654_435_761) % n as u64) as usize).collect();
    at.sort_unstable();
    at.dedup();
    at
}

/// Every tensor of SmolLM2's Q4_1 file and Gemma 3 270M's Q4_K_M file (Q4_1, Q5_0, Q4_K, Q6_K, Q8_0, F32) read as
/// gguf-py reads it: the values at eight positions equal, the f64 sum and sum of squares within 1e-9 relative (they
/// are summed in a different order).
#[test]
#[ignore = "needs data/smollm2 and data/gemma3: scripts/prepare-data.sh smollm2 gemma3 (scripts/test.sh runs them)"]
fn every_tensor_of_two_real_files_reads_as_gguf_py_reads_it() {
    let fixture: Value = serde_json::from_str(include_str!("fixtures/gguf_tensors.json")).unwrap();
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data");
    for (file, dir) in [("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"), ("gemma-3-270m-q4_k_m.gguf", "gemma3")] {
        let path = format!("{data}/{dir}/{file}");
        let gguf = ember_formats::gguf::Gguf::parse(std::fs::read(&path).unwrap()).unwrap();
        let expected = fixture["files"][file].as_object().unwrap();
        assert_eq!(gguf.tensors.len(), expected.len(), "{file}");
        for (name, want) in expected {
            let (_, values) = gguf.tensor(name).unwrap();
            assert_eq!(values.len() as u64, want["n"].as_u64().unwrap(), "{file} {name}");
            for sample in want["samples"].as_array().unwrap() {
                let (i, v) = (sample[0].as_u64().unwrap() as usize, sample[1].as_f64().unwrap() as f32);
                assert!(values[i] == v, "{file} {name}[{i}]: {} vs gguf-py's {v}", values[i]);
            }
            assert_eq!(
                positions(values.len()),
                want["samples"].as_array().unwrap().iter().map(|s| s[0].as_u64().unwrap() as usize).collect::<Vec<_>>()
            );
            let (sum, sumsq) = values.iter().fold((0f64, 0f64), |(s, q), &x| (s + x as f64, q + (x as f64).powi(2)));
            for (what, got, want) in [("sum", sum, &want["sum"]), ("sum of squares", sumsq, &want["sumsq"])] {
                let want = want.as_f64().unwrap();
                assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "{file} {name} {what}: {got} vs {want}");
            }
        }
    }
}
