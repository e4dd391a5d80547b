//! Chat templates rendered as transformers renders them, byte for byte: SmolLM2's template (from its GGUF) and
//! templates that use whitespace control, Python's methods, namespace(), loop variables, slicing, tojson with its
//! options, strftime_now and raise_exception, over four chats with and without the generation prompt. The fixture is
//! `scripts/reference/chat_template_fixture.py`'s output.

use ember_formats::chat::{ChatError, ChatTemplate, Context, Json};

fn field<'a>(json: &'a Json, key: &str) -> &'a Json {
    match json {
        Json::Map(entries) => &entries.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key}")).1,
        _ => panic!("{key}: not an object"),
    }
}

fn text(json: &Json) -> &str {
    match json {
        Json::Str(s) => s,
        other => panic!("{other:?} is not a string"),
    }
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates.json");
    let fixture: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let now = chrono::NaiveDateTime::parse_from_str(text(field(&fixture, "now")), "%Y-%m-%dT%H:%M:%S").unwrap();
    let (bos, eos) = (text(field(&fixture, "bos_token")), text(field(&fixture, "eos_token")));
    let Json::List(cases) = field(&fixture, "cases") else { panic!("cases") };
    assert_eq!(cases.len(), 32);
    for case in cases {
        let (name, chat) = (text(field(case, "template")), text(field(case, "chat")));
        let source = text(field(field(&fixture, "templates"), name));
        let messages = field(field(&fixture, "chats"), chat);
        let add_generation_prompt = matches!(field(case, "add_generation_prompt"), Json::Bool(true));
        let context = Context { bos_token: bos, eos_token: eos, add_generation_prompt, now };
        let label = format!("{name} over {chat:?}, generation prompt {add_generation_prompt}");
        let Json::Map(entries) = case else { panic!("a case") };
        let (kind, expected) =
            entries.iter().find(|(k, _)| k != "template" && k != "chat" && k != "add_generation_prompt").unwrap();
        match kind.as_str() {
            "rendered" => {
                let got = ChatTemplate::new(source).and_then(|t| t.render(messages, &context));
                assert_eq!(got.as_deref(), Ok(text(expected)), "{label}");
            }
            "refused" => {
                let got = ChatTemplate::new(source).unwrap().render(messages, &context);
                assert_eq!(got, Err(ChatError::Refused(text(expected).to_string())), "{label}");
            }
            _ => assert!(matches!(ChatTemplate::new(source), Err(ChatError::Syntax(_))), "{label}"),
        }
    }
}
