//! Chat templates: a model's Jinja template rendered over a chat's messages as transformers' `apply_chat_template`
//! renders it — minijinja with Python's string and dict methods, `trim_blocks` and `lstrip_blocks`,
//! `raise_exception`, `strftime_now`, and a `tojson` whose output equals Python's `json.dumps`, keys in the order the
//! request gave them.

use std::fmt::Write;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use minijinja::value::{Enumerator, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::files;

mod python;
use crate::gguf::{Gguf, Value as GgufValue};
use python::{python_repr, tojson};

/// What went wrong with a chat template.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum ChatError {
    #[error("the chat template does not compile: {0}")]
    Syntax(String),
    /// The template's own `raise_exception` (a chat it does not accept: roles out of order, say).
    #[error("the chat template refused the messages: {0}")]
    Refused(String),
    #[error("rendering the chat template failed: {0}")]
    Render(String),
}

/// A JSON value that keeps the order of an object's keys, as Python's dicts do (serde_json's `Value` sorts them).
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Json>),
    Map(Vec<(String, Json)>),
}

impl Json {
    /// The value of `key` in an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value written compactly, keys in their order (as serde_json writes each string and number).
    pub fn to_compact(&self) -> String {
        match self {
            Json::Null => "null".into(),
            Json::Bool(b) => b.to_string(),
            Json::Int(n) => n.to_string(),
            Json::Float(f) => serde_json::to_string(f).unwrap_or_else(|_| "null".into()),
            Json::Str(s) => serde_json::to_string(s).expect("a string serializes"),
            Json::List(items) => format!("[{}]", items.iter().map(Json::to_compact).collect::<Vec<_>>().join(",")),
            Json::Map(entries) => {
                let members: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{}:{}", Json::Str(k.clone()).to_compact(), v.to_compact()))
                    .collect();
                format!("{{{}}}", members.join(","))
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct JsonVisitor;
        impl<'de> Visitor<'de> for JsonVisitor {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
                Ok(Json::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
                Ok(Json::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
                Ok(i64::try_from(v).map_or(Json::Float(v as f64), Json::Int))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
                Ok(Json::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Json, E> {
                Ok(Json::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Json, E> {
                Ok(Json::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Json::List(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut entries: Vec<(String, Json)> = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, Json>()? {
                    // A repeated key keeps its first place and its last value, as Python's json.loads does.
                    match entries.iter_mut().find(|(k, _)| *k == key) {
                        Some(entry) => entry.1 = value,
                        None => entries.push((key, value)),
                    }
                }
                Ok(Json::Map(entries))
            }
        }
        deserializer.deserialize_any(JsonVisitor)
    }
}

/// An object as the template sees it: a mapping that enumerates its keys in their JSON order.
#[derive(Debug)]
struct OrderedMap(Vec<(Value, Value)>);

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.iter().map(|(k, _)| k.clone()).collect())
    }
}

impl From<&Json> for Value {
    fn from(json: &Json) -> Self {
        match json {
            Json::Null => Value::from(()),
            Json::Bool(b) => Value::from(*b),
            Json::Int(i) => Value::from(*i),
            Json::Float(f) => Value::from(*f),
            Json::Str(s) => Value::from(s.as_str()),
            Json::List(items) => Value::from(items.iter().map(Value::from).collect::<Vec<_>>()),
            Json::Map(entries) => Value::from_object(OrderedMap(
                entries.iter().map(|(k, v)| (Value::from(k.as_str()), Value::from(v))).collect(),
            )),
        }
    }
}

/// A model's chat template and the texts of the special tokens templates refer to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatFormat {
    pub template: Option<String>,
    pub bos_token: String,
    pub eos_token: String,
}

impl ChatFormat {
    /// From a GGUF file's metadata: `tokenizer.chat_template`, and the tokens `tokenizer.ggml.bos_token_id` and
    /// `eos_token_id` name.
    pub fn from_gguf(gguf: &Gguf) -> Self {
        let tokens = gguf.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array).and_then(|a| a.strings());
        let token = |key: &str| -> String {
            let id = gguf.get(key).and_then(GgufValue::as_u64).and_then(|id| usize::try_from(id).ok());
            id.and_then(|id| tokens?.iter().nth(id)).unwrap_or_default().to_string()
        };
        Self {
            template: gguf.get("tokenizer.chat_template").and_then(GgufValue::as_str).map(String::from),
            bos_token: token("tokenizer.ggml.bos_token_id"),
            eos_token: token("tokenizer.ggml.eos_token_id"),
        }
    }

    /// From a Hugging Face directory: `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template` (a string,
    /// or a list of named templates of which `default` is the one), and its `bos_token` and `eos_token` (a string or
    /// `{"content": ...}`). A directory with neither file has no template.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, String> {
        let read = |name: &str| -> Result<Option<String>, String> {
            let path = dir.join(name);
            match path.exists() {
                true => files::read_to_string(&path).map(Some).map_err(|e| format!("{}: {e}", path.display())),
                false => Ok(None),
            }
        };
        let mut format = Self::default();
        if let Some(text) = read("tokenizer_config.json")? {
            let config: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| format!("{}: not valid JSON: {e}", dir.join("tokenizer_config.json").display()))?;
            let token = |key: &str| match &config[key] {
                serde_json::Value::String(s) => s.clone(),
                other => other["content"].as_str().unwrap_or_default().to_string(),
            };
            format.bos_token = token("bos_token");
            format.eos_token = token("eos_token");
            format.template = match &config["chat_template"] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Array(named) => {
                    named.iter().find(|t| t["name"] == "default").and_then(|t| t["template"].as_str()).map(String::from)
                }
                _ => None,
            };
        }
        if let Some(template) = read("chat_template.jinja")? {
            format.template = Some(template);
        }
        Ok(format)
    }
}

/// What a template sees beside the messages.
pub struct RenderContext<'a> {
    pub bos_token: &'a str,
    pub eos_token: &'a str,
    /// Whether the prompt ends with the assistant's turn opened (a chat request: yes).
    pub add_generation_prompt: bool,
    /// The time `strftime_now` formats.
    pub now: chrono::NaiveDateTime,
    /// The request's tools (a JSON list of `{"type": "function", "function": ...}`), None without.
    pub tools: Option<&'a Json>,
}

