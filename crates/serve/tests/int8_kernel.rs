//! The int8 decoding kernel (Rust on the CPU, WGSL on wgpu) reads the quantized store's codes and scales as they are laid out and equals the
//! reference path over the same dequantized keys and values within 1e-4 (f32). Under CI a missing adapter fails.

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::Rng;
use ember_kernels::{AttentionAlgorithm, AttentionSpec, Int8Kv, attention, int8_attention};
use ember_serve::kv::{Bits, dequantize, quantize};
use ember_test_support::{max_abs_diff, wgpu_test_device};

#[test]
fn int8_decoding_equals_the_reference_on_dequantized_keys() {
    let cpu = Device::flex();
    // Rust on the CPU, WGSL on wgpu where an adapter is present.
    for device in std::iter::once(Device::flex()).chain(wgpu_test_device()) {
        let mut rng = Rng::new(21);
        for (hq, hkv, d, t, group, tq) in [(4, 2, 64, 300, 32, 1), (2, 2, 32, 17, 8, 3), (8, 1, 128, 600, 64, 1)] {
            let normal = |rng: &mut Rng, n: usize| (0..n).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
            let q = normal(&mut rng, hq * tq * d);
            // Token-major [t, Hkv·D] rows, as the store keeps them.
            let (k, v) = (normal(&mut rng, t * hkv * d), normal(&mut rng, t * hkv * d));
            let (kq, ks) = quantize(&k, group, Bits::Int8);
            let (vq, vs) = quantize(&v, group, Bits::Int8);
            let words = |codes: &[i8]| -> Vec<i32> {
                codes.chunks(4).map(|c| i32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8])).collect()
            };
            let codes = |c: &[i8]| Tensor::<3, Int>::from_data(TensorData::new(words(c), [1, t, hkv * d / 4]), &device);
            let scales =
                |s: &[f32]| Tensor::<3>::from_data(TensorData::new(s.to_vec(), [1, t, hkv * d / group]), &device);
            let kv = Int8Kv {
                k_codes: codes(&kq),
                k_scales: scales(&ks),
                v_codes: codes(&vq),
                v_scales: scales(&vs),
                group,
            };
            let spec = AttentionSpec { query_offset: t - tq, ..AttentionSpec::causal(d).with_window(Some(t / 2)) };
            let query = |device: &Device| Tensor::<4>::from_data(TensorData::new(q.clone(), [1, hq, tq, d]), device);
            let kernel = int8_attention(query(&device), kv, &spec);
            // The reference: dequantized [t, Hkv, D] → [1, Hkv, t, D].
            let heads =
                |x: Vec<f32>| Tensor::<3>::from_data(TensorData::new(x, [t, hkv, d]), &cpu).swap_dims(0, 1).unsqueeze();
            let (k, v) = (heads(dequantize(&kq, &ks, group)), heads(dequantize(&vq, &vs, group)));
            let reference = attention(query(&cpu), k, v, &spec.clone().with_algorithm(AttentionAlgorithm::Naive));
            let (a, b) =
                (kernel.into_data().try_to_vec::<f32>().unwrap(), reference.into_data().try_to_vec::<f32>().unwrap());
            let diff = max_abs_diff(&a, &b);
            assert!(diff <= 1e-4, "hq {hq}, hkv {hkv}, d {d}, t {t}, group {group}, tq {tq}: max abs error {diff}");
        }
    }
}
