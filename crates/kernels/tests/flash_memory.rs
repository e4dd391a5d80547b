//! Attention at T = 16384 (one head, d = 64, causal) on wgpu without a T×T buffer: the naive path would need
//! T² · 4 B = 1 GiB for the scores; the kernels' largest allocation stays O(T·d) (12 MiB here: the partial outputs
//! of three key splits). Its own test binary, so the device's allocation high-water mark is this test's alone.

use burn::tensor::{Distribution, Tensor};
use ember_kernels::{AttentionSpec, attention, device_memory};
use ember_test_support::wgpu_test_device;

#[test]
#[ignore = "needs a wgpu adapter: a GPU driver or lavapipe (scripts/test.sh installs mesa-vulkan-drivers)"]
fn attention_at_16k_tokens_allocates_o_of_t_d() {
    let Some(gpu) = wgpu_test_device() else { return };
    let (t, d) = (16384, 64);
    let x = || Tensor::<4>::random([1, 1, t, d], Distribution::Normal(0.0, 1.0), &gpu);
    let (q, k, v) = (x(), x(), x());
    let o = attention(q, k, v.clone(), &AttentionSpec::causal(d));
    // Row 0 sees key 0 only.
    let first = (o.clone().narrow(2, 0, 1) - v.narrow(2, 0, 1)).abs().max().into_scalar::<f32>();
    assert!(first < 1e-5, "row 0 should equal v_0, differs by {first}");
    assert!(o.abs().max().into_scalar::<f32>().is_finite());
    let memory = device_memory(&gpu).expect("a wgpu device reports its memory");
    let (row_bytes, scores_bytes) = ((t * d * 4) as u64, (t * t * 4) as u64);
    eprintln!(
        "T = {t}, d = {d}: largest allocation {:.1} MiB (q, k, v, o are {:.1} MiB each; a score matrix would be {} MiB), \
         reserved {:.1} MiB",
        memory.largest_allocation as f64 / 1048576.0,
        row_bytes as f64 / 1048576.0,
        scores_bytes / 1048576,
        memory.reserved as f64 / 1048576.0
    );
    // Seen: 12.0 MiB, the partial outputs of the forward's three key splits (one head fills few workgroups); q, k, v
    // and o are 4.0 MiB each. The bound leaves room for the runtime's own buffers, not for a T×T one.
    assert!(memory.largest_allocation < scores_bytes / 4, "{memory:?}: a T×T-sized buffer was allocated");
}
