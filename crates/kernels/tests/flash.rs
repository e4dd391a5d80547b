//! Ember's attention kernels — Rust on the CPU, WGSL on wgpu (lavapipe without a GPU) — against the reference path
//! on the CPU, f32, max abs error ≤ 1e-4 for outputs and for the gradients of q, k and v, over a randomized sweep of
//! lengths, head dimensions, GQA groups, masks, padding, query offsets, decoding and pages; on wgpu each WGSL tier
//! forced in turn (the backward's dq folded into the dk/dv pass where the adapter has f32 atomics, as lavapipe does),
//! and each tier with dq in a pass of its own. Under CI a missing adapter fails.
//! The f16 paths on wgpu (f16 tiles over f32 inputs; f16 inputs, against the reference on the same rounded values) are
//! held to FlashAttention's own test bound: max abs error at most twice that of naive attention computed in f16 on
//! the same device, plus 1e-4 of the largest |reference| (at least 1). A relative bound alone cannot hold them: where
//! ds = p (dO · v − D) cancels (one key: D = dO · v), dk is near 0 in f32 while every f16 rounding of dO or o moves it.

use burn::tensor::{Device, FloatDType, Tensor, TensorData, f16};
use ember_kernels::{
    AttentionAlgorithm, AttentionSpec, GpuTuning, PackedHeads, attention, merge_heads, named_attention,
    packed_attention, paged_attention, split_heads,
};
use ember_test_support::{max_abs_diff_tensors, values, wgpu_test_device};

const TOLERANCE: f32 = 1e-4;
const HALF_SLACK: f32 = 1e-4;

/// An attention algorithm and its GPU tuning.
type Imp = (AttentionAlgorithm, GpuTuning);

/// The implementation `name` of [`ember_kernels::NAMED_ATTENTION`].
fn imp(name: &str) -> Imp {
    named_attention(name).expect("a named attention")
}

/// Ember's kernels: Rust on the CPU, and where a wgpu adapter is present, each WGSL tier forced (dq folded where the
/// adapter allows it), then each tier's two-pass backward.
fn kernel_devices() -> Vec<(Device, Imp)> {
    let imps = ["portable", "subgroup", "subgroup-2pass", "portable-2pass"].map(imp);
    let wgpu = wgpu_test_device().into_iter().flat_map(|gpu| imps.map(|tuned| (gpu.clone(), tuned)));
    std::iter::once((Device::flex(), imp("ember"))).chain(wgpu).collect()
}

/// xorshift64* draws mapped to N(0, 1) by Box–Muller: the same data on both devices, run after run.
struct Draws(u64);

impl Draws {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| ((-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()) as f32)
            .collect()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.uniform() * n as f64) as usize % n.max(1)
    }
}

#[derive(Clone, Debug)]
struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    spec: AttentionSpec,
}

struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Weights of the scalar loss Σ w ⊙ o whose gradients are compared.
    w: Vec<f32>,
}

impl Case {
    fn inputs(&self, draws: &mut Draws) -> Inputs {
        let (qn, kn) = (self.b * self.hq * self.tq * self.d, self.b * self.hkv * self.tk * self.d);
        Inputs { q: draws.normal(qn), k: draws.normal(kn), v: draws.normal(kn), w: draws.normal(qn) }
    }
    /// The inputs as `dtype` holds them: rounded to f16, or as drawn.
    fn inputs_as(&self, draws: &mut Draws, dtype: FloatDType) -> Inputs {
        let x = self.inputs(draws);
        if dtype != FloatDType::F16 {
            return x;
        }
        let round = |v: Vec<f32>| v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect();
        Inputs { q: round(x.q), k: round(x.k), v: round(x.v), w: round(x.w) }
    }
    fn tensors(&self, x: &Inputs, device: &Device) -> [Tensor<4>; 4] {
        let (qs, ks) = ([self.b, self.hq, self.tq, self.d], [self.b, self.hkv, self.tk, self.d]);
        [(&x.q, qs), (&x.k, ks), (&x.v, ks), (&x.w, qs)]
            .map(|(data, shape)| Tensor::from_data(TensorData::new(data.clone(), shape), device))
    }
}

