//! SentencePiece model files (`*.model`; Marian's `source.spm` and `target.spm`): the protobuf `ModelProto` read for
//! what a tokenizer needs — each piece's text, score and type, whether the model is a unigram one, and its normalizer
//! (the precompiled character map, the dummy prefix, the whitespace rule). Every other field is skipped.

/// A piece's role (sentencepiece_model.proto's `SentencePiece.Type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub text: String,
    pub score: f32,
    pub kind: PieceKind,
}

/// The parts of a SentencePiece model a tokenizer is built from.
#[derive(Clone, Debug, PartialEq)]
pub struct SentencePiece {
    pub pieces: Vec<Piece>,
    /// Unigram (the default) rather than BPE, word or character.
    pub unigram: bool,
    /// The normalizer's compiled rules (nmt_nfkc's, usually); empty for none.
    pub charsmap: Vec<u8>,
    /// "▁" before the text, as if it began with a space.
    pub add_dummy_prefix: bool,
    /// Leading and trailing whitespace dropped and inner runs collapsed to one space.
    pub remove_extra_whitespaces: bool,
}

/// One field of a protobuf message: its number and its value.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
    Fixed64,
}

/// The fields of a protobuf message, in order.
struct Fields<'a> {
    bytes: &'a [u8],
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.bytes.split_first().ok_or("a varint runs past the end")?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.bytes.len() {
            return Err(format!("a field of {n} bytes runs past the end"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn next_field(&mut self) -> Result<Option<(u64, Value<'a>)>, String> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed64
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| "a length past the address space")?;
                Value::Bytes(self.take(n)?)
            }
            5 => Value::Fixed32(self.take(4)?.try_into().expect("4 bytes")),
            wire => return Err(format!("wire type {wire} is not one SentencePiece models use")),
        };
        Ok(Some((key >> 3, value)))
    }
}

/// Calls `each` with every field of the message `bytes`.
fn fields<'a>(bytes: &'a [u8], mut each: impl FnMut(u64, Value<'a>) -> Result<(), String>) -> Result<(), String> {
    let mut fields = Fields { bytes };
    while let Some((number, value)) = fields.next_field()? {
        each(number, value)?;
    }
    Ok(())
}

fn piece(bytes: &[u8]) -> Result<Piece, String> {
    let mut piece = Piece { text: String::new(), score: 0.0, kind: PieceKind::Normal };
    fields(bytes, |number, value| {
        match (number, value) {
            (1, Value::Bytes(text)) => {
                piece.text = String::from_utf8(text.to_vec()).map_err(|_| "a piece is not UTF-8")?;
            }
            (2, Value::Fixed32(score)) => piece.score = f32::from_le_bytes(score),
            (3, Value::Varint(kind)) => {
                piece.kind = match kind {
                    1 => PieceKind::Normal,
                    2 => PieceKind::Unknown,
                    3 => PieceKind::Control,
                    4 => PieceKind::UserDefined,
                    5 => PieceKind::Unused,
                    6 => PieceKind::Byte,
                    other => return Err(format!("piece type {other} is unknown")),
                }
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(piece)
}

/// The SentencePiece model in `bytes`.
pub fn read(bytes: &[u8]) -> Result<SentencePiece, String> {
    let mut model = SentencePiece {
        pieces: Vec::new(),
        unigram: true,
        charsmap: Vec::new(),
        add_dummy_prefix: true,
        remove_extra_whitespaces: true,
    };
    fields(bytes, |number, value| {
        match (number, value) {
            (1, Value::Bytes(bytes)) => model.pieces.push(piece(bytes)?),
            // TrainerSpec.model_type: 1 unigram, 2 BPE, 3 word, 4 char.
            (2, Value::Bytes(bytes)) => fields(bytes, |number, value| {
                if let (3, Value::Varint(kind)) = (number, value) {
                    model.unigram = kind == 1;
                }
                Ok(())
            })?,
            (3, Value::Bytes(bytes)) => fields(bytes, |number, value| {
                match (number, value) {
                    (2, Value::Bytes(charsmap)) => model.charsmap = charsmap.to_vec(),
                    (3, Value::Varint(on)) => model.add_dummy_prefix = on != 0,
                    (4, Value::Varint(on)) => model.remove_extra_whitespaces = on != 0,
                    _ => {}
                }
                Ok(())
            })?,
            _ => {}
        }
        Ok(())
    })?;
    if model.pieces.is_empty() {
        return Err("no pieces: not a SentencePiece model".into());
    }
    if !model.charsmap.is_empty() {
        check_charsmap(&model.charsmap)?;
    }
    Ok(model)
}

/// Whether the `tokenizers` crate's `Precompiled` normalizer can search `charsmap` without indexing out of bounds:
/// a trie of u32 units (its byte length first) then the normalized text. A search from the root XORs each input byte
/// into the position and reads the unit there, whatever the byte; so every position reachable through matching labels
/// must have all 255 neighbours inside the trie, a leaf's value unit too, and each value must start a character of
/// the normalized text.
fn check_charsmap(charsmap: &[u8]) -> Result<(), String> {
    let bad = || "the normalizer's character map is malformed".to_string();
    let (size, rest) = charsmap.split_first_chunk::<4>().ok_or_else(bad)?;
    let length = (u32::from_le_bytes(*size) / 4) as usize * 4;
    if length > rest.len() {
        return Err(bad());
    }
    let trie: Vec<usize> =
        rest[..length].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let normalized = std::str::from_utf8(&rest[length..]).map_err(|_| bad())?;
    // The unit layout of sentencepiece's double array (darts-clone).
    let offset = |unit: usize| (unit >> 10) << ((unit & (1 << 9)) >> 6);
    let label = |unit: usize| unit & ((1 << 31) | 0xff);
    let has_leaf = |unit: usize| (unit >> 8) & 1 == 1;
    let value = |unit: usize| unit & ((1 << 31) - 1);
    let root = *trie.first().ok_or_else(bad)?;
    // Each position is reached from a unit of the trie, so there are finitely many and the walk ends.
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![offset(root)];
    while let Some(position) = stack.pop() {
        if !seen.insert(position) {
            continue;
        }
        for c in 1..=255usize {
            let unit = *trie.get(position ^ c).ok_or_else(bad)?;
            if label(unit) != c {
                continue;
            }
            let next = (position ^ c) ^ offset(unit);
            if has_leaf(unit) {
                let leaf = *trie.get(next).ok_or_else(bad)?;
                if !normalized.is_char_boundary(value(leaf)) {
                    return Err(bad());
                }
            }
            stack.push(next);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_and_foreign_bytes_are_errors_not_panics() {
        assert!(read(b"").is_err());
        assert!(read(&[0x0a, 0x05, 0x0a]).unwrap_err().contains("runs past the end"));
        assert!(read(&[0x0b]).unwrap_err().contains("wire type 3"));
        assert!(read(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).is_err());
        // One piece "a" with score −1.5 and type normal.
        let score = (-1.5f32).to_le_bytes();
        let piece = [&[0x0a, 0x01, b'a', 0x15][..], &score, &[0x18, 0x01]].concat();
        let model = [&[0x0a, piece.len() as u8][..], &piece].concat();
        let read = read(&model).unwrap();
        assert_eq!(read.pieces, [Piece { text: "a".into(), score: -1.5, kind: PieceKind::Normal }]);
        assert!(read.unigram && read.add_dummy_prefix && read.charsmap.is_empty());
    }
}