/// A chat template, checked when it is loaded.
pub struct ChatTemplate {
    /// The template as given.
    source: String,
    /// The template as rendered: `{% generation %}` blocks as ifs that note where they start and end.
    compiled: String,
    /// Whether the template marks the assistant's text with `{% generation %}`.
    marks_generation: bool,
}

/// Where a render has got to (bytes written), and the byte ranges of the `{% generation %}` blocks it has rendered.
#[derive(Clone, Default)]
struct Tracker {
    written: Arc<AtomicUsize>,
    spans: Arc<Mutex<Vec<Range<usize>>>>,
}

/// The longest rendered chat, in bytes: far above any model's context, and it bounds what a template from a model file
/// can make a request build (a string repeated millions of times, say).
pub const MAX_PROMPT: usize = 4 << 20;

/// A buffer that refuses to grow past [`MAX_PROMPT`], and tells its length to a [`Tracker`].
struct Capped(Vec<u8>, Arc<AtomicUsize>);

impl std::io::Write for Capped {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + bytes.len() > MAX_PROMPT {
            return Err(std::io::Error::other("the rendered chat is too long"));
        }
        self.0.extend_from_slice(bytes);
        self.1.store(self.0.len(), Ordering::Relaxed);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `raise_exception(message)`: the template refuses the chat; the error's detail starts with this.
const REFUSED: &str = "raise_exception: ";

/// The instructions a render may run: a template comes with a model file, untrusted, and nested loops over
/// `range()` could otherwise keep a request busy for hours; a chat of a thousand messages renders well within it.
pub const FUEL: u64 = 10_000_000;

impl ChatTemplate {
    pub fn new(source: impl Into<String>) -> Result<Self, ChatError> {
        let source = source.into();
        let (compiled, marks_generation) = tracked_generation(&source);
        let template = Self { source, compiled, marks_generation };
        let env = template.environment(chrono::NaiveDateTime::default(), &Tracker::default());
        env.template_from_str(&template.compiled).map_err(|e| ChatError::Syntax(describe(&e)))?;
        Ok(template)
    }

