//! Prompt scoring for evaluation harnesses: completions `echo` with the prompt tokens' log-probabilities (what
//! lm-evaluation-harness's `local-completions` reads for every log-likelihood task), prompts as token ids or lists,
//! `max_tokens` 0, and `/tokenizer_info`; SmolLM2's scores against transformers'.

mod common;

use common::server::{Server, events, tiny_model};
use serde_json::{Value, json};

/// The `token_logprobs` of a completions choice, the first (null for an echoed prompt) as None.
fn token_logprobs(choice: &Value) -> Vec<Option<f64>> {
    choice["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(Value::as_f64).collect()
}

/// An echoed prompt comes back as it was sent, its first token without a log-probability and every later token with
/// the log-probability the model gives it after those before: scoring a prompt and its greedy continuation gives
/// the continuation's tokens the logprobs generation reported for them. Token-id prompts score as their text does,
/// a list of prompts answers one choice per prompt (and per `n`), and streaming gives the prompt back first.
#[test]
fn echo_scores_the_prompt_as_generation_scores_its_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let server = Server::start(&run);
    let p0 = prompts[0].as_str();

    let generated = server.complete(json!({"prompt": p0, "max_tokens": 6, "temperature": 0, "logprobs": 2}));
    let continuation = generated["choices"][0]["text"].as_str().unwrap();
    let whole = format!("{p0}{continuation}");
    let scored = server.complete(json!({"prompt": whole, "max_tokens": 0, "echo": true, "logprobs": 2}));
    let choice = &scored["choices"][0];
    assert_eq!(choice["text"], whole.as_str());
    assert_eq!(choice["finish_reason"], "length");
    let lp = token_logprobs(choice);
    assert_eq!(lp.len(), whole.chars().count(), "one character per token");
    assert_eq!((lp[0], &choice["logprobs"]["top_logprobs"][0]), (None, &Value::Null));
    assert!(lp[1..].iter().all(|p| p.is_some_and(|p| p <= 0.0)), "{lp:?}");
    let tokens: Vec<&str> =
        choice["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.concat(), whole);
    let generated_lp = token_logprobs(&generated["choices"][0]);
    let n = p0.chars().count();
    for (i, want) in generated_lp.iter().enumerate() {
        let (got, want) = (lp[n + i].unwrap(), want.unwrap());
        assert!((got - want).abs() < 1e-5, "token {i}: scored {got}, generated {want}");
        let top = choice["logprobs"]["top_logprobs"][n + i].as_object().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[tokens[n + i]].as_f64().unwrap(), got, "greedy tokens are the most likely");
    }
    assert_eq!(scored["usage"], json!({"prompt_tokens": n + 6, "completion_tokens": 0, "total_tokens": n + 6}));

    // The same prompt as token ids, beside a second prompt, two choices each; echo then continues the prompt.
    let (_, ids) = server.request("POST", "/tokenize", Some(&json!({"prompt": whole, "add_special_tokens": false})));
    let ids = serde_json::from_str::<Value>(&ids).unwrap()["tokens"].clone();
    let p1 = prompts[1].as_str();
    let both = server.complete(json!({"prompt": [ids, p1], "max_tokens": 3, "echo": true, "logprobs": 1, "n": 2,
                                      "temperature": 0}));
    let choices = both["choices"].as_array().unwrap();
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    let greedy = |prompt: &str| server.complete(json!({"prompt": prompt, "max_tokens": 3, "temperature": 0}));
    for (choice, prompt) in choices.iter().zip([&whole, &whole, &p1.to_string(), &p1.to_string()]) {
        let text = format!("{prompt}{}", greedy(prompt)["choices"][0]["text"].as_str().unwrap());
        assert_eq!(choice["text"], text.as_str());
    }
    for (from_ids, from_text) in token_logprobs(&choices[0]).iter().zip(&lp) {
        assert_eq!(from_ids.map(|p| (p * 1e5).round()), from_text.map(|p| (p * 1e5).round()));
    }
    let prompt_tokens = whole.chars().count() + p1.chars().count();
    assert_eq!(both["usage"]["prompt_tokens"], prompt_tokens, "each prompt counted once");

    let stream = json!({"prompt": p1, "max_tokens": 3, "echo": true, "temperature": 0, "stream": true});
    let (chunks, done) = events(&server.request("POST", "/v1/completions", Some(&stream)).1);
    assert!(done);
    assert_eq!(chunks[0]["choices"][0]["text"], p1, "the prompt comes first");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, format!("{p1}{}", greedy(p1)["choices"][0]["text"].as_str().unwrap()));

    let refused = |body: Value, says: &str| {
        let (status, text) = server.request("POST", "/v1/completions", Some(&body));
        assert_eq!(status, 400, "{text}");
        assert!(text.contains(says), "{text}");
    };
    refused(json!({"prompt": p0, "max_tokens": 0}), "0 only scores the prompt, with echo");
    refused(json!({"prompt": [[]], "echo": true}), "the prompt encodes to no tokens");
    refused(json!({"prompt": [9999], "echo": true}), "past the model's vocabulary");

    let (status, info) = server.request("GET", "/tokenizer_info", None);
    assert_eq!(status, 200, "{info}");
    let info: Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["model_max_length"], 32);
    assert!(info.as_object().unwrap().contains_key("eos_token"), "{info}");
}

/// SmolLM2-135M-Instruct (its GGUF's weights dequantized, as transformers runs them) scores three prompts as
/// transformers does (scripts/reference/prompt_logprobs.py): the same token ids, and each token's log-probability
/// within 1e-3 (f32 sums in another order over 30 layers).
#[test]
#[ignore = "needs the SmolLM2 GGUF: scripts/prepare-data.sh smollm2 (scripts/test.sh runs it)"]
fn smollm2_scores_prompts_as_transformers_does() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2_prompt_logprobs.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let server = Server::start_with(&common::smollm2(), &["--weights", "f32"]);
    for record in fixture["records"].as_array().unwrap() {
        let (_, ids) = server.request("POST", "/tokenize", Some(&json!({"prompt": record["prompt"]})));
        assert_eq!(serde_json::from_str::<Value>(&ids).unwrap()["tokens"], record["ids"], "{}", record["prompt"]);
        let scored = server.complete(json!({"prompt": record["ids"], "max_tokens": 0, "echo": true, "logprobs": 1}));
        let choice = &scored["choices"][0];
        assert_eq!(choice["text"], record["prompt"]);
        let got = token_logprobs(choice);
        let want: Vec<f64> = record["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(got.len(), want.len() + 1);
        for (t, (got, want)) in got[1..].iter().zip(&want).enumerate() {
            let got = got.unwrap();
            assert!((got - want).abs() < 1e-3, "{:?} token {t}: Ember {got}, transformers {want}", record["prompt"]);
        }
        for (t, best) in choice["logprobs"]["top_logprobs"].as_array().unwrap()[1..].iter().enumerate() {
            let best = best.as_object().unwrap().values().next().unwrap().as_f64().unwrap();
            let want = record["top_logprobs"][t].as_f64().unwrap();
            assert!(
                (best - want).abs() < 1e-3,
                "{:?} position {t}: best {best}, transformers {want}",
                record["prompt"]
            );
        }
    }
}
