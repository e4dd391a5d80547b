//! AVX2 / AVX-512 VNNI integer dots of x's codes with W's blocks, the codes built in registers from each format's
//! bytes.

use ember_formats::ggml::{self, Format};

use super::codes::Codes;
use super::quantize::{Scales, XRow};
use crate::cpu::level::has_vnni;
use std::arch::x86_64::*;

/// Σ_blocks (a_h d_x)·(integer lanes) accumulated in eight f32 lanes, plus the offsets; `products` gives the
/// eight i32 lanes of Σ |w| · (x · sign w) over 4 bytes each: lanes 0–3 sum the block's first 16 values, lanes
/// 4–7 its last 16.
#[inline(always)]
fn dot_with(w: &[Codes], q: &[i8], scales: &[Scales], products: impl Fn(__m256i, __m256i) -> __m256i) -> f32 {
    // SAFETY (all intrinsics below): the callers are compiled with AVX2 and FMA, which the CPU has.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut offsets = 0.0;
        for ((c, q), &[d, _, s0, s1]) in w.iter().zip(q.chunks_exact(32)).zip(scales) {
            // Both are 32 bytes: the codes by type, q by `chunks_exact`.
            let wq = _mm256_loadu_si256(c.q.as_ptr().cast());
            let xq = _mm256_loadu_si256(q.as_ptr().cast());
            // |w| (unsigned) times x with w's sign: the products of w and x, as u8 · i8 takes them.
            let lanes = products(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
            let scale = _mm256_set_m128(_mm_set1_ps(c.a[1] * d), _mm_set1_ps(c.a[0] * d));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc);
            offsets += c.m[0] * s0 + c.m[1] * s1;
        }
        horizontal_sum(acc) + offsets
    }
}

/// Whether ggml type `id` is a format whose codes [`dot_rows`] builds straight from its bytes (Q8_0, Q4_0,
/// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), and the CPU has what it is compiled for (AVX2, FMA, F16C).
pub(super) fn in_registers(id: u32) -> bool {
    crate::cpu::has_avx2_fma() && matches!(id, 2 | 3 | 6 | 7 | 8 | 12 | 13 | 14)
}