    /// The template's text, as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt: the template rendered over `messages` (a JSON list of `{role, content, ...}` objects).
    pub fn render(&self, messages: &Json, context: &RenderContext) -> Result<String, ChatError> {
        self.render_tracked(messages, context).map(|(text, _)| text)
    }

    /// The chat rendered for training (`context.add_generation_prompt` should be false) and the byte ranges of the
    /// assistant's text in it, the text a model learns to write: the template's `{% generation %}` blocks where it
    /// has them (as transformers' `return_assistant_tokens_mask` reads them); otherwise, for each assistant message
    /// i, what rendering messages[..=i] adds to messages[..i] rendered with the generation prompt: the reply with
    /// its end-of-turn marker (as TRL masks completions). A template whose shorter chats are not prefixes of the
    /// whole (one that rewrites earlier turns) is refused, naming the turn.
    pub fn render_assistant(
        &self,
        messages: &Json,
        context: &RenderContext,
    ) -> Result<(String, Vec<Range<usize>>), ChatError> {
        let (text, spans) = self.render_tracked(messages, context)?;
        if self.marks_generation {
            return Ok((text, spans.into_iter().filter(|s| !s.is_empty()).collect()));
        }
        let Json::List(list) = messages else { return Err(ChatError::Render("messages is not a list".into())) };
        let mut spans = Vec::new();
        for (i, message) in list.iter().enumerate() {
            if message.get("role") != Some(&Json::Str("assistant".into())) {
                continue;
            }
            let prompt = RenderContext { add_generation_prompt: true, ..*context };
            let upto = RenderContext { add_generation_prompt: false, ..*context };
            let before = self.render(&Json::List(list[..i].to_vec()), &prompt)?;
            let after = self.render(&Json::List(list[..=i].to_vec()), &upto)?;
            if !after.starts_with(&before) || !text.starts_with(&after) {
                return Err(ChatError::Render(format!(
                    "the template renders message {i} (the assistant's) differently once later turns follow, so its \
                     text cannot be found for training; mark it with {{% generation %}}"
                )));
            }
            spans.push(before.len()..after.len());
        }
        Ok((text, spans))
    }