fn max_diff<const D: usize>(what: &str, case: &impl std::fmt::Debug, a: Tensor<D>, b: Tensor<D>) -> f32 {
    let diff = max_abs_diff_tensors(a, b);
    assert!(diff.is_finite() && diff <= TOLERANCE, "{what}: max abs error {diff:e} > {TOLERANCE:e} in {case:?}");
    diff
}

/// Output, and the gradients of Σ w ⊙ o, by `imp` on `device` with q, k, v and w in `dtype`.
fn run(imp: Imp, case: &Case, x: &Inputs, device: &Device, dtype: FloatDType) -> [Tensor<4>; 4] {
    let device = device.clone().autodiff();
    let [q, k, v, w] = case.tensors(x, &device).map(|t| t.cast(dtype));
    let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
    let o = attention(q.clone(), k.clone(), v.clone(), &case.spec.clone().computed_by(imp.0, imp.1));
    let grads = (o.clone() * w).sum().backward();
    let grad = |t: &Tensor<4>| t.grad(&grads).expect("a gradient");
    [o.inner(), grad(&q), grad(&k), grad(&v)]
}

/// The kernels' o, dq, dk and dv against the reference's (f32 on the CPU, on the same values of the inputs), with the
/// inputs in f32; the worst error over its bound.
fn check(case: &Case, draws: &mut Draws, kernels: &(Device, Imp)) -> f32 {
    check_as(case, draws, kernels, FloatDType::F32)
}

/// [`check`] with the kernels' inputs in `dtype`. Where anything is f16 (the inputs, or the tiles of
/// the `half` tuning), the bound is twice the error of naive attention in f16 on the same device, plus
/// [`HALF_SLACK`] of the largest |reference| (at least 1).
fn check_as(case: &Case, draws: &mut Draws, (device, tuned): &(Device, Imp), dtype: FloatDType) -> f32 {
    let x = case.inputs_as(draws, dtype);
    let reference = run(imp("naive"), case, &x, &Device::flex(), FloatDType::F32);
    let flash = run(*tuned, case, &x, device, dtype);
    let half = dtype == FloatDType::F16 || tuned.1.half_tiles(false);
    let naive = half.then(|| run(imp("naive"), case, &x, device, FloatDType::F16));
    let mut worst = 0.0f32;
    for (i, name) in ["o", "dq", "dk", "dv"].into_iter().enumerate() {
        let error = max_abs_diff_tensors(flash[i].clone(), reference[i].clone());
        let bound = match &naive {
            None => TOLERANCE,
            Some(naive) => half_bound(naive[i].clone(), reference[i].clone()),
        };
        let at = (case, tuned, device, dtype);
        assert!(error.is_finite() && error <= bound, "{name}: max abs error {error:e} > {bound:e} in {at:?}");
        worst = worst.max(error / bound);
    }
    worst
}

/// The f16 bound: twice the error of `naive` (naive attention in f16 on the kernels' device) against `reference`,
/// plus [`HALF_SLACK`] of the largest |reference| (at least 1).
fn half_bound(naive: Tensor<4>, reference: Tensor<4>) -> f32 {
    let scale = values(reference.clone()).iter().fold(1.0f32, |m, x| m.max(x.abs()));
    2.0 * max_abs_diff_tensors(naive, reference) + HALF_SLACK * scale
}

