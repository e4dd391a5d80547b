//! Constrained decoding: a grammar (from a JSON schema, a regular expression or a list of choices) decides which
//! tokens may come next. The vocabulary is a byte trie of the tokens' text, walked from the grammar's state so that a
//! shared prefix is checked once and a branch the grammar refuses is left at its first byte; the resulting mask is
//! kept per state (states recur: the same place in the schema, inside a string), shared by every request with the
//! same grammar. End-of-text is allowed exactly where the text is complete.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ember_formats::grammar::{Builder, Grammar, State, regex};
use ember_formats::openai::Format;
use ember_formats::schema;
use ember_formats::tokenizer;
use tokenizers::Tokenizer;

/// The tokens' bytes as a trie.
pub struct Vocabulary {
    nodes: Vec<Node>,
    /// Each id's bytes (None: a special token, which no grammar allows).
    bytes: Vec<Option<Vec<u8>>>,
    ends: Vec<u32>,
    /// Ids in the model's logits (may exceed the tokenizer's).
    size: usize,
    /// Masks computed so far, and the microseconds they took.
    masks: AtomicU64,
    mask_micros: AtomicU64,
}

#[derive(Default)]
struct Node {
    children: Vec<(u8, u32)>,
    /// Tokens whose bytes end here.
    tokens: Vec<u32>,
}

impl Vocabulary {
    /// The vocabulary of `tokenizer` for a model of `size` logits.
    pub fn new(tokenizer: &Tokenizer, size: usize) -> Self {
        let bytes = tokenizer::token_bytes(tokenizer);
        let mut nodes = vec![Node::default()];
        for (id, token) in bytes.iter().enumerate().take(size) {
            let Some(token) = token.as_ref().filter(|t| !t.is_empty()) else { continue };
            let mut at = 0;
            for &b in token {
                at = match nodes[at].children.iter().find(|(c, _)| *c == b) {
                    Some(&(_, child)) => child as usize,
                    None => {
                        nodes.push(Node::default());
                        let child = nodes.len() - 1;
                        nodes[at].children.push((b, child as u32));
                        child
                    }
                };
            }
            nodes[at].tokens.push(id as u32);
        }
        Self {
            nodes,
            bytes,
            ends: tokenizer::end_tokens(tokenizer),
            size,
            masks: AtomicU64::new(0),
            mask_micros: AtomicU64::new(0),
        }
    }

    /// Masks computed so far, and the microseconds they took.
    pub fn masks(&self) -> (u64, u64) {
        (self.masks.load(Ordering::Relaxed), self.mask_micros.load(Ordering::Relaxed))
    }

    /// The tokens allowed from `state`, one bit per id.
    fn mask(&self, grammar: &Grammar, state: &State) -> Vec<u64> {
        let started = Instant::now();
        let mut mask = vec![0u64; self.size.div_ceil(64)];
        let mut set = |id: u32| mask[id as usize / 64] |= 1 << (id % 64);
        if grammar.accepts(state) {
            self.ends.iter().filter(|&&e| (e as usize) < self.size).for_each(|&e| set(e));
        }
        let mut work = vec![(0usize, state.clone())];
        while let Some((node, state)) = work.pop() {
            for &(byte, id) in &self.nodes[node].children {
                let next = grammar.advance(&state, byte);
                if next.is_dead() {
                    continue;
                }
                let child = &self.nodes[id as usize];
                child.tokens.iter().for_each(|&t| set(t));
                if !child.children.is_empty() {
                    work.push((id as usize, next));
                }
            }
        }
        self.masks.fetch_add(1, Ordering::Relaxed);
        self.mask_micros.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        mask
    }
}

/// The grammar of what `format` asks for; an error says which part cannot be compiled.
pub fn compile(format: &Format) -> Result<Grammar, String> {
    match format {
        Format::JsonObject => Ok(schema::any_object()),
        Format::JsonSchema(json) => schema::grammar(json).map_err(|e| format!("the JSON schema at {e}")),
        Format::Regex(pattern) => {
            let mut g = Builder::default();
            let start = regex::rule(&mut g, pattern, false)?;
            g.build(start).map_err(|e| format!("the pattern: {e}"))
        }
        Format::Choice(choices) => {
            let mut g = Builder::default();
            let options = choices.iter().map(|c| g.literal(c.as_bytes())).collect();
            let start = g.alt(options);
            g.build(start).map_err(|e| e.to_string())
        }
    }
}

