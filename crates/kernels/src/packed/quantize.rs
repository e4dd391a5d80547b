//! x's rows quantized to 8 bits per block of 32 (d_x = max|x| / 127, q_x = round(x / d_x)), with the block sums the
//! integer dots take their offsets from.

/// A row of x quantized: its codes and its blocks' [`Scales`].
pub(super) type XRow<'a> = (&'a [i8], &'a [Scales]);

/// A block of x's scale and sums: [d_x, d_x Σ q_x, d_x Σ_{i<16} q_x,i, d_x Σ_{i≥16} q_x,i] (the first two side by
/// side, as the legacy-format dot loads them together).
pub(super) type Scales = [f32; 4];

/// Rows of x quantized per block of 32: codes q_x and each block's [`Scales`].
pub(super) struct Activations {
    pub(super) blocks: usize,
    pub(super) q: Vec<i8>,
    pub(super) scales: Vec<Scales>,
}

impl Activations {
    pub(super) fn quantize(x: &[f32], k: usize) -> Self {
        let blocks = x.len() / 32;
        let mut out = Self { blocks: k / 32, q: vec![0; blocks * 32], scales: vec![[0.0; 4]; blocks] };
        quantize_blocks(x, &mut out.q, &mut out.scales);
        out
    }

    /// Row r's codes and scales.
    pub(super) fn row(&self, r: usize) -> XRow<'_> {
        let b = r * self.blocks..(r + 1) * self.blocks;
        (&self.q[b.start * 32..b.end * 32], &self.scales[b])
    }
}

crate::cpu::multiversion! {
    /// q = round(x / d) with d = max|x| / 127 per block of 32, and d Σ q over the block and over each half.
    pub(super) fn quantize_blocks(x: &[f32], q: &mut [i8], scales: &mut [Scales]) {
        for ((x, q), scales) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).zip(scales) {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for (q, v) in q.iter_mut().zip(x) {
                *q = (v * inverse).round() as i8;
            }
            let sum = |h: &[i8]| h.iter().map(|&v| v as i32).sum::<i32>();
            let (first, second) = (sum(&q[..16]), sum(&q[16..]));
            *scales = [d, (first + second) as f32 * d, first as f32 * d, second as f32 * d];
        }
    }
}
