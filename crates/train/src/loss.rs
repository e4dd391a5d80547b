//! The causal language-modelling loss, and label-smoothed cross-entropy for translation.

use burn::tensor::activation::log_softmax;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use ember_core_model::CausalLm;
use ember_kernels::cross_entropy;

/// Mean cross-entropy (nats/token) of `model` on `ids`, in windows of its context, each predicting its own tokens
/// (perplexity is its exponential).
pub fn text_loss(model: &CausalLm, ids: &[u32]) -> f64 {
    let device = model.wte.device();
    let (mut nll, mut count) = (0.0f64, 0usize);
    for window in ids.chunks(model.block_size() + 1).filter(|w| w.len() >= 2) {
        let t = window.len() - 1;
        let input: Vec<i64> = window[..t].iter().map(|&i| i as i64).collect();
        let x = Tensor::<2, Int>::from_data(TensorData::new(input, [1, t]), &device);
        let logp = log_softmax(model.forward(x), 2).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32");
        let v = logp.len() / t;
        for (i, &target) in window[1..].iter().enumerate() {
            nll -= logp[i * v + target as usize] as f64;
            count += 1;
        }
    }
    nll / count as f64
}

/// L = −(1/|M|) Σ_{(b,t) ∈ M} log softmax(z_{b,t})[y_{b,t}], for logits z [B, T, V] and targets y [B, T]
/// (the inputs shifted by one); M is every position, or those where `mask` is 1 (e.g. to exclude a prompt).
pub fn lm_loss(logits: Tensor<3>, targets: Tensor<2, Int>, mask: Option<Tensor<2>>) -> Tensor<1> {
    let per_token = token_losses(logits, targets, 0.0);
    match mask {
        None => per_token.mean(),
        Some(mask) => (per_token * mask.clone()).sum() / mask.sum(),
    }
}

/// Label-smoothed cross-entropy over the positions where `mask` is 1: with q = (1 − ε)·one_hot(y) + ε/V,
/// L = −(1/|M|) Σ_{(b,t) ∈ M} Σ_v q_v log p_v = (1 − ε)·NLL + ε·mean_v(−log p_v) (Szegedy et al. 2016; the 2017
/// Transformer uses ε = 0.1). Padding positions (mask 0) contribute nothing.
pub fn smoothed_loss(logits: Tensor<3>, targets: Tensor<2, Int>, mask: Tensor<2>, epsilon: f64) -> Tensor<1> {
    let per_token = token_losses(logits, targets, epsilon);
    (per_token * mask.clone()).sum() / mask.sum()
}

/// −Σ_v q_v log p_v at every position [B, T], by the kernels' fused cross-entropy, in f32 whatever the logits' type
/// (f16 keeps three significant digits of log p).
fn token_losses(logits: Tensor<3>, targets: Tensor<2, Int>, epsilon: f64) -> Tensor<2> {
    let logits = logits.cast(FloatDType::F32);
    let [b, t, v] = logits.dims();
    cross_entropy(logits.reshape([b * t, v]), targets.reshape([b * t]), epsilon).reshape([b, t])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    #[test]
    fn uniform_logits_give_log_vocab_and_mask_selects_positions() {
        let dev = Device::flex();
        let logits = Tensor::<3>::zeros([2, 3, 5], &dev);
        let y = Tensor::<2, Int>::from_data(TensorData::new(vec![0i64, 1, 2, 3, 4, 0], [2, 3]), &dev);
        let loss = lm_loss(logits, y.clone(), None).into_scalar::<f32>();
        assert!((loss - 5f32.ln()).abs() < 1e-6);

        // Position (0, 0) is certain of its target; masking everything else leaves a loss of ~0.
        let mut z = vec![0f32; 30];
        z[0] = 50.0;
        let logits = Tensor::<3>::from_data(TensorData::new(z, [2, 3, 5]), &dev);
        let mask = Tensor::<2>::from_data(TensorData::new(vec![1f32, 0., 0., 0., 0., 0.], [2, 3]), &dev);
        let masked = lm_loss(logits.clone(), y.clone(), Some(mask)).into_scalar::<f32>();
        assert!(masked < 1e-6, "{masked}");
        let full = lm_loss(logits, y, None).into_scalar::<f32>();
        assert!((full - 5.0 * 5f32.ln() / 6.0).abs() < 1e-5, "{full}");
    }

    #[test]
    fn smoothing_mixes_nll_with_the_mean_over_the_vocabulary_and_ignores_padding() {
        let dev = Device::flex();
        // One position: log p = log softmax([2, 0, 0]); target 0; the second position is padding.
        let logits = Tensor::<3>::from_data(TensorData::new(vec![2f32, 0., 0., 9., 9., 9.], [1, 2, 3]), &dev);
        let y = Tensor::<2, Int>::from_data(TensorData::new(vec![0i64, 2], [1, 2]), &dev);
        let mask = Tensor::<2>::from_data(TensorData::new(vec![1f32, 0.], [1, 2]), &dev);
        let z = (2f64.exp() + 2.0).ln();
        let log_p = [2.0 - z, -z, -z];
        let expected = 0.9 * -log_p[0] + 0.1 * -(log_p.iter().sum::<f64>() / 3.0);
        let loss = smoothed_loss(logits, y, mask, 0.1).into_scalar::<f32>() as f64;
        assert!((loss - expected).abs() < 1e-6, "{loss} vs {expected}");
    }
}
