//! Grammars over bytes, and the recognizer that constrained decoding runs them with: a [`Grammar`] is a set of rules
//! (a byte from a set, a sequence, alternatives, a bounded or unbounded repetition, rules referring to one another, so
//! nested JSON is expressible), compiled from a JSON schema (`schema`), a regular expression (`grammar::regex`) or a
//! list of choices. A [`State`] is every way the bytes so far can continue — each a stack of rule positions, shared
//! between states — so a byte advances it without backtracking and a token's bytes are checked one at a time.

use std::sync::Arc;

pub mod regex;

/// A set of bytes, one bit each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ByteSet([u64; 4]);

impl ByteSet {
    pub fn of(bytes: impl IntoIterator<Item = u8>) -> Self {
        let mut set = Self::default();
        bytes.into_iter().for_each(|b| set.insert(b));
        set
    }
    /// The bytes from `lo` to `hi`, both included.
    pub fn range(lo: u8, hi: u8) -> Self {
        Self::of(lo..=hi)
    }
    pub fn insert(&mut self, b: u8) {
        self.0[(b >> 6) as usize] |= 1 << (b & 63);
    }
    pub fn contains(&self, b: u8) -> bool {
        self.0[(b >> 6) as usize] & (1 << (b & 63)) != 0
    }
    pub fn union(self, other: Self) -> Self {
        Self([0, 1, 2, 3].map(|i| self.0[i] | other.0[i]))
    }
    /// Every byte not in the set.
    pub fn complement(self) -> Self {
        Self(self.0.map(|w| !w))
    }
}

/// A rule's index in its grammar.
pub type RuleId = u32;

/// One rule of a grammar.
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    /// One byte of the set.
    Byte(ByteSet),
    /// Each rule in turn.
    Seq(Vec<RuleId>),
    /// Any one of the rules.
    Alt(Vec<RuleId>),
    /// The rule `min` to `max` times (no bound when None).
    Repeat { item: RuleId, min: u32, max: Option<u32> },
}

/// Why a grammar cannot be built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GrammarError {
    #[error("the grammar has more than {MAX_RULES} rules")]
    TooLarge,
    #[error("a repetition of something that can be empty (it could repeat forever without writing a byte)")]
    EmptyRepeat,
    #[error("a rule refers to itself before writing a byte (left recursion)")]
    LeftRecursion,
}

/// The most rules one grammar may have: a JSON schema or a regular expression comes with a request.
pub const MAX_RULES: usize = 100_000;

/// The most stacks a state keeps: an ambiguous grammar (a regex such as `(a|a)*`) could otherwise multiply them with
/// every byte. Beyond it the first ones are kept, which narrows what may follow but never admits a wrong byte.
const MAX_STACKS: usize = 256;

/// Rules under construction; [`Builder::build`] checks them.
#[derive(Default)]
pub struct Builder {
    rules: Vec<Rule>,
}

impl Builder {
    pub fn add(&mut self, rule: Rule) -> RuleId {
        self.rules.push(rule);
        (self.rules.len() - 1) as RuleId
    }
    /// A rule defined later with [`Self::define`] (for recursion).
    pub fn forward(&mut self) -> RuleId {
        self.add(Rule::Seq(Vec::new()))
    }
    pub fn define(&mut self, id: RuleId, rule: Rule) {
        self.rules[id as usize] = rule;
    }
    pub fn byte(&mut self, set: ByteSet) -> RuleId {
        self.add(Rule::Byte(set))
    }
    pub fn seq(&mut self, items: Vec<RuleId>) -> RuleId {
        self.add(Rule::Seq(items))
    }
    pub fn alt(&mut self, items: Vec<RuleId>) -> RuleId {
        self.add(Rule::Alt(items))
    }
    pub fn repeat(&mut self, item: RuleId, min: u32, max: Option<u32>) -> RuleId {
        self.add(Rule::Repeat { item, min, max })
    }
    pub fn optional(&mut self, item: RuleId) -> RuleId {
        self.repeat(item, 0, Some(1))
    }
    /// The bytes of `text`, in order.
    pub fn literal(&mut self, text: &[u8]) -> RuleId {
        let bytes = text.iter().map(|&b| self.byte(ByteSet::of([b]))).collect();
        self.seq(bytes)
    }

