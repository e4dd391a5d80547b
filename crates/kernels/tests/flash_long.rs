//! A wide GQA group on wgpu: T = 2049, 32 query heads on one KV head, causal, so the dk/dv kernel scans
//! 32 · 2049 = 65,568 packed query rows per key head, past the 65,535 loop iterations llvmpipe allows an invocation
//! (the same count as 8 heads at T = 8192, at a quarter of the work). Each WGSL tier, forced (dq folded into the dk/dv pass where the adapter has f32 atomics), against
//! Ember's CPU kernels (themselves checked against the reference in `flash.rs`): o, dq, dk and dv within 1e-4 of the
//! CPU's, relative to the largest value where that exceeds 1.

use burn::tensor::{Device, Distribution, Tensor};
use ember_kernels::{AttentionAlgorithm, AttentionSpec, GpuTuning, KernelTier, attention};
use ember_test_support::{max_abs_diff, values, wgpu_test_device};

/// Output and gradients of Σ w ⊙ o, as host vectors.
fn run(inputs: &[Tensor<4>; 4], device: &Device, spec: &AttentionSpec) -> [Vec<f32>; 4] {
    let device = device.clone().autodiff();
    let [q, k, v, w] = inputs.clone().map(|t| Tensor::from_data(t.to_data(), &device));
    let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
    let o = attention(q.clone(), k.clone(), v.clone(), spec);
    let grads = (o.clone() * w).sum().backward();
    [
        values(o.inner()),
        values(q.grad(&grads).unwrap()),
        values(k.grad(&grads).unwrap()),
        values(v.grad(&grads).unwrap()),
    ]
}

#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn thirty_two_query_heads_on_one_kv_head_pack_more_rows_than_a_loop_may_run() {
    let Some(gpu) = wgpu_test_device() else { return };
    let (t, d, hq) = (2049, 32, 32);
    let cpu = Device::flex();
    let x = |h: usize| Tensor::<4>::random([1, h, t, d], Distribution::Normal(0.0, 1.0), &cpu);
    let inputs = [x(hq), x(1), x(1), x(hq)];
    let spec = AttentionSpec::causal(d);
    let reference = run(&inputs, &cpu, &spec);
    for tier in [KernelTier::Portable, KernelTier::Subgroup] {
        let ours = run(&inputs, &gpu, &spec.clone().computed_by(AttentionAlgorithm::Ember, GpuTuning::tier(tier)));
        for ((name, a), b) in ["o", "dq", "dk", "dv"].iter().zip(&ours).zip(&reference) {
            let largest = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
            let diff = max_abs_diff(a, b);
            eprintln!("{tier:?} {name}: max abs error {diff:e}, largest |value| {largest}");
            assert!(diff <= 1e-4 * largest, "{tier:?} {name}: max abs error {diff:e} > 1e-4 · {largest}");
        }
    }
}
