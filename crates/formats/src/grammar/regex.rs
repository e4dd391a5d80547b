//! A regular expression (Rust's `regex` syntax, as regex-syntax parses it) as grammar rules over its UTF-8 bytes,
//! matched whole: `^` at the start and `$` at the end are implied and allowed, other assertions are refused.

use regex_syntax::hir::{Class, Hir, HirKind, Look};
use regex_syntax::utf8::Utf8Sequences;

use super::{Builder, ByteSet, Rule, RuleId};

/// The longest pattern taken, in bytes.
pub const MAX_PATTERN: usize = 10_000;

/// Rules matching what `pattern` matches, whole; with `json_string`, only characters a JSON string holds unescaped
/// (no `"`, `\` or control characters), so that the text can sit between a JSON string's quotes.
pub fn rule(g: &mut Builder, pattern: &str, json_string: bool) -> Result<RuleId, String> {
    if pattern.len() > MAX_PATTERN {
        return Err(format!("the pattern is longer than {MAX_PATTERN} bytes"));
    }
    let hir = regex_syntax::ParserBuilder::new()
        .nest_limit(64)
        .build()
        .parse(pattern)
        .map_err(|e| format!("the pattern does not parse: {}", e.to_string().lines().last().unwrap_or_default()))?;
    Compiler { g, json_string }.hir(&hir, true, true)
}

struct Compiler<'a> {
    g: &'a mut Builder,
    json_string: bool,
}

impl Compiler<'_> {
    /// `at_start` / `at_end`: nothing can come before / after this part, where `^` / `$` hold.
    fn hir(&mut self, hir: &Hir, at_start: bool, at_end: bool) -> Result<RuleId, String> {
        Ok(match hir.kind() {
            HirKind::Empty => self.g.seq(Vec::new()),
            HirKind::Literal(literal) => {
                if self.json_string && literal.0.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\') {
                    return Err("the pattern needs a character a JSON string escapes (a quote, a backslash or a \
                                control character)"
                        .into());
                }
                self.g.literal(&literal.0)
            }
            HirKind::Class(class) => self.class(class)?,
            HirKind::Look(look) => match look {
                Look::Start | Look::StartLF | Look::StartCRLF if at_start => self.g.seq(Vec::new()),
                Look::End | Look::EndLF | Look::EndCRLF if at_end => self.g.seq(Vec::new()),
                _ => return Err(format!("the pattern's assertion {look:?} is not supported (only ^ and $)")),
            },
            HirKind::Repetition(rep) => {
                let item = self.hir(&rep.sub, false, false)?;
                self.g.repeat(item, rep.min, rep.max)
            }
            HirKind::Capture(capture) => self.hir(&capture.sub, at_start, at_end)?,
            HirKind::Concat(parts) => {
                let last = parts.len().saturating_sub(1);
                let items = parts.iter().enumerate().map(|(i, p)| self.hir(p, at_start && i == 0, at_end && i == last));
                let items = items.collect::<Result<_, _>>()?;
                self.g.seq(items)
            }
            HirKind::Alternation(options) => {
                let items = options.iter().map(|o| self.hir(o, at_start, at_end)).collect::<Result<_, _>>()?;
                self.g.alt(items)
            }
        })
    }

    /// A character class as the UTF-8 byte sequences of its ranges (a byte class as bytes).
    fn class(&mut self, class: &Class) -> Result<RuleId, String> {
        let mut options = Vec::new();
        match class {
            Class::Unicode(ranges) => {
                for range in ranges.iter() {
                    let (mut lo, hi) = (range.start(), range.end());
                    if self.json_string {
                        // Characters from U+0020 on, without the quote and the backslash.
                        lo = lo.max(' ');
                        for (a, b) in split_around(lo, hi, &['"', '\\']) {
                            self.utf8(a, b, &mut options);
                        }
                    } else {
                        self.utf8(lo, hi, &mut options);
                    }
                }
            }
            Class::Bytes(ranges) => {
                let mut set = ByteSet::default();
                for range in ranges.iter() {
                    set = set.union(ByteSet::range(range.start(), range.end()));
                }
                options.push(self.g.byte(set));
            }
        }
        if options.is_empty() {
            return Err("the pattern has a character class that matches no character a JSON string holds".into());
        }
        Ok(if options.len() == 1 { options[0] } else { self.g.add(Rule::Alt(options)) })
    }

    fn utf8(&mut self, lo: char, hi: char, options: &mut Vec<RuleId>) {
        if lo > hi {
            return;
        }
        for sequence in Utf8Sequences::new(lo, hi) {
            let bytes = sequence.as_slice().iter().map(|r| self.g.byte(ByteSet::range(r.start, r.end))).collect();
            options.push(self.g.seq(bytes));
        }
    }
}

/// The parts of `lo..=hi` left when the characters `holes` are taken out.
fn split_around(lo: char, hi: char, holes: &[char]) -> Vec<(char, char)> {
    let mut parts = vec![(lo, hi)];
    for &hole in holes {
        parts = parts
            .into_iter()
            .flat_map(|(a, b)| {
                if hole < a || hole > b {
                    return vec![(a, b)];
                }
                let before = char::from_u32(hole as u32 - 1).filter(|&c| c >= a).map(|c| (a, c));
                let after = char::from_u32(hole as u32 + 1).filter(|&c| c <= b).map(|c| (c, b));
                before.into_iter().chain(after).collect()
            })
            .collect();
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grammar(pattern: &str, json_string: bool) -> Result<super::super::Grammar, String> {
        let mut g = Builder::default();
        let start = rule(&mut g, pattern, json_string)?;
        g.build(start).map_err(|e| e.to_string())
    }

    #[test]
    fn patterns_match_whole_strings_over_utf8() {
        let date = grammar(r"^\d{4}-\d{2}-\d{2}$", true).unwrap();
        assert!(date.matches(b"2026-12-07"));
        assert!(!date.matches(b"2026-12-7") && !date.matches(b"x2026-12-07"));
        let words = grammar("(caf[eé]|東京)+!?", true).unwrap();
        for good in ["café", "cafe東京", "東京東京!"] {
            assert!(words.matches(good.as_bytes()), "{good}");
        }
        assert!(!words.matches("cafè".as_bytes()));
        let any = grammar(".{1,3}", true).unwrap();
        assert!(any.matches("a😀".as_bytes()) && !any.matches(b"\"") && !any.matches(b"a\\"));
        assert!(grammar(".", false).unwrap().matches(b"\""));
    }

    #[test]
    fn what_cannot_be_generated_is_refused_by_name() {
        assert!(grammar("a(", true).unwrap_err().starts_with("the pattern does not parse"));
        assert!(grammar(r"\bword", true).unwrap_err().contains("assertion"));
        assert!(grammar("say \"hi\"", true).unwrap_err().contains("JSON string escapes"));
        assert!(grammar("[\"\\\\]", true).unwrap_err().contains("matches no character"));
        assert!(grammar(&"a".repeat(MAX_PATTERN + 1), false).unwrap_err().contains("longer"));
        assert_eq!(grammar("(a*)*", false).unwrap_err(), super::super::GrammarError::EmptyRepeat.to_string());
    }
}
