#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // ChatTemplate::render turns the template engine's panics into errors (catch_unwind); libFuzzer's panic hook
    // would abort before they unwind to it. A panic nothing catches still aborts at the fuzzer's C boundary.
    std::panic::set_hook(Box::new(|_| {}));
    ember_formats::fuzz::chat_template(data)
});