/// The most masks one grammar keeps; past it the cache starts again.
const MAX_MASKS: usize = 4096;

/// A compiled grammar and the masks computed for its states so far.
pub struct Compiled {
    grammar: Grammar,
    masks: Mutex<HashMap<State, Arc<Vec<u64>>>>,
}

impl Compiled {
    pub fn new(grammar: Grammar) -> Arc<Self> {
        Arc::new(Self { grammar, masks: Mutex::new(HashMap::new()) })
    }
}

/// One sequence's place in its grammar.
pub struct Constraint {
    compiled: Arc<Compiled>,
    vocabulary: Arc<Vocabulary>,
    state: State,
}

impl Constraint {
    pub fn new(compiled: Arc<Compiled>, vocabulary: Arc<Vocabulary>) -> Self {
        let state = compiled.grammar.start();
        Self { compiled, vocabulary, state }
    }

    /// The state after `token`'s bytes, None when the grammar refuses them (end-of-text: where the text is complete).
    fn after(&self, token: u32) -> Option<State> {
        if self.vocabulary.ends.contains(&token) {
            return self.compiled.grammar.accepts(&self.state).then(|| self.state.clone());
        }
        let bytes = self.vocabulary.bytes.get(token as usize)?.as_ref().filter(|b| !b.is_empty())?;
        self.compiled.grammar.advance_bytes(&self.state, bytes)
    }

    pub fn allows(&self, token: u32) -> bool {
        self.after(token).is_some()
    }

    /// Every allowed token, one bit per id (computed once per state of the grammar).
    pub fn mask(&self) -> Arc<Vec<u64>> {
        let cached = self.compiled.masks.lock().expect("the mask cache").get(&self.state).cloned();
        if let Some(mask) = cached {
            return mask;
        }
        let mask = Arc::new(self.vocabulary.mask(&self.compiled.grammar, &self.state));
        let mut masks = self.compiled.masks.lock().expect("the mask cache");
        if masks.len() >= MAX_MASKS {
            masks.clear();
        }
        masks.insert(self.state.clone(), mask.clone());
        mask
    }

    /// Moves past `token`, which must be allowed.
    pub fn advance(&mut self, token: u32) {
        if let Some(state) = self.after(token) {
            self.state = state;
        }
    }

    /// The text is complete and nothing may follow it.
    pub fn is_final(&self) -> bool {
        self.compiled.grammar.is_final(&self.state)
    }
}

/// Whether bit `id` of `mask` is set.
pub fn allowed(mask: &[u64], id: usize) -> bool {
    mask.get(id / 64).is_some_and(|w| w & (1 << (id % 64)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask of a state is exactly the tokens whose bytes the grammar can continue with, end-of-text only where
    /// the text is complete.
    #[test]
    fn masks_hold_the_tokens_the_grammar_continues_with() {
        let text = "{\"a\": [1, 22], \"b\": true}\n".repeat(30);
        let tokenizer = tokenizer::train_bpe_lines(text.lines(), 300, &["<|endoftext|>"]).unwrap();
        let size = tokenizer::vocab_size(&tokenizer);
        let vocabulary = Arc::new(Vocabulary::new(&tokenizer, size));
        let compiled = Compiled::new(compile(&Format::Regex("\\{\"a\": \\[[0-9]+(, [0-9]+)*\\]\\}".into())).unwrap());
        let mut constraint = Constraint::new(compiled.clone(), vocabulary.clone());
        let bytes = tokenizer::token_bytes(&tokenizer);
        let end = tokenizer.token_to_id("<|endoftext|>").unwrap();
        for prefix in ["{\"a\": [", "{\"a\": [1", "{\"a\": [1, 22]}"] {
            let ids = tokenizer::encode(&tokenizer, prefix).unwrap();
            constraint = Constraint::new(compiled.clone(), vocabulary.clone());
            ids.iter().for_each(|&id| constraint.advance(id));
            let mask = constraint.mask();
            for id in 0..size as u32 {
                let continues = bytes[id as usize].as_ref().is_some_and(|b| {
                    let mut text = prefix.as_bytes().to_vec();
                    text.extend(b);
                    let g = &compiled.grammar;
                    !b.is_empty() && g.advance_bytes(&g.start(), &text).is_some()
                });
                let complete = id == end && compiled.grammar.matches(prefix.as_bytes());
                assert_eq!(allowed(&mask, id as usize), continues || complete, "{prefix:?} then id {id}");
            }
        }
        assert!(constraint.is_final());
    }
}
