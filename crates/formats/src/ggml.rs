//! ggml's tensor formats as GGUF files store them: per type, the block of values it packs, the block's bytes, and
//! its dequantization to f32, computed in ggml's order of operations (so values equal llama.cpp's and gguf-py's
//! bit for bit: crates/formats/tests/ggml_blocks.rs).

/// Quantizes one block's values into its bytes.
pub type Encode = fn(&[f32], &mut [u8]);

/// A tensor type: ggml type id `id`, `block` values in `bytes` bytes, dequantized by `decode` (a block's bytes into
/// `block` values) and, for the formats Ember also writes, quantized by `encode` (`block` values into its bytes).
#[derive(Clone, Copy, Debug)]
pub struct Format {
    pub id: u32,
    pub name: &'static str,
    pub block: usize,
    pub bytes: usize,
    pub decode: fn(&[u8], &mut [f32]),
    pub encode: Option<Encode>,
}

impl PartialEq for Format {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Format {
    /// The bytes of a row of `cols` values, when `cols` is a whole number of blocks.
    pub fn row_bytes(&self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block).then(|| cols / self.block * self.bytes)
    }
}

/// Values per K-quant super-block.
const QK_K: usize = 256;

/// The format of ggml type id `ggml_type`, when Ember reads it.
pub fn format(ggml_type: u32) -> Option<Format> {
    let f = |name, block, bytes, decode, encode| Some(Format { id: ggml_type, name, block, bytes, decode, encode });
    match ggml_type {
        0 => f("F32", 1, 4, f32_le, Some(encode_f32)),
        1 => f("F16", 1, 2, half, Some(encode_f16)),
        30 => f("BF16", 1, 2, bf16, Some(encode_bf16)),
        2 => f("Q4_0", 32, 18, q4_0, Some(encode_q4_0)),
        3 => f("Q4_1", 32, 20, q4_1, Some(encode_q4_1)),
        6 => f("Q5_0", 32, 22, q5_0, Some(encode_q5_0)),
        7 => f("Q5_1", 32, 24, q5_1, Some(encode_q5_1)),
        8 => f("Q8_0", 32, 34, q8_0, Some(encode_q8_0)),
        12 => f("Q4_K", QK_K, 144, q4_k, None),
        13 => f("Q5_K", QK_K, 176, q5_k, None),
        14 => f("Q6_K", QK_K, 210, q6_k, None),
        _ => None,
    }
}

/// The ggml type ids Ember reads.
const IDS: [u32; 11] = [0, 1, 30, 2, 3, 6, 7, 8, 12, 13, 14];

/// The format named `name` (as ggml names it, any case: "q4_k", "F16").
pub fn by_name(name: &str) -> Option<Format> {
    IDS.into_iter().filter_map(format).find(|f| f.name.eq_ignore_ascii_case(name))
}

/// The names of the formats Ember reads, for error messages.
pub const NAMES: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

/// The names of the formats Ember writes.
pub const WRITTEN: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0";

/// IEEE half precision to f32, branch-free so that a loop of it vectorises: the exponent and mantissa moved into an
/// f32's and scaled by 2¹¹² (which also turns half subnormals into f32 normals); infinities kept, NaNs quiet.
#[inline]
pub fn f16(h: u16) -> f32 {
    let magnitude = (h & 0x7fff) as u32;
    let sign = ((h & 0x8000) as u32) << 16;
    let scaled = f32::from_bits(magnitude << 13) * f32::from_bits(0x7780_0000);
    let special = f32::from_bits(if magnitude == 0x7c00 { 0x7f80_0000 } else { 0x7fc0_0000 });
    let value = if magnitude >= 0x7c00 { special } else { scaled };
    f32::from_bits(value.to_bits() | sign)
}

/// The f16 at byte `at` of `b`.
fn scale(b: &[u8], at: usize) -> f32 {
    f16(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn f32_le(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
}

fn half(b: &[u8], y: &mut [f32]) {
    y[0] = scale(b, 0);
}

/// bfloat16: the top half of an f32.
fn bf16(b: &[u8], y: &mut [f32]) {
    y[0] = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
}

/// Q8_0, 32 values: y = d · q with q an i8.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = scale(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = d * q as i8 as f32;
    }
}