/// The forward alone: the kernels' o against the reference's (f32 on the CPU, on the same values of the inputs) with
/// the inputs in `dtype`, held to the f16 bound (twice the error of naive attention in f16 on the same device, plus
/// [`HALF_SLACK`] of the largest |reference|); the worst error over its bound.
fn check_forward(case: &Case, draws: &mut Draws, (device, tuned): &(Device, Imp), dtype: FloatDType) -> f32 {
    let x = case.inputs_as(draws, dtype);
    let output = |(algorithm, tuning): Imp, device: &Device, dtype: FloatDType| {
        let [q, k, v, _] = case.tensors(&x, device).map(|t| t.cast(dtype));
        attention(q, k, v, &case.spec.clone().computed_by(algorithm, tuning))
    };
    let reference = output(imp("naive"), &Device::flex(), FloatDType::F32);
    let error = max_abs_diff_tensors(output(*tuned, device, dtype), reference.clone());
    let bound = half_bound(output(imp("naive"), device, FloatDType::F16), reference);
    let at = (case, tuned, device, dtype);
    assert!(error.is_finite() && error <= bound, "o: max abs error {error:e} > {bound:e} in {at:?}");
    error / bound
}

/// A case of the sweep: ragged lengths up to 300, head dims 32/64/128, GQA groups 1/2/4, causal or not, windows,
/// padding and query offsets drawn from `draws`.
fn random_case(draws: &mut Draws, d: usize, group: usize) -> Case {
    let lengths = [1, 2, 5, 17, 63, 64, 65, 100, 129, 200, 300];
    let tk = lengths[draws.below(lengths.len())];
    let causal = draws.below(2) == 0;
    // Chunked prefill: the queries are the last tq of tk positions.
    let tq = if causal { 1 + draws.below(tk) } else { lengths[draws.below(lengths.len())] };
    let b = 1 + draws.below(2);
    let hkv = 1 + draws.below(2);
    let window = (causal && draws.below(3) == 0).then(|| 1 + draws.below(tk + 4));
    let key_lengths = (draws.below(3) == 0).then(|| (0..b).map(|_| draws.below(tk + 1)).collect());
    let spec = AttentionSpec {
        causal,
        query_offset: if causal { tk - tq } else { 0 },
        window,
        key_lengths,
        ..AttentionSpec::causal(d)
    };
    Case { b, hq: hkv * group, hkv, tq, tk, d, spec }
}

/// The sweep's cases for `kernels` with inputs in `dtype`: head dims 32/64/128 × GQA groups 1/2/4 × `draws_each`
/// draws; the worst error over its bound.
fn sweep(kernels: &(Device, Imp), dtype: FloatDType, draws_each: usize) -> f32 {
    let mut draws = Draws(0x5eed_f1a5);
    let mut worst = 0.0f32;
    for d in [32, 64, 128] {
        for group in [1, 2, 4] {
            for _ in 0..draws_each {
                let case = random_case(&mut draws, d, group);
                worst = worst.max(check_as(&case, &mut draws, kernels, dtype));
            }
        }
    }
    eprintln!("{kernels:?} {dtype:?}: worst error over the sweep: {worst:.3} of its bound");
    worst
}

#[test]
fn flash_forward_and_backward_equal_the_reference_over_a_randomized_sweep() {
    for kernels in kernel_devices() {
        sweep(&kernels, FloatDType::F32, 4);
    }
}

/// The f16 paths over half the sweep (and the edge cases where marked): f16 tiles over f32 inputs (portable tier, dq
/// folded where the adapter allows it: K and V, Q in the dk/dv pass, in f16 in workgroup memory); f16 inputs, whose
/// tiles are f16 too, in the subgroup tier (folded) and in the portable tier with dq in a pass of its own. The
/// code the tiers share (loads, dot products, accumulation, decoding and the merge) is the same in both.
#[test]
fn half_precision_attention_equals_the_reference_over_the_sweep_and_edge_cases() {
    let Some(gpu) = wgpu_test_device() else { return };
    let runs = [
        (imp("portable-f16"), FloatDType::F32, true),
        (imp("subgroup"), FloatDType::F16, true),
        (imp("portable-2pass"), FloatDType::F16, false),
    ];
    for (tuned, dtype, edges) in runs {
        let kernels = (gpu.clone(), tuned);
        sweep(&kernels, dtype, 2);
        if edges {
            let mut draws = Draws(7);
            let errors =
                edge_cases().iter().map(|case| check_as(case, &mut draws, &kernels, dtype)).collect::<Vec<_>>();
            let worst = errors.into_iter().fold(0.0, f32::max);
            eprintln!("{kernels:?} {dtype:?}: worst error over the edge cases: {worst:.3} of its bound");
        }
    }
}

