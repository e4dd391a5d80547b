//! Linear attention's O(T) chunked form (the exclusive scan of chunk states: WGSL on wgpu, lavapipe without a GPU;
//! burn-flex on the CPU) against its O(T²) masked form, outputs and the gradients of q, k and v within 1e-5 of the
//! largest value, for elu + 1, relu and FAVOR+ with GQA over three chunks; wgpu's outputs within 1e-4 of the CPU's;
//! and the scan itself, forward and reverse, over a grid wider than one dispatch dimension. Under CI a missing
//! adapter fails.

use burn::tensor::{Device, Tensor, TensorData};
use ember_formats::Rng;
use ember_kernels::scan::exclusive_scan;
use ember_kernels::{AttentionSpec, Similarity, similarity_attention};
use ember_test_support::{
    max_abs_diff_tensors as max_diff, max_relative_diff_tensors as relative, values, wgpu_test_device,
};

fn devices() -> Vec<Device> {
    std::iter::once(Device::flex()).chain(wgpu_test_device()).collect()
}

/// N(0, 1) draws from Ember's generator seeded with `seed`, the same on every device.
fn normal(shape: [usize; 4], seed: u64, device: &Device) -> Tensor<4> {
    let mut rng = Rng::new(seed);
    let values: Vec<f32> = (0..shape.iter().product()).map(|_| rng.normal() as f32).collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

#[test]
fn the_chunked_form_equals_the_masked_form_with_gradients_on_every_device() {
    let t = 150;
    let kernels = [Similarity::LinearElu, Similarity::LinearRelu, Similarity::Favor { features: 32, seed: 5 }];
    let mut outputs: Vec<Vec<Tensor<4>>> = Vec::new();
    for device in devices() {
        let device = device.autodiff();
        let mut on_device = Vec::new();
        for kernel in kernels {
            let causal = AttentionSpec { similarity: kernel, ..AttentionSpec::causal(16) };
            // Every key valid, but named: the masked O(T²) form.
            let masked = AttentionSpec { key_lengths: Some(vec![t]), ..causal.clone() };
            let w = normal([1, 4, t, 16], 9, &device);
            let run = |spec: &AttentionSpec| {
                let [q, k, v] = [([1, 4, t, 16], 1), ([1, 2, t, 16], 2), ([1, 2, t, 16], 3)]
                    .map(|(s, seed)| normal(s, seed, &device).require_grad());
                let o = similarity_attention(q.clone(), k.clone(), v.clone(), spec);
                let grads = (o.clone() * w.clone()).sum().backward();
                let grad = |x: &Tensor<4>| x.grad(&grads).expect("a gradient");
                [o.inner(), grad(&q), grad(&k), grad(&v)]
            };
            let (chunked, full) = (run(&causal), run(&masked));
            for (name, (a, b)) in ["o", "dq", "dk", "dv"].iter().zip(chunked.iter().zip(&full)) {
                let d = relative(a.clone(), b.clone());
                assert!(d <= 1e-5, "{kernel:?} on {device:?}, {name}: relative error {d}");
            }
            on_device.push(chunked[0].clone());
        }
        outputs.push(on_device);
    }
    if let [cpu, gpu] = &outputs[..] {
        for (kernel, (a, b)) in kernels.iter().zip(cpu.iter().zip(gpu)) {
            let d = max_diff(a.clone(), b.clone());
            assert!(d <= 1e-4, "{kernel:?}: max |cpu − wgpu| = {d}");
        }
    }
}

/// The scan on each device against cumsum on the CPU, forward and through its gradient (the reverse scan), over
/// 64·65,535 + 4 elements per chunk: more workgroups than one dispatch dimension holds.
#[test]
fn the_scan_sums_the_chunks_before_each_and_its_gradient_those_after() {
    let cpu = Device::flex();
    let shape = [1, 3, 64 * 65_535 + 4, 1];
    let x = normal(shape, 4, &cpu);
    let expected = x.clone().cumsum(1) - x.clone();
    // d/dx_c Σ_c' w_c' y_c' = Σ_{c' > c} w_c'.
    let w = normal(shape, 5, &cpu);
    let expected_grad = w.clone().sum_dim(1) - w.clone().cumsum(1);
    for device in devices() {
        let xd = Tensor::<4>::from_data(x.clone().into_data(), &device.clone().autodiff()).require_grad();
        let y = exclusive_scan(xd.clone());
        let grads = (y.clone() * Tensor::from_data(w.clone().into_data(), &device.clone().autodiff())).sum().backward();
        let (y, grad) = (values(y.inner()), values(xd.grad(&grads).unwrap()));
        let d = ember_test_support::max_abs_diff(&y, &values(expected.clone()));
        let dg = ember_test_support::max_abs_diff(&grad, &values(expected_grad.clone()));
        assert!(d <= 1e-5 && dg <= 1e-5, "{device:?}: forward {d}, gradient {dg}");
    }
}
