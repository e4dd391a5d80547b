//! Tool calls in chat completions: how a model's template writes them (its family), the grammar a reply follows when
//! a call is required or named, and the calls parsed back out of a reply.
//!
//! Families: Hermes / Qwen (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, the template lists the tools),
//! Llama 3.1+ (a bare `{"name": ..., "parameters": ...}`, the template lists the tools), and a generic JSON fallback
//! for templates that do not render tools (SmolLM2, Gemma): the tools are described in a system message and a call is
//! a JSON object `{"name": ..., "arguments": ...}` (or a list of them).

use ember_formats::chat::Json;
use ember_formats::grammar::{Builder, Grammar};
use ember_formats::schema;
use ember_formats::tools::{ToolChoice, Tools};

/// How a template writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Hermes,
    Llama3,
    Generic,
}

impl Family {
    /// The family of the template `source`.
    pub fn of(source: &str) -> Self {
        if source.contains("<tool_call>") {
            Family::Hermes
        } else if source.contains("<|python_tag|>") || source.contains("\"parameters\": dictionary of argument name") {
            Family::Llama3
        } else {
            Family::Generic
        }
    }

    /// The key a call's arguments sit under.
    fn arguments_key(self) -> &'static str {
        if self == Family::Llama3 { "parameters" } else { "arguments" }
    }

    /// Whether the template itself lists the tools (else a system message describes them).
    pub fn renders_tools(self) -> bool {
        self != Family::Generic
    }
}

/// A request's tools and how its model writes calls.
#[derive(Debug)]
pub struct Plan {
    pub family: Family,
    pub tools: Tools,
}

/// One call parsed from a reply.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as a JSON text (an object).
    pub arguments: String,
}

impl Plan {
    /// `messages` with the tools described in the system message, for a template that does not render tools.
    pub fn with_description(&self, messages: &Json) -> Json {
        let Json::List(list) = messages else { return messages.clone() };
        let functions: Vec<String> = match &self.tools.list {
            Json::List(tools) => tools.iter().map(Json::to_compact).collect(),
            _ => Vec::new(),
        };
        let description = format!(
            "You can call functions. To call one, reply with only a JSON object {{\"name\": <function name>, \
             \"arguments\": <its arguments as a JSON object>}}{}; otherwise answer normally.\n\nFunctions:\n{}",
            if self.tools.parallel { ", or a JSON list of such objects to call several" } else { "" },
            functions.join("\n")
        );
        let mut list = list.clone();
        let system = list.first_mut().and_then(|m| match m {
            Json::Map(entries) if entries.iter().any(|(k, v)| k == "role" && *v == Json::Str("system".into())) => {
                entries.iter_mut().find(|(k, _)| k == "content").map(|(_, v)| v)
            }
            _ => None,
        });
        match system {
            Some(Json::Str(content)) => *content = format!("{content}\n\n{description}"),
            _ => list.insert(
                0,
                Json::Map(vec![
                    ("role".into(), Json::Str("system".into())),
                    ("content".into(), Json::Str(description)),
                ]),
            ),
        }
        Json::List(list)
    }

    /// The grammar of a reply that must call (`required`: any of the functions; named: that one), in the family's
    /// syntax; None when the model may also answer in text (`auto`).
    pub fn grammar(&self) -> Option<Result<Grammar, String>> {
        let names: Vec<&str> = match &self.tools.choice {
            ToolChoice::Auto => return None,
            ToolChoice::Required => self.tools.functions.iter().map(|f| f.name.as_str()).collect(),
            ToolChoice::Named(name) => vec![name.as_str()],
        };
        let key = self.family.arguments_key();
        let calls: Vec<Json> = (self.tools.functions.iter().filter(|f| names.contains(&f.name.as_str())))
            .map(|f| {
                let name = Json::Map(vec![("const".into(), Json::Str(f.name.clone()))]);
                let properties = Json::Map(vec![("name".into(), name), (key.into(), f.parameters.clone())]);
                let required = Json::List(vec![Json::Str("name".into()), Json::Str(key.into())]);
                Json::Map(vec![
                    ("type".into(), Json::Str("object".into())),
                    ("properties".into(), properties),
                    ("required".into(), required),
                ])
            })
            .collect();
        let any = Json::Map(vec![("anyOf".into(), Json::List(calls))]);
        let mut g = Builder::default();
        let build = |g: &mut Builder| -> Result<_, String> {
            let call = schema::rule(g, &any).map_err(|e| format!("the tools' parameters at {e}"))?;
            let (open, close, newline) = (g.literal(b"<tool_call>\n"), g.literal(b"\n</tool_call>"), g.literal(b"\n"));
            let one = match self.family {
                Family::Hermes => g.seq(vec![open, call, close]),
                Family::Llama3 | Family::Generic => call,
            };
            if !self.tools.parallel || self.family == Family::Llama3 {
                return Ok(one);
            }
            let (separator, wrap) = match self.family {
                Family::Hermes => (newline, None),
                _ => (g.literal(b", "), Some((g.literal(b"["), g.literal(b"]")))),
            };
            let next = g.seq(vec![separator, one]);
            let more = g.repeat(next, 0, None);
            let many = g.seq(vec![one, more]);
            Ok(match wrap {
                None => many,
                Some((l, r)) => {
                    let list = g.seq(vec![l, many, r]);
                    g.alt(vec![one, list])
                }
            })
        };
        Some(build(&mut g).and_then(|start| g.build(start).map_err(|e| e.to_string())))
    }

