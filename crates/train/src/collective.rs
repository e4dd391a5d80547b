//! The processes that train one model together (data parallelism): each is a rank of `ranks`, holds a full replica of
//! the model and the optimizer, trains on its own shard of every batch, and sums gradients with the others. One
//! process alone is [`Single`], the default; `mpiexec` launches are [`mpi::Mpi`] (cargo feature `mpi`).

use std::ops::Range;

#[cfg(feature = "mpi")]
pub mod mpi;

/// What the training loop needs from the group of ranks. Every rank calls the same methods in the same order.
pub trait Collective {
    /// This process's rank, in 0..ranks.
    fn rank(&self) -> usize;
    fn ranks(&self) -> usize;
    /// Sums `buf` element-wise over all ranks; every rank receives the same sums.
    fn all_reduce_sum(&self, buf: &mut [f32]);
    /// Whether every rank passed the same `value`.
    fn agree(&self, value: u64) -> bool;
    /// Waits until every rank has called it.
    fn barrier(&self);
    /// This rank's index among the ranks on its machine (they share its cores and GPUs).
    fn local_rank(&self) -> usize;
    /// Ranks on this machine.
    fn local_ranks(&self) -> usize;
    /// Ends every rank with exit status `code`.
    fn abort(&self, code: i32) -> !;
}

/// One process training alone: the collective operations are the identity.
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn ranks(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _buf: &mut [f32]) {}
    fn agree(&self, _value: u64) -> bool {
        true
    }
    fn barrier(&self) {}
    fn local_rank(&self) -> usize {
        0
    }
    fn local_ranks(&self) -> usize {
        1
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// The part of each global batch a rank trains on: rank r of n takes the r-th of n nearly equal parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub rank: usize,
    pub ranks: usize,
}

impl Shard {
    /// The whole batch: one process.
    pub const WHOLE: Shard = Shard { rank: 0, ranks: 1 };

    /// This rank's rows of `n`: ⌊n·r/R⌋..⌊n·(r+1)/R⌋, so the parts cover 0..n once and differ by at most one row.
    pub fn rows(&self, n: usize) -> Range<usize> {
        n * self.rank / self.ranks..n * (self.rank + 1) / self.ranks
    }
}

impl From<&dyn Collective> for Shard {
    fn from(c: &dyn Collective) -> Self {
        Shard { rank: c.rank(), ranks: c.ranks() }
    }
}

/// FNV-1a over 64-bit little-endian words (the tail zero-padded): a fingerprint of bytes, 8 bytes a multiply.
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let words = bytes.chunks(8).map(|w| {
        let mut word = [0u8; 8];
        word[..w.len()].copy_from_slice(w);
        u64::from_le_bytes(word)
    });
    words.fold(0xcbf2_9ce4_8422_2325, |h, w| (h ^ w).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_rows_once_and_differ_by_at_most_one() {
        for ranks in 1..6 {
            for n in 0..20 {
                let parts: Vec<Range<usize>> = (0..ranks).map(|rank| Shard { rank, ranks }.rows(n)).collect();
                let covered: Vec<usize> = parts.iter().flat_map(|r| r.clone()).collect();
                assert_eq!(covered, (0..n).collect::<Vec<_>>());
                let (min, max) = (parts.iter().map(|r| r.len()).min(), parts.iter().map(|r| r.len()).max());
                assert!(max.unwrap() - min.unwrap() <= 1);
            }
        }
    }
}
