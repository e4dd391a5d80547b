//! Parallel corpora: sentence pairs of a TSV text or of two line-aligned texts.

/// Sentence pairs of TSV text: each line `source<TAB>target` (further tabs belong to the target), both trimmed. The
/// error is the 1-based number of the first line without a tab.
pub fn pairs(text: &str) -> Result<Vec<(String, String)>, usize> {
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let (s, t) = line.split_once('\t').ok_or(i + 1)?;
            Ok((s.trim().to_string(), t.trim().to_string()))
        })
        .collect()
}

/// Sentence pairs of two line-aligned texts, trimmed. The error is the two line counts when they differ.
pub fn aligned(source: &str, target: &str) -> Result<Vec<(String, String)>, (usize, usize)> {
    let (s, t): (Vec<&str>, Vec<&str>) = (source.lines().collect(), target.lines().collect());
    if s.len() != t.len() {
        return Err((s.len(), t.len()));
    }
    Ok(s.into_iter().zip(t).map(|(a, b)| (a.trim().to_string(), b.trim().to_string())).collect())
}