    /// The calls in a reply and the text around them (None when there is none): every `<tool_call>` block
    /// (Hermes), or the whole reply as one call object or a list of them; a call to an unknown function, or not
    /// JSON, leaves the reply as text.
    pub fn parse(&self, reply: &str) -> (Option<String>, Vec<Call>) {
        let text = |t: &str| Some(t.trim()).filter(|t| !t.is_empty()).map(String::from);
        match self.family {
            Family::Hermes => {
                let (mut rest, mut calls, mut outside) = (reply, Vec::new(), String::new());
                while let Some(start) = rest.find("<tool_call>") {
                    let body = &rest[start + "<tool_call>".len()..];
                    let Some(end) = body.find("</tool_call>") else {
                        // A block cut off (at max_tokens) is no call, and no text either.
                        rest = &rest[..start];
                        break;
                    };
                    let Some(call) = serde_json::from_str(body[..end].trim()).ok().and_then(|j| self.call(&j)) else {
                        return (text(reply), Vec::new());
                    };
                    outside.push_str(&rest[..start]);
                    calls.push(call);
                    rest = &body[end + "</tool_call>".len()..];
                }
                outside.push_str(rest);
                if calls.is_empty() { (text(reply), calls) } else { (text(&outside), calls) }
            }
            Family::Llama3 | Family::Generic => {
                let body = reply.trim().trim_start_matches("<|python_tag|>");
                let calls = match serde_json::from_str::<Json>(body) {
                    Ok(Json::List(items)) if !items.is_empty() => items.iter().map(|j| self.call(j)).collect(),
                    Ok(object @ Json::Map(_)) => self.call(&object).map(|c| vec![c]),
                    _ => None,
                };
                match calls {
                    Some(calls) => (None, calls),
                    None => (text(reply), Vec::new()),
                }
            }
        }
    }

    /// A call object `{"name": F, "arguments" | "parameters": {...}}` naming one of the functions.
    fn call(&self, json: &Json) -> Option<Call> {
        let Json::Map(entries) = json else { return None };
        let get = |key: &str| entries.iter().find(|(k, _)| k == key).map(|(_, v)| v);
        let Some(Json::Str(name)) = get("name") else { return None };
        self.tools.functions.iter().find(|f| &f.name == name)?;
        let arguments = get("arguments").or_else(|| get("parameters")).filter(|a| matches!(a, Json::Map(_)))?;
        Some(Call { name: name.clone(), arguments: arguments.to_compact() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_formats::tools::Function;

    fn plan(family: Family, choice: ToolChoice, parallel: bool) -> Plan {
        let parameters: Json = serde_json::from_str(
            r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}"#,
        )
        .unwrap();
        let functions = vec![
            Function { name: "get_weather".into(), parameters: parameters.clone() },
            Function { name: "get_time".into(), parameters },
        ];
        Plan { family, tools: Tools { list: Json::List(vec![]), functions, choice, parallel } }
    }

    #[test]
    fn replies_parse_into_calls_per_family() {
        let hermes = plan(Family::Hermes, ToolChoice::Auto, true);
        let reply = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let (content, calls) = hermes.parse(reply);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["get_weather", "get_time"]);
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(hermes.parse("It is sunny."), (Some("It is sunny.".into()), vec![]));
        let cut = format!("{reply}\n<tool_call>\n{{\"name\": \"get_");
        assert_eq!(hermes.parse(&cut), hermes.parse(reply), "a block cut off is dropped");
        let unknown = "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(hermes.parse(unknown).1, vec![], "an unknown function is text");
        let llama = plan(Family::Llama3, ToolChoice::Auto, false);
        let (content, calls) = llama.parse("{\"name\": \"get_time\", \"parameters\": {\"city\": \"Lima\"}}");
        assert_eq!((content, calls[0].arguments.as_str()), (None, r#"{"city":"Lima"}"#));
        let generic = plan(Family::Generic, ToolChoice::Auto, true);
        let two = r#"[{"name": "get_time", "arguments": {"city": "A"}}, {"name": "get_weather", "arguments": {"city": "B"}}]"#;
        assert_eq!(generic.parse(two).1.len(), 2);
    }

    #[test]
    fn required_and_named_calls_follow_the_family_grammar() {
        let named = plan(Family::Hermes, ToolChoice::Named("get_time".into()), false);
        let g = named.grammar().unwrap().unwrap();
        assert!(g.matches(b"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"));
        assert!(
            !g.matches(b"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>")
        );
        let required = plan(Family::Generic, ToolChoice::Required, true).grammar().unwrap().unwrap();
        assert!(required.matches(br#"{"name": "get_weather", "arguments": {"city": "Rome"}}"#));
        assert!(required.matches(br#"[{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_time", "arguments": {"city": "X"}}]"#));
        assert!(!required.matches(b"Rome is sunny."));
        assert!(plan(Family::Generic, ToolChoice::Auto, true).grammar().is_none());
    }
}