/// The cooperative-matrix forward (N×N f16 tiles, f32 accumulators, N the largest side the adapter offers: 16 on
/// NVIDIA, AMD and Intel GPUs under Vulkan, 8 on Mesa 26's lavapipe), its output over f32 and f16 inputs, half the
/// sweep each and the edge cases, held to the f16 bound. (Its backward is the tier's with f16 tiles, which
/// `half_precision_attention_...` checks.) An adapter without wgpu's
/// EXPERIMENTAL_COOPERATIVE_MATRIX and such products (Mesa 22's lavapipe) checks nothing and says so, unless
/// EMBER_REQUIRE_COOPERATIVE is set: scripts/test.sh sets it when it runs this test under Mesa 26's lavapipe
/// (scripts/lavapipe-26.sh), so CI executes the kernel. The shader's validity and its SPIR-V are checked on every
/// machine by the kernels' unit test `cooperative_forward_is_valid_and_compiles_to_spir_v`.
#[test]
fn cooperative_matrix_attention_equals_the_reference_where_the_adapter_offers_it() {
    let Some(gpu) = wgpu_test_device() else { return };
    // The adapter wgpu's default device takes: the first real GPU, else the first adapter.
    let adapters = ember_kernels::wgpu_adapters();
    let adapter = adapters.iter().find(|a| a.is_real_gpu()).or(adapters.first()).expect("an adapter");
    let Some(&side) = adapter.cooperative_sides().first() else {
        let why = format!(
            "{} offers no 16×16×16 or 8×8×8 f16 → f32 cooperative matrices (wgpu EXPERIMENTAL_COOPERATIVE_MATRIX {})",
            adapter.name,
            if adapter.features.contains(ember_kernels::adapters::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                "on, without those shapes"
            } else {
                "off"
            }
        );
        assert!(std::env::var_os("EMBER_REQUIRE_COOPERATIVE").is_none(), "EMBER_REQUIRE_COOPERATIVE: {why}");
        eprintln!("cooperative-matrix attention NOT CHECKED: {why}");
        return;
    };
    let name = if side == 16 { "cooperative" } else { "cooperative-8" };
    let kernels = (gpu.clone(), imp(name));
    for dtype in [FloatDType::F32, FloatDType::F16] {
        let mut draws = Draws(0x5eed_f1a5);
        let mut worst = 0.0f32;
        for d in [32, 64, 128] {
            for group in [1, 2, 4] {
                for _ in 0..2 {
                    worst = worst.max(check_forward(&random_case(&mut draws, d, group), &mut draws, &kernels, dtype));
                }
            }
        }
        for case in edge_cases() {
            worst = worst.max(check_forward(&case, &mut draws, &kernels, dtype));
        }
        eprintln!(
            "{name} on {} {dtype:?}: worst error over the sweep and edge cases: {worst:.3} of its bound",
            adapter.name
        );
    }
}

#[test]
fn edge_cases_equal_the_reference() {
    let mut draws = Draws(7);
    for kernels in kernel_devices() {
        for case in &edge_cases() {
            check(case, &mut draws, &kernels);
        }
    }
}

