//! Drafts for speculative decoding. Prompt lookup: the tokens that followed the latest earlier occurrence of the
//! sequence's last n tokens (n from 3 down to 1) are a likely continuation wherever the output copies its context
//! (rewriting, quoting, editing code), and cost no model to draft.

/// The longest suffix matched.
const MAX_NGRAM: usize = 3;

/// Up to `k` tokens that followed the latest earlier occurrence of the last n tokens of `ids`, for the largest n
/// (at most 3) that occurs earlier; none when no suffix recurs.
pub fn lookup(ids: &[u32], k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    for n in (1..=MAX_NGRAM.min(ids.len().saturating_sub(1))).rev() {
        let suffix = &ids[ids.len() - n..];
        // The latest start before the suffix itself.
        if let Some(start) = (0..ids.len() - n).rev().find(|&s| &ids[s..s + n] == suffix) {
            let from = start + n;
            return ids[from..(from + k).min(ids.len())].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_continue_the_latest_earlier_occurrence_of_the_suffix() {
        //            0  1  2  3  4  5  6  7  8  9
        let ids = [5, 6, 7, 8, 9, 1, 5, 6, 7];
        assert_eq!(lookup(&ids, 3), [8, 9, 1], "the trigram 5 6 7 was followed by 8 9 1");
        assert_eq!(lookup(&ids, 10), [8, 9, 1, 5, 6, 7], "at most what follows");
        assert_eq!(lookup(&[1, 2, 3, 4], 2), Vec::<u32>::new(), "nothing recurs");
        assert_eq!(lookup(&[4, 2, 9, 4, 2, 7, 2], 2), [7, 2], "the latest occurrence of the longest suffix: 2");
        assert_eq!(lookup(&ids, 0), Vec::<u32>::new());
    }
}
