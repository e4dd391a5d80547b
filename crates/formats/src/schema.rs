//! JSON Schema as a grammar of the JSON texts that validate against it, for constrained decoding: objects with their
//! properties in the schema's order (required ones always, optional ones when the model writes them), arrays with
//! their item schema and length bounds, strings with length bounds, a pattern or a format, integers and numbers,
//! booleans, null, `enum` and `const`, `anyOf` / `oneOf`, and `$ref` into `$defs` (recursive schemas included).
//! Whitespace between tokens is at most a space, or a newline and an indent of up to 20, and none around the value. A keyword that would
//! constrain the text in a way the grammar does not enforce (`minimum: 3`, `multipleOf`, `patternProperties`, ...)
//! is refused naming where it is, never ignored; annotations (`title`, `description`, `default`, ...) are ignored.

use crate::chat::Json;

use crate::grammar::{Builder, ByteSet, Grammar, RuleId, regex};

/// Keywords that describe a schema without constraining it, and the definitions `$ref` reaches.
const ANNOTATIONS: [&str; 12] = [
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
];

/// The most `$ref`s one schema may expand (each expands once; recursion goes through a rule).
const MAX_DEFS: usize = 1_000;

/// The longest integer part (digits) and fraction a number may have, so that a model cannot write digits forever.
const MAX_DIGITS: u32 = 15;

/// The grammar of the JSON texts `schema` accepts; an error names the schema location it cannot compile
/// (`properties.age.minimum: ...`).
pub fn grammar(schema: &Json) -> Result<Grammar, String> {
    let mut g = Builder::default();
    let start = rule(&mut g, schema)?;
    g.build(start).map_err(|e| format!("the schema: {e}"))
}

/// The rules of the JSON texts `schema` accepts, added to `g` (to sit inside a larger grammar).
pub fn rule(g: &mut Builder, schema: &Json) -> Result<RuleId, String> {
    Compiler { g, root: schema, refs: Vec::new(), any: None, ws: None }.schema(schema, "")
}

/// The grammar of any JSON object (`response_format: {"type": "json_object"}`).
pub fn any_object() -> Grammar {
    let mut g = Builder::default();
    let mut c = Compiler { g: &mut g, root: &Json::Null, refs: Vec::new(), any: None, ws: None };
    let any = c.any_value();
    let object = c.object_of(&[], Some(any));
    g.build(object).expect("the JSON grammar is well formed")
}

struct Compiler<'a> {
    g: &'a mut Builder,
    root: &'a Json,
    /// `$ref` targets already compiled (or being compiled), by their reference.
    refs: Vec<(String, RuleId)>,
    any: Option<RuleId>,
    ws: Option<RuleId>,
}

/// One property of an object: its key as a JSON string, its value's rule, whether it must appear.
struct Property {
    key: Vec<u8>,
    value: RuleId,
    required: bool,
}

impl<'a> Compiler<'a> {
    fn schema(&mut self, schema: &Json, at: &str) -> Result<RuleId, String> {
        let here = |key: &str| if at.is_empty() { key.to_string() } else { format!("{at}.{key}") };
        let obj = match schema {
            Json::Bool(true) => return Ok(self.any_value()),
            Json::Bool(false) => return Err(format!("{}: the schema `false` accepts nothing", here("schema"))),
            Json::Map(obj) => obj,
            _ => return Err(format!("{}: a schema must be an object or a boolean", here("schema"))),
        };
        if let Some(reference) = get(obj, "$ref") {
            return self.reference(reference, &here("$ref"));
        }
        if let Some(value) = get(obj, "const") {
            return Ok(self.json_literal(value));
        }
        if let Some(values) = get(obj, "enum") {
            let Json::List(values) = values else { return Err(format!("{}: must be a list", here("enum"))) };
            if values.is_empty() {
                return Err(format!("{}: an empty enum accepts nothing", here("enum")));
            }
            let options = values.iter().map(|v| self.json_literal(v)).collect();
            return Ok(self.g.alt(options));
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(options) = get(obj, key) {
                return self.combination(obj, key, options, &here(key));
            }
        }
        let types: Vec<&str> = match get(obj, "type") {
            None => return self.untyped(obj, at),
            Some(Json::Str(t)) => vec![t.as_str()],
            Some(Json::List(ts)) if !ts.is_empty() && ts.iter().all(is_str) => ts.iter().filter_map(as_str).collect(),
            Some(_) => return Err(format!("{}: must be a type name or a list of them", here("type"))),
        };
        let options = types.into_iter().map(|t| self.typed(obj, t, at)).collect::<Result<Vec<_>, _>>()?;
        Ok(if options.len() == 1 { options[0] } else { self.g.alt(options) })
    }

