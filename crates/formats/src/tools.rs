//! The tools of a chat request (`tools`, `tool_choice`, `parallel_tool_calls`), validated: functions with names and
//! JSON-schema parameters, the choice among them, and the earlier turns' tool calls with their arguments as JSON
//! objects, as chat templates read them.

use crate::chat::Json;

/// A request's tools that cannot be taken: the field, and why.
#[derive(Debug, PartialEq)]
pub struct Invalid {
    pub param: &'static str,
    pub message: String,
}

/// A function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    /// A JSON schema of its arguments (an object).
    pub parameters: Json,
}

/// Whether and which function the reply must call.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// The model decides: a reply is parsed for calls.
    Auto,
    /// The reply is one or more calls.
    Required,
    /// The reply calls this function.
    Named(String),
}

/// A request's tools: the list as given (for the chat template), its functions, and the choice.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub list: Json,
    pub functions: Vec<Function>,
    pub choice: ToolChoice,
    /// Several calls in one reply (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

fn field<'j>(fields: &'j [(String, Json)], key: &str) -> Option<&'j Json> {
    fields.iter().find(|(k, _)| k == key).map(|(_, v)| v).filter(|v| **v != Json::Null)
}

/// The tools of a chat request's fields; None without tools or with `tool_choice: "none"`.
pub fn parse(fields: &[(String, Json)]) -> Result<Option<Tools>, Invalid> {
    let bad = |param: &'static str, what: String| Invalid { param, message: format!("{param}: {what}") };
    let choice = match field(fields, "tool_choice") {
        None => None,
        Some(Json::Str(c)) if c == "none" => return Ok(None),
        Some(Json::Str(c)) if c == "auto" => Some(ToolChoice::Auto),
        Some(Json::Str(c)) if c == "required" => Some(ToolChoice::Required),
        Some(Json::Map(named)) => match field(named, "function").map(|f| match f {
            Json::Map(f) => field(f, "name"),
            _ => None,
        }) {
            Some(Some(Json::Str(name))) => Some(ToolChoice::Named(name.clone())),
            _ => {
                return Err(bad(
                    "tool_choice",
                    "a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}".into(),
                ));
            }
        },
        Some(_) => {
            return Err(bad("tool_choice", "must be \"none\", \"auto\", \"required\" or a named function".into()));
        }
    };
    let parallel = match field(fields, "parallel_tool_calls") {
        None => true,
        Some(Json::Bool(b)) => *b,
        Some(_) => return Err(bad("parallel_tool_calls", "must be a boolean".into())),
    };
    let list = match field(fields, "tools") {
        None if choice.is_some() => return Err(bad("tool_choice", "needs tools".into())),
        None => return Ok(None),
        Some(list @ Json::List(items)) if !items.is_empty() => list.clone(),
        Some(_) => {
            return Err(bad("tools", "must be a non-empty list of {\"type\": \"function\", \"function\": ...}".into()));
        }
    };
    let Json::List(items) = &list else { unreachable!("matched a list") };
    let mut functions: Vec<Function> = Vec::new();
    for (i, tool) in items.iter().enumerate() {
        let at = |what: &str| bad("tools", format!("[{i}]: {what}"));
        let Json::Map(tool) = tool else { return Err(at("must be an object")) };
        if !matches!(field(tool, "type"), Some(Json::Str(t)) if t == "function") {
            return Err(at("type must be \"function\""));
        }
        let Some(Json::Map(function)) = field(tool, "function") else { return Err(at("has no function object")) };
        let name = match field(function, "name") {
            Some(Json::Str(n)) if valid_name(n) => n.clone(),
            _ => return Err(at("function.name must be 1 to 64 letters, digits, _ or -")),
        };
        if functions.iter().any(|f| f.name == name) {
            return Err(at(&format!("the function {name:?} is listed twice")));
        }
        let parameters = match field(function, "parameters") {
            None => {
                Json::Map(vec![("type".into(), Json::Str("object".into())), ("properties".into(), Json::Map(vec![]))])
            }
            Some(p @ Json::Map(_)) => p.clone(),
            Some(_) => return Err(at("function.parameters must be a JSON schema object")),
        };
        functions.push(Function { name, parameters });
    }
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Named(name) = &choice
        && !functions.iter().any(|f| &f.name == name)
    {
        return Err(bad("tool_choice", format!("names {name:?}, which is not among the tools")));
    }
    Ok(Some(Tools { list, functions, choice, parallel }))
}

