//! What the workspace's tests share, as a dev-dependency only: the wgpu device the GPU tests run on (or skip
//! without), the largest absolute difference between two results, and the losses a run directory logged.

use burn::backend::wgpu::wgpu;
use std::path::Path;

use burn::tensor::{Device, DeviceKind, Tensor};

/// The default wgpu device for tests: None when this machine has no wgpu adapter (the test skips; Mesa's
/// lavapipe, from the `mesa-vulkan-drivers` package, provides one on any machine), except under CI (`CI` set), where a
/// missing adapter fails the test instead.
pub fn wgpu_test_device() -> Option<Device> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    if pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all())).is_empty() {
        assert!(std::env::var_os("CI").is_none(), "CI requires a wgpu adapter (install mesa-vulkan-drivers)");
        eprintln!("no wgpu adapter: skipped outside CI (install mesa-vulkan-drivers for one)");
        return None;
    }
    Some(Device::wgpu(DeviceKind::DefaultDevice))
}

/// max_i |a_i − b_i| for slices of one length (asserted), 0 for empty ones. Equal values (infinities too) differ by
/// 0; a NaN on either side makes the result NaN, so that a check `diff <= tolerance` fails on it.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "the results compared have different lengths");
    let diffs = a.iter().zip(b).map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() });
    diffs.fold(0.0, |m: f32, d| if m.is_nan() || d.is_nan() { f32::NAN } else { m.max(d) })
}

/// A tensor's values as f32 (any float dtype, any device).
pub fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().expect("a float tensor")
}

/// [`max_abs_diff`] of two tensors of one shape (asserted).
pub fn max_abs_diff_tensors<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    assert_eq!(a.dims(), b.dims(), "the tensors compared have different shapes");
    max_abs_diff(&values(a), &values(b))
}

/// A `[model]` table of a tiny model without dropout (n_layers, n_heads, d_model, block_size), for run configs
/// that tests write; more keys of the table may follow it.
pub fn model_table(n_layers: usize, n_heads: usize, d_model: usize, block_size: usize) -> String {
    format!(
        "[model]\nn_layers = {n_layers}\nn_heads = {n_heads}\nd_model = {d_model}\nblock_size = {block_size}\ndropout = 0.0\n"
    )
}

/// A tiny translation run config (Vaswani et al.'s layout: Post-LN, ReLU, sinusoidal positions) of `layers`
/// encoder and decoder layers, 2 heads, d_model = `d`, d_ff = 2d, `block` positions (the longest pair kept) and a
/// joint BPE of `vocab` tokens over `data`'s `train.tsv` and `valid.tsv` (also the test set), writing to `out`;
/// `train` holds the rest of `[train]`.
pub fn translation_toml(
    layers: usize,
    d: usize,
    block: usize,
    vocab: usize,
    data: &Path,
    out: &Path,
    train: &str,
) -> String {
    let (model, data, out) = (model_table(layers, 2, d, block), data.display(), out.display());
    format!(
        "{model}norm_placement = \"post\"\nffn = \"relu\"\nd_ff = {}\npositions = \"sinusoidal\"\n\n\
         [seq2seq]\nencoder_layers = {layers}\ndecoder_layers = {layers}\n\n\
         [data]\ntrain = \"{data}/train.tsv\"\nvalid = \"{data}/valid.tsv\"\ntest = \"{data}/valid.tsv\"\n\
         vocab_size = {vocab}\nmax_len = {block}\n\n[train]\nout_dir = \"{out}\"\n{train}",
        2 * d
    )
}

/// Each output of a fused kernel (named by `names`: "y", "dx", …) within `tolerance` (max abs) of the reference's;
/// `case` names the inputs in the failure message.
pub fn assert_outputs_close(names: &[&str], fused: &[Vec<f32>], reference: &[Vec<f32>], tolerance: f32, case: &str) {
    assert_eq!(fused.len(), reference.len(), "{case}: the fused kernel and the reference give different outputs");
    for (what, (a, b)) in names.iter().zip(fused.iter().zip(reference)) {
        let diff = max_abs_diff(a, b);
        assert!(diff <= tolerance, "{what} of {case}: max abs error {diff} > {tolerance}");
    }
}

/// [`max_abs_diff_tensors`] over the largest |b| (at least 1): a tolerance relative to the values' size, for results
/// (such as gradients through exponentials) that reach tens, where f32's rounding alone is 1e-6.
pub fn max_relative_diff_tensors<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    let scale = b.clone().abs().max().into_scalar::<f32>().max(1.0);
    max_abs_diff_tensors(a, b) / scale
}

/// The per-step training losses (step, loss) in a run directory's `metrics.jsonl`.
pub fn step_losses(run_dir: &Path) -> Vec<(u64, f64)> {
    metric(run_dir, "loss")
}

/// (step, value) of every line of a run's `metrics.jsonl` that has `key` ("loss" for steps, "val_loss" for
/// evaluations).
pub fn metric(run_dir: &Path, key: &str) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Some((v["step"].as_u64()?, v.get(key)?.as_f64()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_difference_with_equal_infinities_as_zero_and_nan_kept() {
        assert_eq!(max_abs_diff(&[], &[]), 0.0);
        assert_eq!(max_abs_diff(&[1.0, -2.0, 3.0], &[1.5, -2.0, 1.0]), 2.0);
        assert_eq!(max_abs_diff(&[f32::INFINITY, 1.0], &[f32::INFINITY, 1.25]), 0.25);
        assert!(max_abs_diff(&[f32::NAN, 1.0], &[0.0, 1.0]).is_nan());
        assert!(max_abs_diff(&[1.0, 0.0], &[1.0, f32::NAN]).is_nan());
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn slices_of_different_lengths_are_an_error() {
        max_abs_diff(&[1.0], &[1.0, 2.0]);
    }
}
