//! Rows of F32, F16 and BF16 values (ggml types 0, 1 and 30) used as they are stored: each value converted to f32 as
//! it is read, with no dequantized copy of the row (through ggml's per-value decoder, a decoded token of an F32 or
//! F16 GGUF ran at a twelfth of the speed of the same weights held as f32).

use ember_formats::ggml;

use crate::cpu::multiversion;

/// f32 from bfloat16 bits: the upper half of an f32.
#[inline(always)]
fn brain(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The value of each `S`-byte element of `w`, in order.
#[inline(always)]
fn values<const S: usize>(w: &[u8], value: impl Fn([u8; S]) -> f32) -> impl Iterator<Item = f32> {
    w.chunks_exact(S).map(move |b| value(b.try_into().expect("S bytes")))
}

/// Σ_e w_e x_e with eight partial sums, in the order of `cpu::dot` over the dequantized row (so the result is the
/// same to the bit).
#[inline(always)]
fn dot_with<const S: usize>(w: &[u8], x: &[f32], value: impl Fn([u8; S]) -> f32 + Copy) -> f32 {
    let mut acc = [0.0f32; 8];
    let (w8, x8) = (w.chunks_exact(8 * S), x.chunks_exact(8));
    let tail: f32 = values(w8.remainder(), value).zip(x8.remainder()).map(|(w, x)| w * x).sum();
    for (w, x) in w8.zip(x8) {
        for (e, w) in values(w, value).enumerate() {
            acc[e] += w * x[e];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// x·w for a row w of ggml type `id` (F32, F16 or BF16) and x of as many values; F16 through F16C's conversion
/// where the CPU has it.
pub(super) fn dot_dense(id: u32, w: &[u8], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if id == 1 && crate::cpu::has_avx2_fma() {
        // SAFETY: the AVX2 level includes FMA and F16C.
        return unsafe { dot_f16c(w, x) };
    }
    dot_converted(id, w, x)
}

multiversion! {
    /// [`dot_dense`] with each value converted in plain Rust.
    fn dot_converted(id: u32, w: &[u8], x: &[f32]) -> f32 {
        match id {
            0 => dot_with::<4>(w, x, f32::from_le_bytes),
            1 => dot_with::<2>(w, x, |b| ggml::f16(u16::from_le_bytes(b))),
            _ => dot_with::<2>(w, x, |b| brain(u16::from_le_bytes(b))),
        }
    }
}

/// [`dot_with`] over F16 values converted eight at a time by `vcvtph2ps`: the same eight partial sums, multiplied
/// and added apart, so the same result to the bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f16c(w: &[u8], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let (w8, x8) = (w.chunks_exact(16), x.chunks_exact(8));
    let tail: f32 =
        values::<2>(w8.remainder(), |b| ggml::f16(u16::from_le_bytes(b))).zip(x8.remainder()).map(|(w, x)| w * x).sum();
    let mut acc = _mm256_setzero_ps();
    for (w, x) in w8.zip(x8) {
        // SAFETY: the loads read 16 bytes of `w` and 8 f32 of `x`, which hold that many.
        let (w, x) = unsafe { (_mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().cast())), _mm256_loadu_ps(x.as_ptr())) };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(w, x));
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: the store writes 8 f32 into `lanes`.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    lanes.iter().sum::<f32>() + tail
}

multiversion! {
    /// A row of ggml type `id` (F32, F16 or BF16) appended to `out` as f32.
    pub(super) fn extend_dense(id: u32, w: &[u8], out: &mut Vec<f32>) {
        match id {
            0 => out.extend(values::<4>(w, f32::from_le_bytes)),
            1 => out.extend(values::<2>(w, |b| ggml::f16(u16::from_le_bytes(b)))),
            _ => out.extend(values::<2>(w, |b| brain(u16::from_le_bytes(b)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_dots_equal_the_dot_of_the_dequantized_row_to_the_bit() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        for id in [0, 1, 30] {
            let format = ggml::format(id).unwrap();
            let w: Vec<u8> = (0..37 * format.bytes).map(|i| (i * 151 % 251) as u8 & 0x3f).collect();
            let values = ggml::dequantize(format, &w);
            assert_eq!(dot_dense(id, &w, &x).to_bits(), crate::cpu::dot(&values, &x).to_bits(), "type {id}");
            let mut out = Vec::new();
            extend_dense(id, &w, &mut out);
            assert_eq!(out, values, "type {id}");
        }
    }
}