/// The 4-bit value i of a 32-value block: i < 16 in the low nibble of byte i, 16 + i in its high nibble.
fn nibble(qs: &[u8], i: usize) -> u8 {
    if i < 16 { qs[i] & 0x0f } else { qs[i - 16] >> 4 }
}

/// Q4_0, 32 values: y = d · (q − 8).
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = scale(b, 0);
    for (i, y) in y.iter_mut().enumerate() {
        *y = (nibble(&b[2..], i) as i32 - 8) as f32 * d;
    }
}

/// Q4_1, 32 values: y = d · q + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (scale(b, 0), scale(b, 2));
    for (i, y) in y.iter_mut().enumerate() {
        *y = nibble(&b[4..], i) as f32 * d + m;
    }
}

/// The 5-bit value i of a 32-value block: its nibble, and bit i of the 32-bit `qh` as the fifth bit.
fn five_bits(qh: u32, qs: &[u8], i: usize) -> u8 {
    nibble(qs, i) | ((((qh >> i) & 1) as u8) << 4)
}

/// Q5_0, 32 values: y = d · (q − 16).
fn q5_0(b: &[u8], y: &mut [f32]) {
    let (d, qh) = (scale(b, 0), u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
    for (i, y) in y.iter_mut().enumerate() {
        *y = (five_bits(qh, &b[6..], i) as i32 - 16) as f32 * d;
    }
}

/// Q5_1, 32 values: y = d · q + m.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m, qh) = (scale(b, 0), scale(b, 2), u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
    for (i, y) in y.iter_mut().enumerate() {
        *y = five_bits(qh, &b[8..], i) as f32 * d + m;
    }
}

/// The 6-bit scale and min of sub-block j (of 8) packed in the 12 bytes `q` of a Q4_K or Q5_K super-block.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    };
    (sc as f32, m as f32)
}

/// Q4_K, 256 values in 8 sub-blocks of 32: y = d · sc_j · q − dmin · m_j, with 6-bit sc_j and m_j.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin, scales, qs) = (scale(b, 0), scale(b, 2), &b[4..16], &b[16..144]);
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1, d2, min2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0f) as f32 - min1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

/// Q5_K, 256 values: as Q4_K with a fifth bit per value from the 32 bytes `qh` (bit 2·chunk and 2·chunk + 1).
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin, scales, qh, qs) = (scale(b, 0), scale(b, 2), &b[4..16], &b[16..48], &b[48..176]);
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, min1, d2, min2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        for l in 0..32 {
            let high = |u: u8| if qh[l] & u != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0x0f) + high(u1)) as f32 - min1;
            y[l + 32] = d2 * ((q[l] >> 4) + high(u2)) as f32 - min2;
        }
    }
}

/// Q6_K, 256 values in 16 sub-blocks of 16: y = d · sc_j · (q − 32), q 6 bits (4 from `ql`, 2 from `qh`), sc_j an i8.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], scale(b, 208));
    for half in 0..2 {
        let (ql, qh, sc, y) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..], &mut y[128 * half..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | (qh[l] & 3) << 4) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) as i32 - 32;
            let q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) as i32 - 32;
            y[l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

/// f32 to IEEE half precision, rounded to nearest even (overflow to ±∞).
pub fn to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    // The 24-bit significand (with its implicit 1) shifted to 10 bits, or further for a subnormal result.
    let (significand, shift) = if e <= 0 { (man | 0x80_0000, (14 - e) as u32) } else { (man | 0x80_0000, 13) };
    if shift > 24 {
        return sign;
    }
    let kept = significand >> shift;
    let rest = significand & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let rounded = kept + u32::from(rest > half || (rest == half && kept & 1 == 1));
    // A normal result keeps its exponent in the top bits; a carry out of the significand bumps it (to ∞ at most).
    let out = if e <= 0 { rounded } else { ((e as u32) << 10) + (rounded - 0x400) };
    sign | out as u16
}