    /// A schema without `type`: the keywords it has decide (properties → an object, items → an array), else any
    /// JSON value.
    fn untyped(&mut self, obj: &Obj, at: &str) -> Result<RuleId, String> {
        let object_keys = ["properties", "required", "additionalProperties"];
        if object_keys.iter().any(|k| get(obj, k).is_some()) {
            return self.typed(obj, "object", at);
        }
        if get(obj, "items").is_some() {
            return self.typed(obj, "array", at);
        }
        self.check_keys(obj, &[], at)?;
        Ok(self.any_value())
    }

    fn combination(&mut self, obj: &Obj, key: &str, options: &Json, at: &str) -> Result<RuleId, String> {
        let Json::List(options) = options else { return Err(format!("{at}: must be a list of schemas")) };
        if let Some(other) = obj.iter().map(|(k, _)| k).find(|k| *k != key && !ANNOTATIONS.contains(&k.as_str())) {
            return Err(format!("{at}: `{other}` beside `{key}` is not supported"));
        }
        match (key, options.as_slice()) {
            (_, []) => Err(format!("{at}: must not be empty")),
            ("allOf", [only]) => self.schema(only, &format!("{at}[0]")),
            ("allOf", _) => Err(format!("{at}: allOf of more than one schema is not supported")),
            _ => {
                let rules = options.iter().enumerate().map(|(i, s)| self.schema(s, &format!("{at}[{i}]")));
                let rules = rules.collect::<Result<Vec<_>, _>>()?;
                Ok(self.g.alt(rules))
            }
        }
    }

    /// `#/$defs/NAME`, `#/definitions/NAME` or `#`: compiled once, so a schema may refer to itself.
    fn reference(&mut self, reference: &Json, at: &str) -> Result<RuleId, String> {
        let Json::Str(path) = reference else { return Err(format!("{at}: must be a string")) };
        if let Some(&(_, rule)) = self.refs.iter().find(|(p, _)| p == path) {
            return Ok(rule);
        }
        if self.refs.len() >= MAX_DEFS {
            return Err(format!("{at}: more than {MAX_DEFS} references"));
        }
        let Some(pointer) = path.strip_prefix('#') else {
            return Err(format!("{at}: only references inside the schema (#/$defs/...) are supported, not {path:?}"));
        };
        let target = pointer_in(self.root, pointer).ok_or_else(|| format!("{at}: {path:?} points at nothing"))?;
        let rule = self.g.forward();
        self.refs.push((path.clone(), rule));
        let body = self.schema(target, &path[1..])?;
        self.g.define(rule, crate::grammar::Rule::Seq(vec![body]));
        Ok(rule)
    }

    fn typed(&mut self, obj: &Obj, kind: &str, at: &str) -> Result<RuleId, String> {
        match kind {
            "object" => self.object(obj, at),
            "array" => self.array(obj, at),
            "string" => self.string(obj, at),
            "integer" | "number" => self.number(obj, kind == "integer", at),
            "boolean" => {
                self.check_keys(obj, &[], at)?;
                let (t, f) = (self.g.literal(b"true"), self.g.literal(b"false"));
                Ok(self.g.alt(vec![t, f]))
            }
            "null" => {
                self.check_keys(obj, &[], at)?;
                Ok(self.g.literal(b"null"))
            }
            other => {
                Err(format!("{at}{}type: {other:?} is not a JSON Schema type", if at.is_empty() { "" } else { "." }))
            }
        }
    }