    /// [`Self::render`], with the byte ranges of the text its `{% generation %}` blocks wrote.
    fn render_tracked(
        &self,
        messages: &Json,
        context: &RenderContext,
    ) -> Result<(String, Vec<Range<usize>>), ChatError> {
        let tracker = Tracker::default();
        let env = self.environment(context.now, &tracker);
        let template = env.template_from_str(&self.compiled).map_err(|e| ChatError::Syntax(describe(&e)))?;
        // transformers passes `tools` and `documents` as None when a request has none.
        let globals = minijinja::context! {
            messages => Value::from(messages),
            tools => context.tools.map_or(Value::from(()), Value::from),
            documents => Value::from(()),
            bos_token => context.bos_token,
            eos_token => context.eos_token,
            add_generation_prompt => context.add_generation_prompt,
        };
        // minijinja 2.24 panics on some templates (a negative-step slice of an empty sequence indexes past its end):
        // a template comes with a model file, so such a panic is this template's error, not the server's.
        let mut out = Capped(Vec::new(), tracker.written.clone());
        let rendered =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| template.render_captured_to(globals, &mut out)))
                .map_err(|_| ChatError::Render("the template engine failed on this template".into()))?;
        match rendered {
            Ok(_) => {
                let text =
                    String::from_utf8(out.0).map_err(|_| ChatError::Render("the rendered chat is not UTF-8".into()))?;
                let spans = std::mem::take(&mut *tracker.spans.lock().expect("the tracker is not poisoned"));
                Ok((text, spans))
            }
            Err(e) if e.kind() == ErrorKind::WriteFailure => {
                Err(ChatError::Render(format!("the rendered chat is longer than {} MiB", MAX_PROMPT >> 20)))
            }
            Err(e) => Err(match e.detail().and_then(|d| d.strip_prefix(REFUSED)) {
                Some(message) => ChatError::Refused(message.to_string()),
                None => ChatError::Render(describe(&e)),
            }),
        }
    }

    /// The environment transformers renders in: Jinja's whitespace control as `trim_blocks` and `lstrip_blocks`,
    /// Python's methods, and its three additions.
    fn environment(&self, now: chrono::NaiveDateTime, tracker: &Tracker) -> Environment<'_> {
        let mut env = Environment::new();
        let (written, spans) = (tracker.written.clone(), tracker.spans.clone());
        env.add_function(GENERATION_START, move || {
            let at = written.load(Ordering::Relaxed);
            spans.lock().expect("the tracker is not poisoned").push(at..at);
            true
        });
        let (written, spans) = (tracker.written.clone(), tracker.spans.clone());
        env.add_function(GENERATION_END, move || {
            if let Some(span) = spans.lock().expect("the tracker is not poisoned").last_mut() {
                span.end = written.load(Ordering::Relaxed);
            }
            false
        });
        env.set_fuel(Some(FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, format!("{REFUSED}{message}")))
        });
        env.add_function("strftime_now", move |format: String| -> Result<String, Error> {
            let mut out = String::new();
            write!(out, "{}", now.format(&format))
                .map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}")))?;
            Ok(out)
        });
        env.add_filter("tojson", tojson);
        // Jinja's undefined has length 0, and `none` is not iterable; minijinja errs on the one and iterates the other.
        env.add_filter("length", length);
        env.add_filter("count", length);
        // Jinja's undefined is iterable (over nothing), as templates' `type is iterable` checks rely on.
        env.add_test("iterable", |v: &Value| v.is_undefined() || (!v.is_none() && v.try_iter().is_ok()));
        // `string` is Python's str(): a dict or list as its repr.
        env.add_filter("string", |value: &Value| -> Result<String, Error> {
            let mut text = String::new();
            match value.kind() {
                ValueKind::Seq | ValueKind::Map | ValueKind::Number | ValueKind::None | ValueKind::Bool => {
                    python_repr(&mut text, value)?
                }
                _ => text.push_str(&value.to_string()),
            }
            Ok(text)
        });
        env.set_formatter(|out, state, value| match value.kind() {
            ValueKind::Seq | ValueKind::Map | ValueKind::Number => {
                let mut text = String::new();
                python_repr(&mut text, value)?;
                out.write_str(&text).map_err(Error::from)
            }
            _ => minijinja::escape_formatter(out, state, value),
        });
        env
    }
}

/// The functions a compiled `{% generation %}` block calls where it starts and ends.
const GENERATION_START: &str = "__ember_generation_start";
const GENERATION_END: &str = "__ember_generation_end";

/// The template with transformers' `{% generation %}` … `{% endgeneration %}` blocks (which mark the assistant's
/// text for training masks and render their body unchanged) as `{% if start() %}` … `{% if end() %}{% endif %}{%
/// endif %}`, the first tag keeping the opening tag's whitespace control and the last the closing one's, so the text
/// is rendered as before while the two calls note where the block's output starts and ends; and whether there were
/// any.
fn tracked_generation(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    let mut found = false;
    while let Some(start) = rest.find("{%") {
        // The tag's inside runs from after `{%` to the next `%}` (in `{%}` there is none).
        let Some(len) = rest[start + 2..].find("%}") else { break };
        let end = start + 2 + len + 2;
        let tag = &rest[start..end];
        let inner = &rest[start + 2..start + 2 + len];
        let word = inner.trim_start_matches(['-', '+']).trim_end_matches(['-', '+']).trim();
        let (open, close) = (
            &inner[..inner.len() - inner.trim_start_matches(['-', '+']).len()],
            &inner[inner.trim_end_matches(['-', '+']).len()..],
        );
        out.push_str(&rest[..start]);
        match word {
            "generation" => {
                found = true;
                out.push_str(&format!("{{%{open} if {GENERATION_START}() {close}%}}"));
            }
            "endgeneration" => {
                out.push_str(&format!("{{%{open} if {GENERATION_END}() %}}{{% endif %}}{{% endif {close}%}}"));
            }
            _ => out.push_str(tag),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    (out, found)
}

/// `length`: as Jinja's, 0 for an undefined value.
fn length(value: &Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::from(0));
    }
    let kind = value.kind();
    value.len().map(Value::from).ok_or_else(|| {
        Error::new(ErrorKind::InvalidOperation, format!("cannot calculate length of value of type {kind}"))
    })
}