fn put_f16(b: &mut [u8], at: usize, x: f32) {
    b[at..at + 2].copy_from_slice(&to_f16(x).to_le_bytes());
}

fn encode_f32(x: &[f32], b: &mut [u8]) {
    b[..4].copy_from_slice(&x[0].to_le_bytes());
}

fn encode_f16(x: &[f32], b: &mut [u8]) {
    put_f16(b, 0, x[0]);
}

/// bfloat16: the f32 rounded to its top 16 bits, nearest even.
fn encode_bf16(x: &[f32], b: &mut [u8]) {
    let bits = x[0].to_bits();
    let top = if x[0].is_nan() { (bits >> 16) | 0x40 } else { (bits + 0x7fff + ((bits >> 16) & 1)) >> 16 };
    b[..2].copy_from_slice(&(top as u16).to_le_bytes());
}

/// The value of largest magnitude, with its sign.
fn signed_max(x: &[f32]) -> f32 {
    x.iter().copied().fold(0.0f32, |m, v| if v.abs() > m.abs() { v } else { m })
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// Q8_0: d = max|x| / 127, q = round(x / d).
fn encode_q8_0(x: &[f32], b: &mut [u8]) {
    let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
    put_f16(b, 0, d);
    for (q, v) in b[2..34].iter_mut().zip(x) {
        *q = (v * inverse(d)).round() as i8 as u8;
    }
}

/// Packs 32 values of 4 bits: value i < 16 in the low nibble of byte i, 16 + i in its high nibble.
fn put_nibbles(q: &[u8; 32], qs: &mut [u8]) {
    for i in 0..16 {
        qs[i] = (q[i] & 0x0f) | ((q[i + 16] & 0x0f) << 4);
    }
}

/// The fifth bits of 32 five-bit values as `qh` (bit i for value i).
fn high_bits(q: &[u8; 32]) -> [u8; 4] {
    q.iter().enumerate().fold(0u32, |h, (i, &v)| h | (((v >> 4) as u32 & 1) << i)).to_le_bytes()
}

/// Symmetric `levels`-level codes: d = max / −(levels/2) for the signed max, q = x / d + levels/2 in [0, levels).
fn symmetric_codes(x: &[f32], levels: u8) -> (f32, [u8; 32]) {
    let d = signed_max(x) / -(levels as f32 / 2.0);
    let mut q = [0u8; 32];
    for (q, v) in q.iter_mut().zip(x) {
        *q = ((v * inverse(d) + levels as f32 / 2.0 + 0.5) as i32).clamp(0, levels as i32 - 1) as u8;
    }
    (d, q)
}

/// Offset `levels`-level codes: d = (max − min) / (levels − 1), q = (x − min) / d, m = min.
fn offset_codes(x: &[f32], levels: u8) -> (f32, f32, [u8; 32]) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / (levels - 1) as f32;
    let mut q = [0u8; 32];
    for (q, v) in q.iter_mut().zip(x) {
        *q = (((v - min) * inverse(d) + 0.5) as i32).clamp(0, levels as i32 - 1) as u8;
    }
    (d, min, q)
}

/// Q4_0: y = d · (q − 8), d from the value of largest magnitude.
fn encode_q4_0(x: &[f32], b: &mut [u8]) {
    let (d, q) = symmetric_codes(x, 16);
    put_f16(b, 0, d);
    put_nibbles(&q, &mut b[2..18]);
}

/// Q4_1: y = d · q + m over [min, max].
fn encode_q4_1(x: &[f32], b: &mut [u8]) {
    let (d, m, q) = offset_codes(x, 16);
    put_f16(b, 0, d);
    put_f16(b, 2, m);
    put_nibbles(&q, &mut b[4..20]);
}

/// Q5_0: y = d · (q − 16).
fn encode_q5_0(x: &[f32], b: &mut [u8]) {
    let (d, q) = symmetric_codes(x, 32);
    put_f16(b, 0, d);
    b[2..6].copy_from_slice(&high_bits(&q));
    put_nibbles(&q, &mut b[6..22]);
}

