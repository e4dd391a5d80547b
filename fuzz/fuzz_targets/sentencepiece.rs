#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ember_formats::fuzz::sentencepiece(data));
