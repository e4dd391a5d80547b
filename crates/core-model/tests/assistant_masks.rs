//! Training masks of rendered chats against transformers' `return_assistant_tokens_mask` (fixture from
//! `scripts/reference/chat_templates.py masks`): every real template that marks the assistant's text with
//! `{% generation %}`, over three chats that end with the assistant's reply, tokenized with SmolLM2's tokenizer — the
//! same text, the same token ids, the same mask. And a template without the markers (SmolLM2's own), whose
//! assistant text is found by rendering incremental prefixes: each reply with its end-of-turn marker.

use std::path::Path;

use ember_core_model::import;
use ember_core_model::tokenizer;
use ember_formats::chat::{ChatTemplate, Json, RenderContext};

fn smollm2() -> (tokenizers::Tokenizer, Option<String>) {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.is_file(), "{} is missing: run scripts/prepare-data.sh smollm2", gguf.display());
    let (_, _, tok, chat) = import::read(&gguf).unwrap();
    (tok, chat.template)
}

/// OpenAI messages as templates see them: each tool call's arguments parsed from their JSON string (keys in order).
fn as_template_sees(messages: &Json) -> Json {
    let mut messages = messages.clone();
    let Json::List(list) = &mut messages else { panic!("messages are a list") };
    for message in list {
        let Json::Map(fields) = message else { continue };
        for (_, calls) in fields.iter_mut().filter(|(k, _)| k == "tool_calls") {
            let Json::List(calls) = calls else { continue };
            for call in calls {
                let Json::Map(call) = call else { continue };
                for (_, function) in call.iter_mut().filter(|(k, _)| k == "function") {
                    let Json::Map(function) = function else { continue };
                    for (key, arguments) in function.iter_mut() {
                        if let (true, Json::Str(text)) = (key == "arguments", &*arguments) {
                            *arguments = serde_json::from_str(text).unwrap();
                        }
                    }
                }
            }
        }
    }
    messages
}

#[test]
#[ignore = "needs the SmolLM2 GGUF and data/chat-templates: scripts/prepare-data.sh smollm2 chat-templates (scripts/test.sh runs them)"]
fn generation_blocks_mask_the_tokens_transformers_masks() {
    let (tok, _) = smollm2();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/assistant_masks.json");
    let text = std::fs::read_to_string(fixture).unwrap();
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    // Tools and chats with their keys in the file's order, as Python's dicts keep them.
    let ordered: Json = serde_json::from_str(&text).unwrap();
    let tools = ordered.get("tools").unwrap();
    let now = chrono::NaiveDateTime::parse_from_str(fixture["now"].as_str().unwrap(), "%Y-%m-%dT%H:%M:%S").unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/chat-templates");
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 12);
    for case in cases {
        let name = format!("{} / {}", case["template"], case["chat"]);
        let template =
            ChatTemplate::new(std::fs::read_to_string(dir.join(case["template"].as_str().unwrap())).unwrap()).unwrap();
        let chat = case["chat"].as_str().unwrap();
        let context = RenderContext {
            bos_token: fixture["bos_token"].as_str().unwrap(),
            eos_token: fixture["eos_token"].as_str().unwrap(),
            add_generation_prompt: false,
            now,
            tools: (chat == "tool call").then_some(tools),
        };
        let (text, spans) = template
            .render_assistant(&as_template_sees(ordered.get("chats").unwrap().get(chat).unwrap()), &context)
            .unwrap();
        assert_eq!(text, case["rendered"].as_str().unwrap(), "{name}");
        let (ids, mask) = tokenizer::assistant_mask(&tok, &text, &spans).unwrap();
        let want_ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        let want_mask: Vec<bool> = case["assistant_masks"].as_array().unwrap().iter().map(|m| m == 1).collect();
        assert_eq!(ids, want_ids, "{name}");
        assert_eq!(mask, want_mask, "{name}");
    }
}

#[test]
#[ignore = "needs the SmolLM2 GGUF: scripts/prepare-data.sh smollm2 (scripts/test.sh runs it)"]
fn without_markers_each_reply_and_its_end_of_turn_are_the_assistants() {
    let (tok, template) = smollm2();
    let template = ChatTemplate::new(template.unwrap()).unwrap();
    let chat: Json = serde_json::from_str(
        r#"[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]"#,
    )
    .unwrap();
    let context = RenderContext {
        bos_token: "",
        eos_token: "",
        add_generation_prompt: false,
        now: Default::default(),
        tools: None,
    };
    let (text, spans) = template.render_assistant(&chat, &context).unwrap();
    let replies: Vec<&str> = spans.iter().map(|s| &text[s.clone()]).collect();
    assert_eq!(replies, ["Hello!<|im_end|>\n", "4<|im_end|>\n"]);
    let (ids, mask) = tokenizer::assistant_mask(&tok, &text, &spans).unwrap();
    let kept: Vec<u32> = ids.iter().zip(&mask).filter(|(_, m)| **m).map(|(&id, _)| id).collect();
    assert_eq!(tokenizer::decode(&tok, &kept).unwrap(), "Hello!<|im_end|>\n4<|im_end|>\n");
    // The end-of-turn token itself is learned.
    assert!(kept.contains(&tok.token_to_id("<|im_end|>").unwrap()));
}