/// Q5_1: y = d · q + m.
fn encode_q5_1(x: &[f32], b: &mut [u8]) {
    let (d, m, q) = offset_codes(x, 32);
    put_f16(b, 0, d);
    put_f16(b, 2, m);
    b[4..8].copy_from_slice(&high_bits(&q));
    put_nibbles(&q, &mut b[8..24]);
}

/// Quantizes `values`, whole blocks of `format`, into its bytes; None for a format Ember does not write.
pub fn quantize(format: Format, values: &[f32]) -> Option<Vec<u8>> {
    let encode = format.encode?;
    let mut raw = vec![0u8; values.len() / format.block * format.bytes];
    for (x, b) in values.chunks_exact(format.block).zip(raw.chunks_exact_mut(format.bytes)) {
        encode(x, b);
    }
    Some(raw)
}

/// Dequantizes `raw`, whole blocks of `format`, into f32 values.
pub fn dequantize(format: Format, raw: &[u8]) -> Vec<f32> {
    let mut values = vec![0.0; raw.len() / format.bytes * format.block];
    for (b, y) in raw.chunks_exact(format.bytes).zip(values.chunks_exact_mut(format.block)) {
        (format.decode)(b, y);
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every half-precision value against the definition, field by field (subnormals man · 2⁻²⁴), to the bit.
    #[test]
    fn every_half_precision_value_decodes_as_defined() {
        for h in 0..=u16::MAX {
            let (sign, exp, man) = (((h >> 15) as u32) << 31, ((h >> 10) & 0x1f) as u32, (h & 0x3ff) as u32);
            let want = match (exp, man) {
                (0, 0) => f32::from_bits(sign),
                (0, _) => (if sign != 0 { -1.0 } else { 1.0 }) * man as f32 * 2f32.powi(-24),
                (31, 0) => f32::from_bits(sign | 0x7f80_0000),
                (31, _) => f32::from_bits(sign | 0x7fc0_0000),
                _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
            };
            assert_eq!(f16(h).to_bits(), want.to_bits(), "{h:#06x}");
        }
    }

    #[test]
    fn half_precision_decodes() {
        assert_eq!(f16(0x3c00), 1.0);
        assert_eq!(f16(0xc000), -2.0);
        assert_eq!(f16(0x3555), 0.333_251_95);
        assert_eq!(f16(0x0001), 2f32.powi(-24));
        assert_eq!(f16(0x7c00), f32::INFINITY);
    }

    #[test]
    fn legacy_blocks_dequantize_as_ggml_defines_them() {
        let decode = |ggml_type, bytes: &[u8]| dequantize(format(ggml_type).unwrap(), bytes);
        // d = 0.5 (0x3800), m = −1 (0xbc00); nibbles: low = i % 16, high = 15 − i % 16.
        let qs: Vec<u8> = (0..16u8).map(|i| i | ((15 - i) << 4)).collect();
        let q41: Vec<u8> = [0x00, 0x38, 0x00, 0xbc].into_iter().chain(qs.iter().copied()).collect();
        let x = decode(3, &q41);
        assert_eq!((x[0], x[15], x[16], x[31]), (-1.0, 6.5, 6.5, -1.0));
        let q40: Vec<u8> = [0x00, 0x38].into_iter().chain(qs.iter().copied()).collect();
        let x = decode(2, &q40);
        assert_eq!((x[0], x[3], x[16]), (-4.0, -2.5, 3.5));
        let q80: Vec<u8> = [0x00, 0x38].into_iter().chain((0..32).map(|i| (i as i8 - 16) as u8)).collect();
        assert_eq!((decode(8, &q80)[0], decode(8, &q80)[31]), (-8.0, 7.5));
        // Q5_0: the fifth bit of value i is bit i of qh; all set → nibble + 16 − 16.
        let q50: Vec<u8> = [0x00, 0x38, 0xff, 0xff, 0xff, 0xff].into_iter().chain(qs.iter().copied()).collect();
        let x = decode(6, &q50);
        assert_eq!((x[0], x[15], x[16]), (0.0, 7.5, 7.5));
    }
}