    /// The grammar of the strings `start` matches, checked: not too large, no repetition of what can be empty, no
    /// left recursion (so that advancing a state always ends).
    pub fn build(self, start: RuleId) -> Result<Grammar, GrammarError> {
        let rules = self.rules;
        if rules.len() > MAX_RULES {
            return Err(GrammarError::TooLarge);
        }
        let nullable = nullable(&rules);
        if rules
            .iter()
            .any(|r| matches!(r, Rule::Repeat { item, max, .. } if nullable[*item as usize] && *max != Some(1)))
        {
            return Err(GrammarError::EmptyRepeat);
        }
        check_left_recursion(&rules, &nullable)?;
        let first = first_bytes(&rules, &nullable);
        Ok(Grammar { rules, start, nullable, first })
    }
}

/// Which rules match the empty string (a fixed point over the rules).
fn nullable(rules: &[Rule]) -> Vec<bool> {
    let mut nullable = vec![false; rules.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for (i, rule) in rules.iter().enumerate() {
            let now = match rule {
                Rule::Byte(_) => false,
                Rule::Seq(items) => items.iter().all(|&r| nullable[r as usize]),
                Rule::Alt(items) => items.iter().any(|&r| nullable[r as usize]),
                Rule::Repeat { item, min, .. } => *min == 0 || nullable[*item as usize],
            };
            if now && !nullable[i] {
                nullable[i] = true;
                changed = true;
            }
        }
    }
    nullable
}

/// The bytes each rule's non-empty matches can start with (a fixed point over the rules).
fn first_bytes(rules: &[Rule], nullable: &[bool]) -> Vec<ByteSet> {
    let mut first = vec![ByteSet::default(); rules.len()];
    let mut changed = true;
    while changed {
        changed = false;
        for (i, rule) in rules.iter().enumerate() {
            let now = match rule {
                Rule::Byte(set) => *set,
                Rule::Seq(items) => seq_first(items, nullable, &first),
                Rule::Alt(items) => items.iter().fold(ByteSet::default(), |acc, &r| acc.union(first[r as usize])),
                Rule::Repeat { item, max, .. } if *max != Some(0) => first[*item as usize],
                Rule::Repeat { .. } => ByteSet::default(),
            };
            if now != first[i] {
                first[i] = now;
                changed = true;
            }
        }
    }
    first
}

/// The first bytes of a sequence of rules: those of each item up to the first that cannot be empty.
fn seq_first(items: &[RuleId], nullable: &[bool], first: &[ByteSet]) -> ByteSet {
    let mut set = ByteSet::default();
    for &r in items {
        set = set.union(first[r as usize]);
        if !nullable[r as usize] {
            break;
        }
    }
    set
}

/// Fails when a rule can reach itself at its first position without a byte in between.
fn check_left_recursion(rules: &[Rule], nullable: &[bool]) -> Result<(), GrammarError> {
    // The rules each rule may start with.
    let first = |rule: &Rule| -> Vec<RuleId> {
        match rule {
            Rule::Byte(_) => Vec::new(),
            Rule::Seq(items) => {
                let end = items.iter().position(|&r| !nullable[r as usize]).map_or(items.len(), |i| i + 1);
                items[..end].to_vec()
            }
            Rule::Alt(items) => items.clone(),
            Rule::Repeat { item, .. } => vec![*item],
        }
    };
    // Depth-first search for a cycle: 0 unvisited, 1 on the path, 2 done.
    let mut mark = vec![0u8; rules.len()];
    for root in 0..rules.len() {
        if mark[root] != 0 {
            continue;
        }
        let mut path: Vec<(usize, Vec<RuleId>)> = vec![(root, first(&rules[root]))];
        mark[root] = 1;
        while let Some((node, next)) = path.last_mut() {
            match next.pop() {
                Some(child) => match mark[child as usize] {
                    1 => return Err(GrammarError::LeftRecursion),
                    0 => {
                        mark[child as usize] = 1;
                        path.push((child as usize, first(&rules[child as usize])));
                    }
                    _ => {}
                },
                None => {
                    mark[*node] = 2;
                    path.pop();
                }
            }
        }
    }
    Ok(())
}

