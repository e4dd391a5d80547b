//! Blocks of every ggml format unpacked to 32 signed 8-bit codes with a scale and an offset per 16 values,
//! w_i = a_h q_i + m_h, and their integer dot with x's codes.

use ember_formats::ggml::{self, Format};

use super::quantize::Scales;
#[cfg(target_arch = "x86_64")]
use super::x86;

/// 32 weights w_i = a_h q_i + m_h, h = i / 16.
#[derive(Clone, Copy, Default)]
pub(super) struct Codes {
    pub(super) q: [i8; 32],
    pub(super) a: [f32; 2],
    pub(super) m: [f32; 2],
}

crate::cpu::multiversion! {
    /// A row of blocks of `format` as codes, 32 values each.
    pub(super) fn unpack_row(format: Format, row: &[u8], codes: &mut [Codes]) {
        let per_block = format.block / 32;
        for (block, codes) in row.chunks_exact(format.bytes).zip(codes.chunks_exact_mut(per_block)) {
            unpack(format.id, block, codes);
        }
    }
}

/// Every f16 as f32, by bit pattern (256 KiB, built once): a block's scales are read through it.
pub(super) static HALVES: std::sync::LazyLock<Box<[f32]>> =
    std::sync::LazyLock::new(|| (0..=u16::MAX).map(ggml::f16).collect());

/// The f16 at byte `at` of `b`.
#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    HALVES[u16::from_le_bytes([b[at], b[at + 1]]) as usize]
}

/// Codes of 32 values from 4-bit `qs` (value i < 16 in the low nibble of byte i, 16 + i in the high one), the
/// fifth bit of value i at bit i of `qh` when given, minus `zero`.
#[inline(always)]
fn nibbles(qs: &[u8], qh: Option<u32>, zero: i8, q: &mut [i8; 32]) {
    for i in 0..16 {
        q[i] = (qs[i] & 0x0f) as i8;
        q[i + 16] = (qs[i] >> 4) as i8;
    }
    if let Some(qh) = qh {
        for (i, q) in q.iter_mut().enumerate() {
            *q |= (((qh >> i) & 1) << 4) as i8;
        }
    }
    q.iter_mut().for_each(|q| *q -= zero);
}

/// One block of ggml type `id` as codes (one per 32 values), the same values `ggml::dequantize` gives.
#[inline(always)]
pub(super) fn unpack(id: u32, b: &[u8], out: &mut [Codes]) {
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let c = &mut out[0];
    match id {
        // Q8_0: d · q.
        8 => {
            c.q.iter_mut().zip(&b[2..34]).for_each(|(q, &v)| *q = v as i8);
            (c.a, c.m) = ([half(b, 0); 2], [0.0; 2]);
        }
        // Q4_0: d · (q − 8); Q4_1: d · q + m; Q5_0: d · (q − 16); Q5_1: d · q + m.
        2 => {
            nibbles(&b[2..18], None, 8, &mut c.q);
            (c.a, c.m) = ([half(b, 0); 2], [0.0; 2]);
        }
        3 => {
            nibbles(&b[4..20], None, 0, &mut c.q);
            (c.a, c.m) = ([half(b, 0); 2], [half(b, 2); 2]);
        }
        6 => {
            nibbles(&b[6..22], Some(word(2)), 16, &mut c.q);
            (c.a, c.m) = ([half(b, 0); 2], [0.0; 2]);
        }
        7 => {
            nibbles(&b[8..24], Some(word(4)), 0, &mut c.q);
            (c.a, c.m) = ([half(b, 0); 2], [half(b, 2); 2]);
        }
        // Q4_K / Q5_K: sub-block j is d · sc_j · q − dmin · m_j; chunk c of 64 values holds sub-blocks 2c (low
        // nibbles) and 2c + 1 (high nibbles), Q5_K's fifth bits at bits 2c and 2c + 1 of qh.
        12 | 13 => {
            let (d, dmin, scales) = (half(b, 0), half(b, 2), &b[4..16]);
            let (qh, qs) = if id == 13 { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for (j, c) in out.iter_mut().enumerate() {
                let (sc, m) = ggml::scale_min_k4(j, scales);
                let (chunk, high) = (j / 2, j % 2 == 1);
                let q = &qs[32 * chunk..32 * chunk + 32];
                for (l, v) in c.q.iter_mut().enumerate() {
                    let nibble = if high { q[l] >> 4 } else { q[l] & 0x0f };
                    let fifth = qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4);
                    *v = (nibble | fifth) as i8;
                }
                (c.a, c.m) = ([d * sc; 2], [-dmin * m; 2]);
            }
        }
        // Q6_K: 16 sub-blocks of 16, d · sc · (q − 32); block t (of 4) of half h holds values 128h + 32t + l.
        14 => {
            let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], half(b, 208));
            for (i, c) in out.iter_mut().enumerate() {
                let (h, t) = (i / 4, i % 4);
                let (ql, qh) = (&ql[64 * h + 32 * (t % 2)..], &qh[32 * h..]);
                for (l, v) in c.q.iter_mut().enumerate() {
                    let low = if t < 2 { ql[l] & 0x0f } else { ql[l] >> 4 };
                    *v = (low | ((qh[l] >> (2 * t)) & 3) << 4) as i8 - 32;
                }
                let s = &sc[8 * h + 2 * t..];
                c.a = [d * s[0] as i8 as f32, d * s[1] as i8 as f32];
                c.m = [0.0; 2];
            }
        }
        _ => unreachable!("ggml type {id} is not a block format"),
    }
}

/// Σ over blocks of x·w in the integer form of the module comment.
pub(super) fn dot_codes(w: &[Codes], q: &[i8], scales: &[Scales]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::level::has_vnni() {
            // SAFETY: the CPU has the features the function is compiled for (checked just above).
            return unsafe { x86::dot_vnni(w, q, scales) };
        }
        if crate::cpu::has_avx2_fma() {
            // SAFETY: as above.
            return unsafe { x86::dot_avx2(w, q, scales) };
        }
    }
    dot_portable(w, q, scales)
}

pub(super) fn dot_portable(w: &[Codes], q: &[i8], scales: &[Scales]) -> f32 {
    let mut acc = 0.0;
    for ((c, q), &[d, _, s0, s1]) in w.iter().zip(q.chunks_exact(32)).zip(scales) {
        let half = |h: usize| (16 * h..16 * h + 16).map(|i| c.q[i] as i32 * q[i] as i32).sum::<i32>() as f32;
        acc += d * (c.a[0] * half(0) + c.a[1] * half(1)) + c.m[0] * s0 + c.m[1] * s1;
    }
    acc
}
