//! Products with packed ggml blocks on wgpu (lavapipe here) against the CPU: the shader dequantizes every format as
//! ggml defines it and keeps x in f32, so it equals x Wᵀ with W dequantized to within f32 summation order (1e-4 of
//! Σ|x w|), and the CPU kernel (8-bit x below 16 rows) to within that rounding (1e-2 of Σ|x w|). The embedding
//! lookup gives W's rows exactly.

use burn::module::Param;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use ember_formats::Rng;
use ember_formats::ggml;
use ember_formats::packed::Packed;
use ember_kernels::PackedLinear;
use ember_test_support::{values, wgpu_test_device};

/// `n` values of a few magnitudes.
fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|i| (rng.normal() * (1.0 + (i % 5) as f64)) as f32).collect()
}

/// A [rows, cols] matrix of ggml type `id`: quantized from normal values where Ember writes the format, else random
/// blocks with small positive f16 scales (the K-quants).
fn matrix(id: u32, rows: usize, cols: usize, seed: u64) -> Packed {
    let format = ggml::format(id).unwrap();
    if format.encode.is_some() {
        return Packed::quantize(format, rows, cols, &normal(rows * cols, seed)).unwrap();
    }
    let mut rng = Rng::new(seed);
    let mut bytes: Vec<u8> =
        (0..rows * cols / format.block * format.bytes).map(|_| (rng.next_u64() >> 24) as u8).collect();
    let scales: &[usize] = if id == 14 { &[208] } else { &[0, 2] };
    for block in bytes.chunks_exact_mut(format.bytes) {
        for &at in scales {
            block[at..at + 2].copy_from_slice(&ggml::to_f16(0.01).to_le_bytes());
        }
    }
    Packed::new(format, rows, cols, bytes).unwrap()
}

#[test]
fn packed_products_and_rows_on_wgpu_equal_the_cpu() {
    let Some(gpu) = wgpu_test_device() else { return };
    let cpu = Device::flex();
    let (k, m) = (512, 40);
    // Every format, and a matrix of two parts (Q4_K rows over Q6_K rows, as a Gemma 3 q/v projection stacks).
    let mut cases: Vec<(String, Packed)> = [0u32, 1, 30, 2, 3, 6, 7, 8, 12, 13, 14]
        .iter()
        .map(|&id| (ggml::format(id).unwrap().name.to_string(), matrix(id, m, k, id as u64)))
        .collect();
    cases.push(("Q4_K + Q6_K".into(), Packed::stack(vec![matrix(12, 24, k, 1), matrix(14, 16, k, 2)]).unwrap()));
    for (name, w) in cases {
        let dense = w.dequantize();
        for n in [1, 3, 130] {
            let x = normal(n * k, 7);
            let on = |device: &Device| {
                let layer = PackedLinear::new(&w, None::<Param<Tensor<1>>>, device);
                values(layer.forward(Tensor::<2>::from_data(TensorData::new(x.clone(), [n, k]), device)))
            };
            let (y_gpu, y_cpu) = (on(&gpu), on(&cpu));
            for e in 0..n * m {
                let (i, j) = (e / m, e % m);
                let pairs = dense[j * k..][..k].iter().zip(&x[i * k..][..k]);
                let (exact, scale): (f32, f32) =
                    pairs.fold((0.0, 0.0), |(s, a), (w, x)| (s + w * x, a + (w * x).abs()));
                assert!(
                    (y_gpu[e] - exact).abs() <= 1e-4 * scale,
                    "{name} n={n} y[{i},{j}]: wgpu {} vs {exact}",
                    y_gpu[e]
                );
                assert!(
                    (y_gpu[e] - y_cpu[e]).abs() <= 1e-2 * scale,
                    "{name} n={n} y[{i},{j}]: wgpu {} vs cpu {}",
                    y_gpu[e],
                    y_cpu[e]
                );
            }
        }
        let ids = [3i64, 0, (m - 1) as i64];
        let rows = |device: &Device| {
            let layer = PackedLinear::new(&w, None::<Param<Tensor<1>>>, device);
            values(layer.rows(Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, 3]), device)))
        };
        let expected: Vec<f32> = ids.iter().flat_map(|&r| dense[r as usize * k..][..k].to_vec()).collect();
        assert_eq!(rows(&gpu), expected, "{name}: rows on wgpu");
        assert_eq!(rows(&cpu), expected, "{name}: rows on the CPU");
        // On wgpu the blocks are u32 words, and they read back as the matrix's own bytes.
        let on_gpu = PackedLinear::new(&w, None::<Param<Tensor<1>>>, &gpu);
        assert_eq!(on_gpu.blocks.val().dtype(), DType::U32);
        assert_eq!(on_gpu.weight(), w, "{name}");
    }
}