    /// Refuses any keyword of `obj` that is neither in `known` (with `type`) nor an annotation.
    fn check_keys(&self, obj: &Obj, known: &[&str], at: &str) -> Result<(), String> {
        match obj
            .iter()
            .map(|(k, _)| k)
            .find(|k| k.as_str() != "type" && !known.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()))
        {
            None => Ok(()),
            Some(k) => Err(format!(
                "{}: this keyword is not supported",
                if at.is_empty() { k.clone() } else { format!("{at}.{k}") }
            )),
        }
    }

    fn object(&mut self, obj: &Obj, at: &str) -> Result<RuleId, String> {
        self.check_keys(obj, &["properties", "required", "additionalProperties"], at)?;
        let at_key = |key: &str| if at.is_empty() { key.to_string() } else { format!("{at}.{key}") };
        let required: Vec<&str> = match get(obj, "required") {
            None => Vec::new(),
            Some(Json::List(r)) if r.iter().all(is_str) => r.iter().filter_map(as_str).collect(),
            Some(_) => return Err(format!("{}: must be a list of property names", at_key("required"))),
        };
        let mut properties = Vec::new();
        match get(obj, "properties") {
            None => {}
            Some(Json::Map(props)) => {
                for (name, schema) in props {
                    let value = self.schema(schema, &format!("{}.{name}", at_key("properties")))?;
                    let key = Json::Str(name.clone()).to_compact().into_bytes();
                    properties.push(Property { key, value, required: required.contains(&name.as_str()) });
                }
            }
            Some(_) => return Err(format!("{}: must be an object", at_key("properties"))),
        }
        if let Some(missing) = required
            .iter()
            .find(|r| !properties.iter().any(|p| p.key == Json::Str(r.to_string()).to_compact().into_bytes()))
        {
            return Err(format!("{}: {missing:?} has no schema in properties", at_key("required")));
        }
        // Extra keys only where the schema gives them a schema and names no properties (a map); else the listed
        // properties alone, which every schema allowing more accepts too.
        let extra = match get(obj, "additionalProperties") {
            Some(schema @ Json::Map(_)) if properties.is_empty() => {
                Some(self.schema(schema, &at_key("additionalProperties"))?)
            }
            None | Some(Json::Bool(true)) if properties.is_empty() => Some(self.any_value()),
            _ => None,
        };
        Ok(self.object_of(&properties, extra))
    }

    /// `{ p1, p2?, ... }` in order, the required always and a comma before all but the first present; or, with
    /// `extra` and no properties, any keys with values of that rule.
    fn object_of(&mut self, properties: &[Property], extra: Option<RuleId>) -> RuleId {
        let ws = self.ws();
        let (open, close, comma, colon) =
            (self.g.literal(b"{"), self.g.literal(b"}"), self.g.literal(b","), self.g.literal(b":"));
        let member = |c: &mut Self, key: RuleId, value: RuleId| c.g.seq(vec![ws, key, ws, colon, ws, value]);
        let body = match extra {
            Some(value) => {
                let key = self.json_string(0, None);
                let first = member(self, key, value);
                let next = self.g.seq(vec![ws, comma, first]);
                let rest = self.g.repeat(next, 0, None);
                let all = self.g.seq(vec![first, rest]);
                self.g.optional(all)
            }
            None => {
                // start(i): the rest when nothing has been written; after(i): when something has.
                let empty = self.g.seq(Vec::new());
                let (mut start, mut after) = (empty, empty);
                for p in properties.iter().rev() {
                    let key = self.g.literal(&p.key);
                    let m = member(self, key, p.value);
                    let with_comma = self.g.seq(vec![ws, comma, m, after]);
                    let first = self.g.seq(vec![m, after]);
                    (start, after) = if p.required {
                        (first, with_comma)
                    } else {
                        (self.g.alt(vec![first, start]), self.g.alt(vec![with_comma, after]))
                    };
                }
                start
            }
        };
        self.g.seq(vec![open, body, ws, close])
    }

    fn array(&mut self, obj: &Obj, at: &str) -> Result<RuleId, String> {
        self.check_keys(obj, &["items", "minItems", "maxItems"], at)?;
        let at_key = |key: &str| if at.is_empty() { key.to_string() } else { format!("{at}.{key}") };
        let item = match get(obj, "items") {
            None | Some(Json::Bool(true)) => self.any_value(),
            Some(schema) => self.schema(schema, &at_key("items"))?,
        };
        let (min, max) = (count(obj, "minItems", at)?.unwrap_or(0), count(obj, "maxItems", at)?);
        if max.is_some_and(|max| max < min) {
            return Err(format!("{}: is less than minItems", at_key("maxItems")));
        }
        let ws = self.ws();
        let (open, close, comma) = (self.g.literal(b"["), self.g.literal(b"]"), self.g.literal(b","));
        let first = self.g.seq(vec![ws, item]);
        let next = self.g.seq(vec![ws, comma, ws, item]);
        let rest = self.g.repeat(next, min.saturating_sub(1), max.map(|m| m.saturating_sub(1)));
        let items = self.g.seq(vec![first, rest]);
        let body = if min == 0 { self.g.optional(items) } else { items };
        let body = if max == Some(0) { self.g.seq(Vec::new()) } else { body };
        Ok(self.g.seq(vec![open, body, ws, close]))
    }

    fn string(&mut self, obj: &Obj, at: &str) -> Result<RuleId, String> {
        self.check_keys(obj, &["minLength", "maxLength", "pattern", "format"], at)?;
        let at_key = |key: &str| if at.is_empty() { key.to_string() } else { format!("{at}.{key}") };
        let pattern = match (get(obj, "pattern"), get(obj, "format")) {
            (Some(_), Some(_)) => return Err(format!("{}: beside a pattern is not supported", at_key("format"))),
            (Some(Json::Str(p)), None) => Some(searched(p)),
            (Some(_), None) => return Err(format!("{}: must be a string", at_key("pattern"))),
            (None, Some(format)) => Some(format_pattern(format).ok_or_else(|| {
                format!(
                    "{}: {} is not supported (date, time, date-time, uuid, email, ipv4)",
                    at_key("format"),
                    format.to_compact()
                )
            })?),
            (None, None) => None,
        };
        let (min, max) = (count(obj, "minLength", at)?.unwrap_or(0), count(obj, "maxLength", at)?);
        if let Some(pattern) = pattern {
            if get(obj, "minLength").is_some() || get(obj, "maxLength").is_some() {
                return Err(format!("{}: lengths beside a pattern or format are not supported", at_key("maxLength")));
            }
            let quote = self.g.literal(b"\"");
            let body = regex::rule(self.g, &pattern, true).map_err(|e| format!("{}: {e}", at_key("pattern")))?;
            return Ok(self.g.seq(vec![quote, body, quote]));
        }
        Ok(self.json_string(min, max))
    }

    fn number(&mut self, obj: &Obj, integer: bool, at: &str) -> Result<RuleId, String> {
        self.check_keys(obj, &["minimum"], at)?;
        let non_negative = match get(obj, "minimum") {
            None => false,
            Some(Json::Int(0)) => true,
            Some(Json::Float(m)) if *m == 0.0 => true,
            Some(_) => {
                let at = if at.is_empty() { "minimum".into() } else { format!("{at}.minimum") };
                return Err(format!("{at}: only a minimum of 0 is supported"));
            }
        };
        let digit = self.g.byte(ByteSet::range(b'0', b'9'));
        let nonzero = self.g.byte(ByteSet::range(b'1', b'9'));
        let (zero, minus, dot) = (self.g.literal(b"0"), self.g.literal(b"-"), self.g.literal(b"."));
        let more = self.g.repeat(digit, 0, Some(MAX_DIGITS - 1));
        let natural = self.g.seq(vec![nonzero, more]);
        let magnitude = self.g.alt(vec![zero, natural]);
        let sign = self.g.optional(minus);
        let mut parts = if non_negative { vec![magnitude] } else { vec![sign, magnitude] };
        if !integer {
            let digits = self.g.repeat(digit, 1, Some(MAX_DIGITS));
            let fraction = self.g.seq(vec![dot, digits]);
            parts.push(self.g.optional(fraction));
        }
        Ok(self.g.seq(parts))
    }

    /// A JSON string of `min` to `max` characters (an escape counts as one).
    fn json_string(&mut self, min: u32, max: Option<u32>) -> RuleId {
        let plain = regex::rule(self.g, "[^\"\\\\\\x00-\\x1f]", true).expect("a valid class");
        let backslash = self.g.literal(b"\\");
        let simple = self.g.byte(ByteSet::of(*b"\"\\/bfnrt"));
        let u = self.g.literal(b"u");
        let hex =
            self.g.byte(ByteSet::range(b'0', b'9').union(ByteSet::range(b'a', b'f')).union(ByteSet::range(b'A', b'F')));
        let hex4 = self.g.repeat(hex, 4, Some(4));
        let unicode = self.g.seq(vec![u, hex4]);
        let escaped = self.g.alt(vec![simple, unicode]);
        let escape = self.g.seq(vec![backslash, escaped]);
        let char = self.g.alt(vec![plain, escape]);
        let body = self.g.repeat(char, min, max);
        let quote = self.g.literal(b"\"");
        self.g.seq(vec![quote, body, quote])
    }

    /// Any JSON value (compiled once).
    fn any_value(&mut self) -> RuleId {
        if let Some(any) = self.any {
            return any;
        }
        let value = self.g.forward();
        self.any = Some(value);
        let object = self.object_of(&[], Some(value));
        let array = self.array(&[], "").expect("an array of anything compiles");
        let string = self.json_string(0, None);
        let number = self.number(&[], false, "").expect("a number compiles");
        let (t, f, null) = (self.g.literal(b"true"), self.g.literal(b"false"), self.g.literal(b"null"));
        self.g.define(value, crate::grammar::Rule::Alt(vec![object, array, string, number, t, f, null]));
        value
    }

    /// A JSON value exactly as serde_json writes it compactly.
    fn json_literal(&mut self, value: &Json) -> RuleId {
        self.g.literal(value.to_compact().as_bytes())
    }

    /// Nothing, a space, or a newline and up to 20 spaces or tabs (compiled once).
    fn ws(&mut self) -> RuleId {
        if let Some(ws) = self.ws {
            return ws;
        }
        let space = self.g.literal(b" ");
        let newline = self.g.literal(b"\n");
        let indent_char = self.g.byte(ByteSet::of(*b" \t"));
        let indent = self.g.repeat(indent_char, 0, Some(20));
        let line = self.g.seq(vec![newline, indent]);
        let either = self.g.alt(vec![space, line]);
        let ws = self.g.optional(either);
        self.ws = Some(ws);
        ws
    }
}

