//! The causal language-modelling loss.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};

/// L = −(1/|M|) Σ_{(b,t) ∈ M} log softmax(z_{b,t})[y_{b,t}], for logits z [B, T, V] and targets y [B, T]
/// (the inputs shifted by one); M is every position, or those where `mask` is 1 (e.g. to exclude a prompt).
pub fn lm_loss(logits: Tensor<3>, targets: Tensor<2, Int>, mask: Option<Tensor<2>>) -> Tensor<1> {
    let [b, t, _] = logits.dims();
    let log_p = log_softmax(logits, 2).gather(2, targets.unsqueeze_dim::<3>(2)).reshape([b, t]);
    match mask {
        None => -log_p.mean(),
        Some(mask) => -(log_p * mask.clone()).sum() / mask.sum(),
    }
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
}