/// x·w for each row of `w`, consecutive rows of W in one [`in_registers`] format, into `y[0]`, `y[stride]`, …:
/// each row's codes are built in registers from its blocks' bytes (no unpacked copy), 4-bit values as the
/// block's low nibbles then its high nibbles, the bits above them (Q5's fifth, Q6_K's fifth and sixth) from qh.
pub(super) fn dot_rows(format: Format, w: &[u8], x: XRow, y: &mut [f32], stride: usize) {
    let vnni = has_vnni();
    // One instance per format, so the per-block layout is known when it is compiled.
    macro_rules! run {
        ($id:literal) => {
            if vnni {
                // SAFETY: the CPU has the features the function is compiled for (`has_vnni` and the callers'
                // `in_registers`).
                unsafe { rows_vnni::<$id>(w, x, y, stride) }
            } else {
                // SAFETY: the callers check AVX2, FMA and F16C ([`in_registers`]).
                unsafe { rows_avx2::<$id>(w, x, y, stride) }
            }
        };
    }
    match format.id {
        8 => run!(8),
        2 => run!(2),
        3 => run!(3),
        6 => run!(6),
        7 => run!(7),
        12 => run!(12),
        13 => run!(13),
        _ => run!(14),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2<const ID: u32>(w: &[u8], x: XRow, y: &mut [f32], stride: usize) {
    let products = |u: __m256i, s: __m256i| _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
    match ID {
        12..=14 => k_quant_rows::<ID>(w, x, y, stride, products),
        _ => legacy_rows::<ID>(w, x, y, stride, products),
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
fn rows_vnni<const ID: u32>(w: &[u8], x: XRow, y: &mut [f32], stride: usize) {
    let products = |u: __m256i, s: __m256i| _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
    match ID {
        12..=14 => k_quant_rows::<ID>(w, x, y, stride, products),
        _ => legacy_rows::<ID>(w, x, y, stride, products),
    }
}

/// How far ahead of the block being dotted its row's bytes are asked for (`prefetcht0`): with the hardware
/// prefetcher alone two cores read a Q8_0 matrix from memory at ~25 GB/s, ~30 with this.
const PREFETCH: usize = 1024;

/// Block bytes, where the codes start, where qh is (Q5), whether a min follows d, and the zero point of the
/// legacy ggml type `id`.
const fn block_layout(id: u32) -> (usize, usize, Option<usize>, bool, f32) {
    match id {
        8 => (34, 2, None, false, 0.0),
        2 => (18, 2, None, false, 8.0),
        3 => (20, 4, None, true, 0.0),
        6 => (22, 6, Some(2), false, 16.0),
        _ => (24, 8, Some(4), true, 0.0),
    }
}

/// x·w over the blocks of ggml type `ID` for each row of `w`, two blocks a step into two sets of accumulators
/// (a block's sums do not wait for the previous block's).
#[inline(always)]
fn legacy_rows<const ID: u32>(
    w: &[u8],
    (q, scales): XRow,
    y: &mut [f32],
    stride: usize,
    products: impl Fn(__m256i, __m256i) -> __m256i + Copy,
) {
    let bytes = block_layout(ID).0;
    let count = scales.len();
    // SAFETY (all intrinsics below): the callers are compiled with AVX2, FMA and F16C, which the CPU has.
    unsafe {
        for (row, y) in w.chunks_exact(bytes * count).zip(y.iter_mut().step_by(stride)) {
            let (mut acc, mut offsets) = ([_mm256_setzero_ps(); 2], [_mm_setzero_ps(); 2]);
            let pairs = row.chunks_exact(2 * bytes).zip(q.chunks_exact(64)).zip(scales.chunks_exact(2));
            for ((b, q), s) in pairs {
                // A hint only: an address past the matrix is not read, and no fault is raised for it.
                _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH).cast());
                legacy_block::<ID>(&b[..bytes], &q[..32], &s[0], (&mut acc[0], &mut offsets[0]), products);
                legacy_block::<ID>(&b[bytes..], &q[32..], &s[1], (&mut acc[1], &mut offsets[1]), products);
            }
            if count % 2 == 1 {
                let (b, x) = (&row[(count - 1) * bytes..], &q[(count - 1) * 32..]);
                legacy_block::<ID>(b, x, &scales[count - 1], (&mut acc[0], &mut offsets[0]), products);
            }
            let offsets = _mm_add_ps(offsets[0], offsets[1]);
            *y = horizontal_sum(_mm256_add_ps(acc[0], acc[1])) + _mm_cvtss_f32(_mm_movehdup_ps(offsets));
        }
    }
}

/// One block `b` of ggml type `ID` against x's codes `q` and scales `s`: acc += (integer lanes) · d_w d_x, and
/// lane 1 of `offsets` += o_w · d_x Σ q_x, where w = d_w (q − zero) + m_w makes the offset o_w = m_w or
/// −zero · d_w (none for Q8_0's signed codes).
#[inline(always)]
fn legacy_block<const ID: u32>(
    b: &[u8],
    q: &[i8],
    s: &Scales,
    (acc, offsets): (&mut __m256, &mut __m128),
    products: impl Fn(__m256i, __m256i) -> __m256i,
) {
    let (_, codes_at, high_at, has_min, zero) = block_layout(ID);
    // SAFETY (all intrinsics below): the callers are compiled with AVX2, FMA and F16C, which the CPU has; every
    // load reads from a slice of at least the bytes it loads.
    unsafe {
        // [d_w, o_w] from the f16 pair at the block's start, times [d_x, d_x Σ q_x].
        let w_scales = if has_min {
            _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        } else {
            let d = _mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([b[0], b[1]]) as i32));
            if zero == 0.0 { d } else { _mm_mul_ps(_mm_moveldup_ps(d), _mm_setr_ps(1.0, -zero, 0.0, 0.0)) }
        };
        let scaled = match ID {
            8 => _mm_mul_ss(w_scales, _mm_load_ss(&s[0])),
            _ => _mm_mul_ps(w_scales, _mm_castsi128_ps(_mm_loadl_epi64(s.as_ptr().cast()))),
        };
        let xq = _mm256_loadu_si256(q[..32].as_ptr().cast());
        let lanes = if ID == 8 {
            // Signed codes: |w| (unsigned) times x with w's sign, as u8 · i8 takes them.
            let wq = _mm256_loadu_si256(b[2..34].as_ptr().cast());
            products(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq))
        } else {
            // Unsigned codes q ≥ 0 straight into u8 · i8: 16 bytes in both halves, the upper moved down a
            // nibble, so the low nibbles come first and the high ones after.
            let raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(b[codes_at..codes_at + 16].as_ptr().cast()));
            let nibbles =
                _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
            let codes = match high_at {
                Some(at) => {
                    // Byte i of the spread qh takes byte i / 8 of qh; bit i % 8 of it is tested.
                    let spread = _mm256_setr_epi8(
                        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                    );
                    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    let qh = i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
                    _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
                }
                None => nibbles,
            };
            *offsets = _mm_add_ps(*offsets, scaled);
            products(codes, xq)
        };
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_broadcastss_ps(scaled), *acc);
    }
}