/// Decoding, padding, windows, the widest heads, key splits and wide GQA groups.
fn edge_cases() -> Vec<Case> {
    let base = Case { b: 2, hq: 4, hkv: 2, tq: 9, tk: 9, d: 64, spec: AttentionSpec::causal(64) };
    vec![
        // One query, one key; T = 1 decoding.
        Case { tq: 1, tk: 1, ..base.clone() },
        // Every key of the first row padded away: zeros, and no NaN in any gradient.
        Case {
            spec: AttentionSpec { causal: false, key_lengths: Some(vec![0, 5]), ..base.spec.clone() },
            ..base.clone()
        },
        // A window of 1: each query sees itself only.
        Case { spec: base.spec.clone().with_window(Some(1)), ..base.clone() },
        // The widest heads, MQA, and a non-default scale.
        Case { hkv: 1, d: 256, spec: AttentionSpec { scale: 0.3, ..AttentionSpec::causal(256) }, ..base.clone() },
        // Head dims that are not powers of two.
        Case { d: 80, spec: AttentionSpec::causal(80), ..base.clone() },
        // Decoding (few query rows, split keys) against a long cache with padding and a window.
        Case {
            tq: 3,
            tk: 700,
            spec: AttentionSpec {
                query_offset: 697,
                key_lengths: Some(vec![700, 650]),
                ..AttentionSpec::causal(64).with_window(Some(500))
            },
            ..base.clone()
        },
        // One long sequence, few heads: the forward splits its keys over workgroups and merges the splits.
        Case { b: 1, hq: 2, hkv: 1, tq: 1100, tk: 1100, d: 64, spec: AttentionSpec::causal(64) },
        Case {
            b: 1,
            hq: 1,
            hkv: 1,
            tq: 1030,
            tk: 1030,
            d: 32,
            spec: AttentionSpec { key_lengths: Some(vec![1001]), ..AttentionSpec::causal(32).with_window(Some(700)) },
        },
        // Decoding a wide GQA group at the widest heads: 8 heads × 4 rows in several row blocks per workgroup grid.
        Case {
            hq: 8,
            hkv: 1,
            tq: 4,
            tk: 300,
            d: 256,
            spec: AttentionSpec { query_offset: 296, ..AttentionSpec::causal(256) },
            ..base.clone()
        },
    ]
}

/// The fused-projection entry point (q, k, v heads side by side in qkv [B, T, (hq + 2·hkv)·d], o's heads
/// concatenated) against the reference on split heads: o and d(qkv), MHA, GQA and MQA, with and without a window,
/// lengths below, across and above the 64-row blocks.
#[test]
fn packed_attention_equals_the_reference_on_split_heads() {
    let mut draws = Draws(0x9acc);
    for (b, hq, hkv, t, d, window) in [(2, 4, 4, 70, 32, None), (1, 6, 2, 129, 64, Some(40)), (3, 2, 1, 5, 16, None)] {
        let (heads, width) = (PackedHeads { q: hq, kv: hkv }, (hq + 2 * hkv) * d);
        let spec = AttentionSpec::causal(d).with_window(window);
        let (qkv, w) = (draws.normal(b * t * width), draws.normal(b * t * hq * d));
        let run = |device: &Device, (algorithm, tuning): Imp| {
            let device = device.clone().autodiff();
            let x = Tensor::<3>::from_data(TensorData::new(qkv.clone(), [b, t, width]), &device).require_grad();
            let spec = spec.clone().computed_by(algorithm, tuning);
            let o = if algorithm == AttentionAlgorithm::Naive {
                let (q, k, v) = split_heads(x.clone(), heads);
                merge_heads(attention(q, k, v, &spec))
            } else {
                packed_attention(x.clone(), heads, &spec)
            };
            let grads =
                (o.clone() * Tensor::from_data(TensorData::new(w.clone(), [b, t, hq * d]), &device)).sum().backward();
            [o.inner(), x.grad(&grads).expect("a gradient")]
        };
        let [o_ref, dx_ref] = run(&Device::flex(), imp("naive"));
        for (device, tuned) in kernel_devices() {
            let [o, dx] = run(&device, tuned);
            let case = (b, hq, hkv, t, d, window, &device, tuned);
            max_diff("o", &case, o, o_ref.clone());
            max_diff("d(qkv)", &case, dx, dx_ref.clone());
        }
    }
}