/// A checked grammar, with each rule's emptiness and first bytes.
#[derive(Debug)]
pub struct Grammar {
    rules: Vec<Rule>,
    start: RuleId,
    nullable: Vec<bool>,
    first: Vec<ByteSet>,
}

/// A position inside a rule, above the position it returns to.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Frame {
    rule: RuleId,
    /// The next item of a sequence, or the repetitions done.
    at: u32,
    parent: Stack,
}

/// The rules still open, innermost first; None when everything has matched.
type Stack = Option<Arc<Frame>>;

/// Every way the bytes so far can continue, each a stack of open rules. No stacks: the bytes cannot be continued
/// into a match.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State(Vec<Stack>);

impl State {
    /// No continuation is possible.
    pub fn is_dead(&self) -> bool {
        self.0.is_empty()
    }
}

fn frame(rule: RuleId, at: u32, parent: Stack) -> Stack {
    Some(Arc::new(Frame { rule, at, parent }))
}

impl Grammar {
    /// The state before any byte.
    pub fn start(&self) -> State {
        State(vec![frame(self.start, 0, None)])
    }

    /// The state after `byte`: each stack opened only as far as `byte` can go (an alternative or a repetition whose
    /// first bytes exclude it is not entered), so that a byte costs the ways it can be read, not every way the
    /// grammar could continue.
    pub fn advance(&self, state: &State, byte: u8) -> State {
        let mut out: Vec<Stack> = Vec::new();
        let mut work: Vec<Stack> = state.0.clone();
        let can_enter = |rule: RuleId| self.first[rule as usize].contains(byte) || self.nullable[rule as usize];
        while let Some(stack) = work.pop() {
            let Some(top) = &stack else { continue };
            let (rule, at, parent) = (top.rule, top.at, &top.parent);
            match &self.rules[rule as usize] {
                Rule::Byte(set) => {
                    let next = self.finished_popped(parent.clone());
                    if set.contains(byte) && out.len() < MAX_STACKS && !out.contains(&next) {
                        out.push(next);
                    }
                }
                Rule::Seq(items) => match items.get(at as usize) {
                    None => work.push(parent.clone()),
                    Some(&item) if can_enter(item) => work.push(frame(item, 0, frame(rule, at + 1, parent.clone()))),
                    Some(_) => {}
                },
                Rule::Alt(items) => {
                    let open = items.iter().rev().filter(|&&item| can_enter(item));
                    work.extend(open.map(|&item| frame(item, 0, parent.clone())));
                }
                &Rule::Repeat { item, min, max } => {
                    if max.is_none_or(|max| at < max) && can_enter(item) {
                        // Unbounded: the count only matters up to `min`, so states repeat and caches hit.
                        let next = if max.is_none() { (at + 1).min(min) } else { at + 1 };
                        work.push(frame(item, 0, frame(rule, next, parent.clone())));
                    }
                    if at >= min || self.nullable[item as usize] {
                        work.push(parent.clone());
                    }
                }
            }
        }
        State(out)
    }

    /// The stack without the sequences on top that have nothing left (so that equal positions compare equal).
    fn finished_popped(&self, mut stack: Stack) -> Stack {
        while let Some(top) = &stack {
            match &self.rules[top.rule as usize] {
                Rule::Seq(items) if top.at as usize == items.len() => stack = top.parent.clone(),
                _ => break,
            }
        }
        stack
    }

    /// The state after `bytes`, None once no continuation is possible.
    pub fn advance_bytes(&self, state: &State, bytes: &[u8]) -> Option<State> {
        let mut state = state.clone();
        for &b in bytes {
            state = self.advance(&state, b);
            if state.is_dead() {
                return None;
            }
        }
        Some(state)
    }

    /// Whether the bytes so far are a complete match.
    pub fn accepts(&self, state: &State) -> bool {
        state.0.iter().any(|stack| self.frames(stack).all(|(rule, at)| self.rest_nullable(rule, at)))
    }

    /// Whether the bytes so far are a complete match that no byte can extend.
    pub fn is_final(&self, state: &State) -> bool {
        self.accepts(state) && state.0.iter().all(|stack| self.next_bytes(stack) == ByteSet::default())
    }