/// x·w over the 256-value super-blocks of K-quant type `ID` (Q4_K, Q5_K, Q6_K) for each row of `w`, the
/// sub-blocks alternating between two sets of accumulators.
#[inline(always)]
fn k_quant_rows<const ID: u32>(
    w: &[u8],
    (q, scales): XRow,
    y: &mut [f32],
    stride: usize,
    products: impl Fn(__m256i, __m256i) -> __m256i + Copy,
) {
    let bytes = match ID {
        12 => 144,
        13 => 176,
        _ => 210,
    };
    let supers = scales.len() / 8;
    // SAFETY (all intrinsics below): the callers are compiled with AVX2, FMA and F16C, which the CPU has.
    unsafe {
        for (row, y) in w.chunks_exact(bytes * supers).zip(y.iter_mut().step_by(stride)) {
            let (mut acc, mut offsets) = ([_mm256_setzero_ps(); 2], [0.0f32; 2]);
            for ((b, q), s) in row.chunks_exact(bytes).zip(q.chunks_exact(256)).zip(scales.chunks_exact(8)) {
                // A hint only, as in `legacy_rows`.
                _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH).cast());
                match ID {
                    14 => q6_k_block(b, q, s, (&mut acc, &mut offsets), products),
                    _ => q45_k_block::<ID>(b, q, s, (&mut acc, &mut offsets), products),
                }
            }
            *y = horizontal_sum(_mm256_add_ps(acc[0], acc[1])) + (offsets[0] + offsets[1]);
        }
    }
}

/// The f16 at byte `at` of `b` (F16C).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    // SAFETY: the callers are compiled with F16C, which the CPU has.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([b[at], b[at + 1]]) as i32))) }
}

