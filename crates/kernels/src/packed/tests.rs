use super::codes::{Codes, dot_codes, dot_portable, unpack};
use super::product::{TILED_ROWS, Walk, product};
use super::quantize::Activations;
use super::*;
use ember_formats::ggml::by_name;

/// Values of a few magnitudes, negative and positive, the same for every run.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ember_formats::Rng::new(seed);
    (0..n).map(|i| (rng.normal() * (1.0 + (i % 7) as f64)) as f32).collect()
}

/// x Wᵀ by f32 products with W dequantized.
fn reference(x: &[f32], n: usize, w: &Packed) -> Vec<f32> {
    let (k, dense) = (w.cols, w.dequantize());
    let m = w.rows();
    (0..n * m).map(|e| dense[(e % m) * k..][..k].iter().zip(&x[(e / m) * k..][..k]).map(|(a, b)| a * b).sum()).collect()
}

/// Every written format, packed and multiplied, against dequantize-then-f32: the only difference is x's 8-bit
/// quantization, within 1% of Σ|x_i w_i| (x's step is 1/254 of its block's range; the sums cancel most of it).
#[test]
fn packed_products_equal_dequantized_ones_within_the_activation_rounding() {
    // 28 rows: the last chunk of W ends inside a tile; 21 rows of x: groups of 4 and one left over; rows of 8
    // and of 9 blocks (the dots take blocks two at a time).
    let m = 28;
    for (k, name) in [256, 288]
        .into_iter()
        .flat_map(|k| ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16", "F32"].map(|name| (k, name)))
    {
        let w = Packed::quantize(by_name(name).unwrap(), m, k, &values(m * k, 1)).unwrap();
        for n in [1, 3, TILED_ROWS, 21] {
            check(&values(n * k, 2), n, &w, name);
        }
    }
}

/// `blocks` random blocks of ggml type `id`, their f16 scales set small and positive.
fn random_blocks(id: u32, blocks: usize, rng: &mut ember_formats::Rng) -> Vec<u8> {
    let format = ggml::format(id).unwrap();
    let mut bytes: Vec<u8> = (0..format.bytes * blocks).map(|_| (rng.next_u64() >> 24) as u8).collect();
    let scales = match id {
        12 | 13 | 3 | 7 => vec![0, 2],
        14 => vec![208],
        _ => vec![0],
    };
    for block in bytes.chunks_exact_mut(format.bytes) {
        for &at in &scales {
            block[at..at + 2].copy_from_slice(&ggml::to_f16(0.01 + (at as f32) * 1e-3).to_le_bytes());
        }
    }
    bytes
}

/// The K-quants (which Ember reads but does not write), from random blocks, against dequantize-then-f32, alone
/// and as a Q4_K + Q6_K stack (a chunk of W whose halves of a block have their own scales in some rows only).
#[test]
fn k_quant_products_equal_dequantized_ones_within_the_activation_rounding() {
    let (k, m, mut rng) = (512, 12, ember_formats::Rng::new(6));
    let mut random =
        |id| Packed::new(ggml::format(id).unwrap(), m, k, random_blocks(id, m * k / 256, &mut rng)).unwrap();
    let stack = Packed::stack(vec![random(12), random(14)]).unwrap();
    for (w, name) in [(random(12), "Q4_K"), (random(13), "Q5_K"), (random(14), "Q6_K"), (stack, "Q4_K+Q6_K")] {
        for n in [2, 5] {
            check(&values(n * k, 7), n, &w, name);
        }
    }
}

/// Every walk this CPU can take through W.
fn walks(layout: &Layout) -> Vec<Walk> {
    let mut walks = vec![Walk::Dots, Walk::Dequantized];
    #[cfg(target_arch = "x86_64")]
    if let Some(tiles) = Walk::tiles(layout) {
        // Split tiles serve every format; the unsplit ones where the walk would choose them.
        walks.push(Walk::Tiles { split: true });
        walks.push(tiles);
    }
    walks
}

/// y = x Wᵀ by the packed kernel, on every walk, within 1% of Σ|x_i w_i| of the dequantized product.
fn check(x: &[f32], n: usize, w: &Packed, name: &str) {
    let (k, m, layout) = (w.cols, w.rows(), layout(w));
    let (r, dense) = (reference(x, n, w), w.dequantize());
    for walk in walks(&layout) {
        let y = product(x, n, &w.bytes, &layout, walk);
        assert_eq!(y.len(), r.len());
        for (e, (a, b)) in y.iter().zip(&r).enumerate() {
            let (i, j) = (e / m, e % m);
            let scale: f32 = dense[j * k..][..k].iter().zip(&x[i * k..][..k]).map(|(a, b)| (a * b).abs()).sum();
            assert!((a - b).abs() <= 1e-2 * scale, "{name} n={n} {walk:?} y[{i},{j}]: {a} vs {b} (Σ|xw| {scale})");
        }
    }
}

/// The unpacked codes of every format give back the dequantized values exactly.
#[test]
fn codes_equal_the_dequantized_values() {
    let mut rng = ember_formats::Rng::new(3);
    for id in [8u32, 2, 3, 6, 7, 12, 13, 14] {
        let format = ggml::format(id).unwrap();
        let block = random_blocks(id, 1, &mut rng);
        let expected = ggml::dequantize(format, &block);
        let mut codes = vec![Codes::default(); format.block / 32];
        unpack(id, &block, &mut codes);
        for (i, want) in expected.iter().enumerate() {
            let c = &codes[i / 32];
            let h = (i % 32) / 16;
            let got = c.a[h] * c.q[i % 32] as f32 + c.m[h];
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{} value {i}: {got} vs {want}", format.name);
        }
    }
}

/// The three integer dots (VNNI, AVX2, portable) agree on random codes, the extremes (−128 weights) included.
#[test]
fn integer_dots_agree() {
    let mut rng = ember_formats::Rng::new(4);
    let w: Vec<Codes> = (0..9)
        .map(|b| {
            let mut c = Codes { a: [0.5, -0.25], m: [0.1, 0.2], ..Codes::default() };
            c.q.iter_mut().for_each(|q| *q = if b == 0 { -128 } else { (rng.next_u64() >> 56) as u8 as i8 });
            c
        })
        .collect();
    let x = values(9 * 32, 5);
    let acts = Activations::quantize(&x, 9 * 32);
    let (q, s) = acts.row(0);
    let portable = dot_portable(&w, q, s);
    let fast = dot_codes(&w, q, s);
    assert!((portable - fast).abs() <= 1e-4 * portable.abs().max(1.0), "{portable} vs {fast}");
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        let avx2 = unsafe { x86::dot_avx2(&w, q, s) };
        assert!((portable - avx2).abs() <= 1e-4 * portable.abs().max(1.0), "{portable} vs {avx2}");
    }
}