    /// Whether the grammar matches the whole of `bytes`.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        self.advance_bytes(&self.start(), bytes).is_some_and(|s| self.accepts(&s))
    }

    /// A stack's open rules and positions, innermost first.
    fn frames<'s>(&self, stack: &'s Stack) -> impl Iterator<Item = (RuleId, u32)> + 's {
        std::iter::successors(stack.as_deref(), |f| f.parent.as_deref()).map(|f| (f.rule, f.at))
    }

    /// Whether what is left of `rule` from position `at` can match nothing.
    fn rest_nullable(&self, rule: RuleId, at: u32) -> bool {
        match &self.rules[rule as usize] {
            Rule::Byte(_) => false,
            Rule::Seq(items) => items[at as usize..].iter().all(|&r| self.nullable[r as usize]),
            Rule::Alt(_) => self.nullable[rule as usize],
            Rule::Repeat { item, min, .. } => at >= *min || self.nullable[*item as usize],
        }
    }

    /// The bytes that can come next on a stack.
    fn next_bytes(&self, stack: &Stack) -> ByteSet {
        let mut set = ByteSet::default();
        for (rule, at) in self.frames(stack) {
            set = set.union(match &self.rules[rule as usize] {
                Rule::Byte(bytes) => *bytes,
                Rule::Seq(items) => seq_first(&items[at as usize..], &self.nullable, &self.first),
                Rule::Alt(_) => self.first[rule as usize],
                Rule::Repeat { item, max, .. } if max.is_none_or(|max| at < max) => self.first[*item as usize],
                Rule::Repeat { .. } => ByteSet::default(),
            });
            if !self.rest_nullable(rule, at) {
                break;
            }
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `"a" ("," "a")*` around brackets, nested: a tiny recursive grammar.
    fn lists() -> Grammar {
        let mut g = Builder::default();
        let value = g.forward();
        let a = g.literal(b"a");
        let comma = g.literal(b",");
        let open = g.literal(b"[");
        let close = g.literal(b"]");
        let more = g.seq(vec![comma, value]);
        let tail = g.repeat(more, 0, None);
        let items = g.seq(vec![value, tail]);
        let inner = g.optional(items);
        let list = g.seq(vec![open, inner, close]);
        g.define(value, Rule::Alt(vec![a, list]));
        g.build(list).unwrap()
    }

    #[test]
    fn a_recursive_grammar_accepts_its_language_byte_by_byte() {
        let g = lists();
        for good in ["[]", "[a]", "[a,[a,[]],a]", "[[[[a]]]]"] {
            assert!(g.matches(good.as_bytes()), "{good}");
        }
        for bad in ["", "[", "[a,]", "[,a]", "a", "[a]]", "[b]"] {
            assert!(!g.matches(bad.as_bytes()), "{bad}");
        }
        let done = g.advance_bytes(&g.start(), b"[a]").unwrap();
        assert!(g.is_final(&done));
        let open = g.advance_bytes(&g.start(), b"[a").unwrap();
        assert!(!g.accepts(&open) && !open.is_dead());
        assert_eq!(g.advance_bytes(&g.start(), b"[a,a"), g.advance_bytes(&g.start(), b"[a,a,a"), "states repeat");
    }

    #[test]
    fn bounded_repeats_count_and_bad_grammars_are_refused() {
        let mut g = Builder::default();
        let digit = g.byte(ByteSet::range(b'0', b'9'));
        let two_to_four = g.repeat(digit, 2, Some(4));
        let g = g.build(two_to_four).unwrap();
        let lengths: Vec<bool> = (0..6).map(|n| g.matches("7".repeat(n).as_bytes())).collect();
        assert_eq!(lengths, [false, false, true, true, true, false]);

        let mut empty = Builder::default();
        let nothing = empty.seq(vec![]);
        let forever = empty.repeat(nothing, 0, None);
        assert_eq!(empty.build(forever).unwrap_err(), GrammarError::EmptyRepeat);
        let mut left = Builder::default();
        let x = left.forward();
        let a = left.literal(b"a");
        let body = left.seq(vec![x, a]);
        left.define(x, Rule::Alt(vec![a, body]));
        assert_eq!(left.build(x).unwrap_err(), GrammarError::LeftRecursion);
    }
}
