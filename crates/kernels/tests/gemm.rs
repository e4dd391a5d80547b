//! The cooperative-matrix GEMM (`ember_kernels::gemm`, f16 operands, f32 accumulators) against Burn's f32 product of
//! the same f16-rounded operands on the CPU: every product of two f16 values is exact in f32, so only the order of
//! the sums differs, and the error is held to 1e-5 of Σ_k |a_ik b_kj| (at least 1). Ragged shapes: one row, K = 1,
//! sizes that are not multiples of the tiles, with f32 and f16 inputs, for every side the adapter offers. An adapter
//! without the matrices (Mesa 22's lavapipe) checks nothing and says so, unless EMBER_REQUIRE_COOPERATIVE is set:
//! scripts/test.sh sets it when it runs this test under Mesa 26's lavapipe (scripts/lavapipe-26.sh), which offers
//! 8×8 ones.

use burn::tensor::{Device, Distribution, FloatDType, Tensor};
use ember_kernels::gemm::cooperative_matmul;
use ember_test_support::{values, wgpu_test_device};

#[test]
fn cooperative_gemm_equals_the_f32_product_of_its_f16_operands() {
    let Some(gpu) = wgpu_test_device() else { return };
    let adapters = ember_kernels::wgpu_adapters();
    let adapter = adapters.iter().find(|a| a.is_real_gpu()).or(adapters.first()).expect("an adapter");
    let sides = adapter.cooperative_sides();
    if sides.is_empty() {
        let why = format!("{} offers no 16×16×16 or 8×8×8 f16 → f32 cooperative matrices", adapter.name);
        assert!(std::env::var_os("EMBER_REQUIRE_COOPERATIVE").is_none(), "EMBER_REQUIRE_COOPERATIVE: {why}");
        eprintln!("cooperative GEMM NOT CHECKED: {why}");
        return;
    }
    let cpu = Device::flex();
    let shapes =
        [(1, 1, 1), (1, 64, 1), (7, 1, 9), (33, 17, 65), (64, 64, 64), (100, 37, 3), (16, 300, 48), (129, 80, 70)];
    for side in sides {
        for (m, k, n) in shapes {
            for dtype in [FloatDType::F32, FloatDType::F16] {
                let round = |t: Tensor<2>| t.cast(FloatDType::F16).cast(FloatDType::F32);
                let a = round(Tensor::<2>::random([m, k], Distribution::Normal(0.0, 1.0), &cpu));
                let b = round(Tensor::<2>::random([k, n], Distribution::Normal(0.0, 1.0), &cpu));
                let reference = values(a.clone().matmul(b.clone()));
                let magnitude = values(a.clone().abs().matmul(b.clone().abs()));
                let on_gpu = |t: &Tensor<2>| Tensor::<2>::from_data(t.to_data(), &gpu).cast(dtype);
                let got = values(cooperative_matmul(on_gpu(&a), on_gpu(&b), side).to_device(&cpu));
                assert_eq!(got.len(), m * n);
                for (i, ((g, r), s)) in got.iter().zip(&reference).zip(&magnitude).enumerate() {
                    let bound = 1e-5 * s.max(1.0);
                    assert!(
                        (g - r).abs() <= bound,
                        "side {side}, {dtype:?}, {m}×{k}×{n}: C[{}, {}] = {g}, the f32 product {r} (bound {bound:e})",
                        i / n,
                        i % n
                    );
                }
            }
        }
        eprintln!("cooperative GEMM {side}×{side} on {}: {} shapes, f32 and f16 inputs", adapter.name, shapes.len());
    }
}