/// An error with its line, as minijinja reports it.
fn describe(e: &Error) -> String {
    match e.line() {
        Some(line) => format!("{e} (line {line})"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> RenderContext<'static> {
        let now = Default::default();
        RenderContext { bos_token: "<s>", eos_token: "</s>", add_generation_prompt: true, now, tools: None }
    }

    #[test]
    fn long_chats_render_and_runaway_templates_stop() {
        let template = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m['role'] + '\\n' + m['content'] }}<|im_end|>\n{% endfor %}",
        )
        .unwrap();
        let message = |i: usize| {
            Json::Map(vec![("role".into(), Json::Str("user".into())), ("content".into(), Json::Str(i.to_string()))])
        };
        let chat = Json::List((0..1000).map(message).collect());
        assert_eq!(template.render(&chat, &context()).unwrap().matches("<|im_end|>").count(), 1000);
        let wide = ChatTemplate::new("{{ messages | tojson(indent=2999999999999999) }}").unwrap();
        assert!(
            matches!(wide.render(&Json::List(vec![]), &context()), Err(ChatError::Render(e)) if e.contains("indent"))
        );
        let huge = ChatTemplate::new("{{ ('abcde' * 3000000, 1) }}").unwrap().render(&Json::List(vec![]), &context());
        assert!(matches!(&huge, Err(ChatError::Render(e)) if e.contains("longer")), "{huge:?}");
        let empty_reversed = ChatTemplate::new("{{ messages[::-1] }}").unwrap().render(&Json::List(vec![]), &context());
        assert!(matches!(empty_reversed, Err(ChatError::Render(_))), "{empty_reversed:?}");
        let runaway =
            ChatTemplate::new("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}");
        let error = runaway.unwrap().render(&Json::List(vec![]), &context()).unwrap_err();
        assert!(matches!(&error, ChatError::Render(e) if e.contains("fuel")), "{error}");
    }

    #[test]
    fn generation_blocks_render_their_body_and_note_where() {
        let (compiled, found) = tracked_generation("a{%- generation -%}b{% endgeneration %}c");
        assert!(found);
        assert_eq!(
            compiled,
            "a{%- if __ember_generation_start() -%}b{% if __ember_generation_end() %}{% endif %}{% endif %}c"
        );
        assert_eq!(tracked_generation("{%}{% x %}{%"), ("{%}{% x %}{%".to_string(), false));
        let template = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>\n{% if m.role == 'assistant' %}{% generation %}{{ m.content }}</s>{% endgeneration %}\n{% else %}{{ m.content }}\n{% endif %}{% endfor %}",
        )
        .unwrap();
        let chat = Json::List(vec![
            Json::Map(vec![("role".into(), Json::Str("user".into())), ("content".into(), Json::Str("hi".into()))]),
            Json::Map(vec![("role".into(), Json::Str("assistant".into())), ("content".into(), Json::Str("yo".into()))]),
        ]);
        let context = RenderContext { add_generation_prompt: false, ..context() };
        let (text, spans) = template.render_assistant(&chat, &context).unwrap();
        assert_eq!(text, "<user>\nhi\n<assistant>\nyo</s>");
        assert_eq!(spans.iter().map(|s| &text[s.clone()]).collect::<Vec<_>>(), ["yo</s>"]);
    }
}