/// OpenAI's rule for function names.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// An assistant turn's `tool_calls` with each `function.arguments` string parsed into the JSON it holds (templates
/// write the arguments with `tojson`, as transformers' callers pass them); an error says what is malformed.
pub fn calls_as_objects(calls: &mut Json) -> Result<(), String> {
    let Json::List(calls) = calls else { return Err("tool_calls must be a list".into()) };
    for call in calls.iter_mut() {
        let Json::Map(call) = call else { return Err("each tool call must be an object".into()) };
        let Some((_, Json::Map(function))) = call.iter_mut().find(|(k, _)| k == "function") else {
            return Err("a tool call needs a function object".into());
        };
        if let Some((_, arguments)) = function.iter_mut().find(|(k, _)| k == "arguments")
            && let Json::Str(text) = arguments
        {
            *arguments = serde_json::from_str(text).map_err(|e| format!("function.arguments is not JSON: {e}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &str) -> Vec<(String, Json)> {
        match serde_json::from_str(body).unwrap() {
            Json::Map(fields) => fields,
            _ => panic!("an object"),
        }
    }

    #[test]
    fn tools_and_choices_are_validated() {
        let weather = r#""tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]"#;
        let tools = parse(&fields(&format!("{{{weather}}}"))).unwrap().unwrap();
        assert_eq!(
            (tools.functions[0].name.as_str(), &tools.choice, tools.parallel),
            ("get_weather", &ToolChoice::Auto, true)
        );
        let named =
            format!(r#"{{{weather}, "tool_choice": {{"type": "function", "function": {{"name": "get_weather"}}}}}}"#);
        assert_eq!(parse(&fields(&named)).unwrap().unwrap().choice, ToolChoice::Named("get_weather".into()));
        assert_eq!(parse(&fields(&format!(r#"{{{weather}, "tool_choice": "none"}}"#))).unwrap(), None);
        let err = |body: &str| parse(&fields(body)).unwrap_err().message;
        assert!(err(r#"{"tool_choice": "required"}"#).contains("needs tools"));
        assert!(
            err(&format!(r#"{{{weather}, "tool_choice": {{"type": "function", "function": {{"name": "x"}}}}}}"#))
                .contains("not among the tools")
        );
        assert!(err(r#"{"tools": [{"type": "function", "function": {"name": "a b"}}]}"#).contains("function.name"));
        assert!(err(r#"{"tools": [{"type": "retrieval"}]}"#).contains("type must be"));
        assert!(err(r#"{"tools": []}"#).contains("non-empty"));
    }

    #[test]
    fn earlier_calls_carry_their_arguments_as_objects() {
        let mut calls: Json = serde_json::from_str(
            r#"[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}}]"#,
        )
        .unwrap();
        calls_as_objects(&mut calls).unwrap();
        let Json::List(calls) = calls else { panic!() };
        let Json::Map(call) = &calls[0] else { panic!() };
        let Json::Map(function) = &call[2].1 else { panic!() };
        assert_eq!(function[1].1, serde_json::from_str::<Json>(r#"{"b": 1, "a": [2]}"#).unwrap());
        let mut broken: Json = serde_json::from_str(r#"[{"function": {"name": "f", "arguments": "{"}}]"#).unwrap();
        assert!(calls_as_objects(&mut broken).unwrap_err().contains("not JSON"));
    }
}
