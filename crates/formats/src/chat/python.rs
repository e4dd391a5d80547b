//! Python's `json.dumps` and `repr` of floats, as transformers' `tojson` filter writes values.

use std::fmt::Write;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::MAX_PROMPT;

/// The widest `tojson` indent: a template comes with a model file, and an indent of 10¹⁵ would take all memory.
const MAX_INDENT: usize = 64;

/// `tojson(x, ensure_ascii=false, indent=none, separators=none, sort_keys=false)`: Python's `json.dumps` with those
/// arguments, as transformers defines the filter.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: bool = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let indent: Option<usize> = kwargs.get("indent")?;
    if indent.is_some_and(|n| n > MAX_INDENT) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: indent is at most {MAX_INDENT}")));
    }
    let sort_keys: bool = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = JsonStyle { ensure_ascii, indent, sort_keys, item, key };
    let mut out = String::new();
    style.write(&mut out, value, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<usize>,
    sort_keys: bool,
    item: String,
    key: String,
}

impl JsonStyle {
    /// A line break and the indent of nesting `depth`, when indenting.
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    }

    /// `open` item, item … `close` (`[]` or `{}` when empty), each item on its own line when indenting.
    fn bracketed(
        &self,
        out: &mut String,
        depth: usize,
        (open, close): (char, char),
        items: &[Value],
        mut item: impl FnMut(&mut String, &Value) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, value) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item);
            }
            self.newline(out, depth + 1);
            item(out, value)?;
        }
        self.newline(out, depth);
        out.push(close);
        Ok(())
    }

    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None | ValueKind::Undefined => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => match value.as_i64() {
                Some(i) if !is_float(value) => write!(out, "{i}").expect("writing to a String"),
                _ => out.push_str(&python_float(f64::try_from(value.clone())?)),
            },
            ValueKind::String => self.string(out, value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.bracketed(out, depth, ('[', ']'), &items, |out, item| self.write(out, item, depth + 1))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                self.bracketed(out, depth, ('{', '}'), &keys, |out, k| {
                    self.string(out, &k.to_string());
                    out.push_str(&self.key);
                    self.write(out, &value.get_item(k)?, depth + 1)
                })?;
            }
            other => {
                return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: a {other} is not JSON")));
            }
        }
        Ok(())
    }

    /// A JSON string as Python writes it: `"` `\` and control characters escaped, and every non-ASCII character
    /// too with `ensure_ascii`.
    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        write!(out, "\\u{unit:04x}").expect("writing to a String");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// `repr()` in Python, as Jinja prints a list, a dict or a number: strings quoted as Python quotes them, `None`,
/// `True`, `False`, floats as [`python_float`].
pub(super) fn python_repr(out: &mut String, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if is_float(value) => out.push_str(&python_float(f64::try_from(value.clone())?)),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            if out.len() + s.len() > MAX_PROMPT {
                return Err(Error::new(ErrorKind::InvalidOperation, "a printed value is longer than the longest chat"));
            }
            let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
            out.push(quote);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == quote => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || c == '\u{7f}' => write!(out, "\\x{:02x}", c as u32).expect("a String"),
                    c => out.push(c),
                }
            }
            out.push(quote);
        }
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                out.push_str(if i == 0 { "" } else { ", " });
                python_repr(out, &item)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                out.push_str(if i == 0 { "" } else { ", " });
                python_repr(out, &key)?;
                out.push_str(": ");
                python_repr(out, &value.get_item(&key)?)?;
            }
            out.push('}');
        }
        _ => write!(out, "{value}").expect("a String"),
    }
    Ok(())
}

/// Whether a number is a float to minijinja (1.0 stays 1.0, as in Python).
fn is_float(value: &Value) -> bool {
    value.as_i64().is_none() || value.to_string().contains(['.', 'e', 'E', 'n', 'N', 'i'])
}

/// `repr(float)` in Python: the shortest round-tripping digits, `.0` on integral values, exponents from 1e16 and
/// below 1e-4 written `1e+16`, `1e-05`, and `NaN`, `Infinity` as json.dumps writes them.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let exponent = if f == 0.0 { 0 } else { f.abs().log10().floor() as i32 };
    if (-4..16).contains(&exponent) {
        let s = format!("{f:?}");
        return if s.contains('.') { s } else { format!("{s}.0") };
    }
    // Scientific: Rust's {:e} gives the shortest digits ("1e16", "1.5e-7").
    let s = format!("{f:e}");
    let (mantissa, exp) = s.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (f, python) in [(1.0, "1.0"), (0.1, "0.1"), (1e16, "1e+16"), (1.5e-7, "1.5e-07"), (-2.5, "-2.5")] {
            assert_eq!(python_float(f), python);
        }
        assert_eq!(python_float(0.0001), "0.0001");
        assert_eq!(python_float(123456789012345.0), "123456789012345.0");
    }
}