/// A non-negative integer keyword (`minItems`, `maxLength`, ...).
fn count(obj: &Obj, key: &str, at: &str) -> Result<Option<u32>, String> {
    match get(obj, key) {
        None => Ok(None),
        Some(v) => as_int(v).and_then(|n| u32::try_from(n).ok()).map(Some).ok_or_else(|| {
            let at = if at.is_empty() { key.to_string() } else { format!("{at}.{key}") };
            format!("{at}: must be a non-negative integer")
        }),
    }
}

/// An object's entries, in their order.
type Obj = [(String, Json)];

fn get<'j>(obj: &'j Obj, key: &str) -> Option<&'j Json> {
    obj.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn is_str(json: &Json) -> bool {
    matches!(json, Json::Str(_))
}

fn as_str(json: &Json) -> Option<&str> {
    match json {
        Json::Str(s) => Some(s),
        _ => None,
    }
}

fn as_int(json: &Json) -> Option<i64> {
    match json {
        Json::Int(n) => Some(*n),
        Json::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 => Some(*f as i64),
        _ => None,
    }
}

/// The value a JSON pointer (RFC 6901: `/$defs/node`, `~1` for `/`, `~0` for `~`) names inside `root`.
fn pointer_in<'j>(root: &'j Json, pointer: &str) -> Option<&'j Json> {
    if pointer.is_empty() {
        return Some(root);
    }
    pointer.strip_prefix('/')?.split('/').try_fold(root, |node, part| {
        let part = part.replace("~1", "/").replace("~0", "~");
        match node {
            Json::Map(entries) => get(entries, &part),
            Json::List(items) => items.get(part.parse::<usize>().ok()?),
            _ => None,
        }
    })
}