/// One Q4_K / Q5_K super-block `b` against x's 8 blocks: sub-block j is d · sc_j · q − dmin · m_j; chunk c of
/// 64 values holds sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles), Q5_K's fifth bits at bit j of qh.
#[inline(always)]
fn q45_k_block<const ID: u32>(
    b: &[u8],
    q: &[i8],
    s: &[Scales],
    (acc, offsets): (&mut [__m256; 2], &mut [f32; 2]),
    products: impl Fn(__m256i, __m256i) -> __m256i,
) {
    let (d, dmin, sc) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
    let (qh, qs) = if ID == 13 { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
    // SAFETY (all intrinsics below): the callers are compiled with AVX2, FMA and F16C, which the CPU has; every
    // load reads from a slice of at least the 32 bytes it loads.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let qh = qh.map(|qh| _mm256_loadu_si256(qh.as_ptr().cast()));
        for c in 0..4 {
            let raw = _mm256_loadu_si256(qs[32 * c..32 * c + 32].as_ptr().cast());
            let nibbles = [_mm256_and_si256(raw, low), _mm256_and_si256(_mm256_srli_epi16(raw, 4), low)];
            for (part, mut codes) in nibbles.into_iter().enumerate() {
                let j = 2 * c + part;
                if let Some(qh) = qh {
                    let fifth =
                        _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), _mm256_set1_epi8(1));
                    codes = _mm256_or_si256(codes, _mm256_slli_epi16(fifth, 4));
                }
                let (scale, min) = ggml::scale_min_k4(j, sc);
                let [dx, sum, _, _] = s[j];
                let lanes = products(codes, _mm256_loadu_si256(q[32 * j..32 * j + 32].as_ptr().cast()));
                acc[part] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d * scale * dx), acc[part]);
                offsets[part] -= dmin * min * sum;
            }
        }
    }
}

/// One Q6_K super-block `b` against x's 8 blocks: 16 sub-blocks of 16, d · sc · (q − 32); x's block 4h + t
/// takes the low or high nibbles (t < 2 or not) of ql[64h + 32(t mod 2)..] and bits 2t, 2t + 1 of qh[32h..].
#[inline(always)]
fn q6_k_block(
    b: &[u8],
    q: &[i8],
    s: &[Scales],
    (acc, offsets): (&mut [__m256; 2], &mut [f32; 2]),
    products: impl Fn(__m256i, __m256i) -> __m256i,
) {
    let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], f16_at(b, 208));
    // SAFETY: as in `q45_k_block`.
    unsafe {
        let (low, two) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
        for h in 0..2 {
            let high = _mm256_loadu_si256(qh[32 * h..32 * h + 32].as_ptr().cast());
            for t in 0..4 {
                let at = 64 * h + 32 * (t % 2);
                let raw = _mm256_loadu_si256(ql[at..at + 32].as_ptr().cast());
                let nibbles = if t < 2 { raw } else { _mm256_srli_epi16(raw, 4) };
                let top = _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(2 * t as i32)), two);
                // Unsigned codes q + 32 in 0..64; the 32 comes off through x's half sums.
                let codes = _mm256_or_si256(_mm256_and_si256(nibbles, low), _mm256_slli_epi16(top, 4));
                let i = 4 * h + t;
                let [dx, _, s0, s1] = s[i];
                let (a0, a1) = (d * sc[8 * h + 2 * t] as i8 as f32, d * sc[8 * h + 2 * t + 1] as i8 as f32);
                let lanes = products(codes, _mm256_loadu_si256(q[32 * i..32 * i + 32].as_ptr().cast()));
                // Lanes 0–3 sum the block's first 16 values, 4–7 its last 16.
                let scale = _mm256_set_m128(_mm_set1_ps(a1 * dx), _mm_set1_ps(a0 * dx));
                acc[t % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[t % 2]);
                offsets[t % 2] -= 32.0 * (a0 * s0 + a1 * s1);
            }
        }
    }
}

/// The sum of the eight lanes.
#[inline(always)]
unsafe fn horizontal_sum(acc: __m256) -> f32 {
    // SAFETY: the callers are compiled with AVX2.
    unsafe {
        let quad = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)))
    }
}

#[target_feature(enable = "avx2,fma")]
pub(super) fn dot_avx2(w: &[Codes], q: &[i8], scales: &[Scales]) -> f32 {
    dot_with(w, q, scales, |u, s| _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
}

#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
pub(super) fn dot_vnni(w: &[Codes], q: &[i8], scales: &[Scales]) -> f32 {
    dot_with(w, q, scales, |u, s| _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s))
}