#[test]
fn paged_decoding_reads_keys_through_the_page_table() {
    let mut draws = Draws(11);
    let (hkv, hq, p, d) = (2, 4, 16, 64);
    let lengths = [70usize, 33];
    let mut unused = (0..20).collect::<Vec<usize>>();
    // Scatter each sequence's pages over a shared pool in a shuffled order.
    let mut table = Vec::new();
    for &len in &lengths {
        let pages = (0..len.div_ceil(p)).map(|_| unused.remove(draws.below(unused.len()))).collect::<Vec<_>>();
        table.push(pages);
    }
    let pool = |draws: &mut Draws| draws.normal(20 * hkv * p * d);
    let (k_pool, v_pool) = (pool(&mut draws), pool(&mut draws));
    let q = draws.normal(2 * hq * d);
    // The same keys gathered into a contiguous [B, Hkv, T, D] (zeros past each length).
    let tk = lengths[0];
    let gather = |pool: &[f32]| {
        let mut out = vec![0.0; 2 * hkv * tk * d];
        for (b, pages) in table.iter().enumerate() {
            for j in 0..lengths[b] {
                for g in 0..hkv {
                    let src = ((pages[j / p] * hkv + g) * p + j % p) * d;
                    let dst = ((b * hkv + g) * tk + j) * d;
                    out[dst..dst + d].copy_from_slice(&pool[src..src + d]);
                }
            }
        }
        out
    };
    let spec = AttentionSpec { causal: false, key_lengths: Some(lengths.to_vec()), ..AttentionSpec::causal(d) };
    let tensor = |data: Vec<f32>, shape: [usize; 4], device: &Device| {
        Tensor::<4>::from_data(TensorData::new(data, shape), device)
    };
    let cpu = Device::flex();
    let reference = attention(
        tensor(q.clone(), [2, hq, 1, d], &cpu),
        tensor(gather(&k_pool), [2, hkv, tk, d], &cpu),
        tensor(gather(&v_pool), [2, hkv, tk, d], &cpu),
        &spec.clone().with_algorithm(AttentionAlgorithm::Naive),
    );
    let case = Case { b: 2, hq, hkv, tq: 1, tk, d, spec: spec.clone() };
    for (device, _) in kernel_devices() {
        let paged = paged_attention(
            tensor(q.clone(), [2, hq, 1, d], &device),
            tensor(k_pool.clone(), [20, hkv, p, d], &device),
            tensor(v_pool.clone(), [20, hkv, p, d], &device),
            table.clone(),
            tk,
            &spec,
        );
        max_diff("paged o", &case, paged, reference.clone());
    }
}

/// Keys and values that are views — the first T rows of a longer cache buffer, or a token-major [B, T, H, D] buffer
/// with its axes swapped — are read in place on the CPU and give the reference's output on their contiguous copies.
#[test]
fn strided_keys_and_values_equal_their_contiguous_copies() {
    let mut draws = Draws(0x51de);
    let (b, hq, hkv, tq, tk, cap, d) = (2, 4, 2, 3, 37, 64, 16);
    let spec = AttentionSpec { query_offset: tk - tq, ..AttentionSpec::causal(d) };
    let cpu = Device::flex();
    let q = Tensor::<4>::from_data(TensorData::new(draws.normal(b * hq * tq * d), [b, hq, tq, d]), &cpu);
    let buffer = |draws: &mut Draws, shape: [usize; 4]| {
        Tensor::<4>::from_data(TensorData::new(draws.normal(shape.iter().product()), shape), &cpu)
    };
    let views = [
        [0, 1].map(|_| buffer(&mut draws, [b, hkv, cap, d]).slice([0..b, 0..hkv, 0..tk, 0..d])),
        [0, 1].map(|_| buffer(&mut draws, [b, tk, hkv, d]).swap_dims(1, 2)),
    ];
    for [k, v] in views {
        let copy = |t: &Tensor<4>| Tensor::<4>::from_data(t.to_data(), &cpu);
        let naive = spec.clone().with_algorithm(AttentionAlgorithm::Naive);
        let reference = attention(q.clone(), copy(&k), copy(&v), &naive);
        let flash = attention(q.clone(), k, v, &spec);
        max_diff("o", &(b, hq, hkv, tq, tk, d), flash, reference);
    }
}