/// A JSON Schema `pattern` (which matches anywhere in the string) as a whole-string pattern.
fn searched(pattern: &str) -> String {
    let start = if pattern.starts_with('^') { "" } else { ".*" };
    let end = if pattern.ends_with('$') && !pattern.ends_with("\\$") { "" } else { ".*" };
    format!("{start}(?:{pattern}){end}")
}

/// The pattern of a string `format` (as RFC 3339 and 4122 and the common e-mail shape write them).
fn format_pattern(format: &Json) -> Option<String> {
    let date = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])";
    let time = r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)";
    Some(match as_str(format)? {
        "date" => date.to_string(),
        "time" => time.to_string(),
        "date-time" => format!("{date}T{time}"),
        "uuid" => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}".into(),
        "email" => r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,4}".into(),
        "ipv4" => r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)".into(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Json {
        serde_json::from_str(text).unwrap()
    }

    fn accepts(schema: &str, texts: &[&str]) -> Vec<bool> {
        let g = grammar(&json(schema)).unwrap();
        texts.iter().map(|t| g.matches(t.as_bytes())).collect()
    }

    #[test]
    fn objects_keep_required_properties_and_may_skip_optional_ones() {
        let schema = r##"{"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 5}, "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}, "required": ["name"]}"##;
        let texts = [
            r##"{"name": "Ann"}"##,
            r##"{"name":"Ann","age":30,"tags":["a","b"]}"##,
            "{\n  \"name\": \"Ann\",\n  \"tags\": []\n}",
            r##"{"age": 3}"##,
            r##"{"name": "Annabel"}"##,
            r##"{"name": "Ann", "age": -1}"##,
            r##"{"name": "Ann", "tags": ["a", "b", "a"]}"##,
            r##"{"name": "Ann",}"##,
            r##"{"tags": [], "name": "Ann"}"##,
        ];
        assert_eq!(accepts(schema, &texts), [true, true, true, false, false, false, false, false, false]);
    }

    #[test]
    fn unions_references_and_formats() {
        let tree = r##"{"$defs": {"node": {"type": "object", "properties": {
            "v": {"type": ["integer", "null"]}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["v", "kids"]}}, "$ref": "#/$defs/node"}"##;
        let texts = [r##"{"v": 1, "kids": [{"v": null, "kids": []}]}"##, r##"{"v": 1.5, "kids": []}"##];
        assert_eq!(accepts(tree, &texts), [true, false]);
        let when = r##"{"anyOf": [{"type": "string", "format": "date"}, {"const": {"never": true}}]}"##;
        assert_eq!(
            accepts(when, &[r##""2026-12-07""##, r##"{"never":true}"##, r##""2026-13-07""##]),
            [true, true, false]
        );
        let any = any_object();
        assert!(any.matches(br##"{"a": [1, -2.5, "x\n\u00e9", {"b": null}], "c": true}"##));
        assert!(!any.matches(b"[1]") && !any.matches(br##"{"a": 01}"##));
    }

    #[test]
    fn what_the_grammar_cannot_enforce_is_refused_naming_where() {
        let err = |schema: Json| grammar(&schema).unwrap_err();
        assert_eq!(
            err(json(r##"{"type": "object", "properties": {"age": {"type": "integer", "minimum": 3}}}"##)),
            "properties.age.minimum: only a minimum of 0 is supported"
        );
        assert_eq!(err(json(r##"{"type": "number", "multipleOf": 2}"##)), "multipleOf: this keyword is not supported");
        assert!(err(json(r##"{"type": "strin"}"##)).contains("\"strin\" is not a JSON Schema type"));
        assert!(err(json(r##"{"$ref": "#/$defs/missing"}"##)).contains("points at nothing"));
        assert!(err(json(r##"{"$ref": "https://example.com/s.json"}"##)).contains("only references inside the schema"));
        assert!(err(json(r##"{"type": "object", "required": ["x"]}"##)).contains("\"x\" has no schema"));
        assert!(err(json(r##"{"type": "string", "format": "hostname"}"##)).contains("\"hostname\" is not supported"));
        let looping =
            json(r##"{"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}"##);
        assert!(err(looping).contains("left recursion"));
    }
}
