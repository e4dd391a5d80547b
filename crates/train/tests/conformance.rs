//! Conformance with PyTorch (fixture from scripts/fixtures/gpt_forward.py): the GPT's logits, the causal-LM loss,
//! the global gradient norm, and the loss after one clipped AdamW step. Tolerance: 1e-4 absolute (f32).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::{Build, CausalLm, ModelConfig, bundle, params};
use ember_train::loss::lm_loss;
use ember_train::optim::{AdamW, AdamWConfig, clip_scale, global_grad_norm};

const TOL: f32 = 1e-4;

fn fixture() -> HashMap<String, TensorData> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core-model/tests/fixtures/gpt_tiny.safetensors");
    bundle::load_tensors(&path).unwrap().0
}

fn scalar(t: &HashMap<String, TensorData>, name: &str) -> f32 {
    t[name].try_to_vec::<f32>().unwrap()[0]
}

fn ids(t: &HashMap<String, TensorData>, name: &str, device: &Device) -> Tensor<2, Int> {
    let values: Vec<i64> = t[name].try_to_vec::<f32>().unwrap().iter().map(|&v| v as i64).collect();
    Tensor::from_data(TensorData::new(values, t[name].shape().to_vec()), device)
}

#[test]
fn gpt_logits_loss_gradient_norm_and_one_adamw_step_match_pytorch() {
    let t = fixture();
    let device = Device::flex().autodiff();
    let config = ModelConfig::gpt(11, 2, 2, 16, 8);
    // The fixture file holds the weights beside the reference values ("fixture.*").
    let weights: HashMap<String, TensorData> =
        t.iter().filter(|(k, _)| !k.starts_with("fixture.")).map(|(k, v)| (k.clone(), v.clone())).collect();
    let model = CausalLm::load(&config, &weights, &device).unwrap();
    let (x, y) = (ids(&t, "fixture.x", &device), ids(&t, "fixture.y", &device));

    let logits = model.forward(x.clone());
    let ours = logits.clone().into_data().try_to_vec::<f32>().unwrap();
    let theirs = t["fixture.logits"].try_to_vec::<f32>().unwrap();
    let diff = ember_test_support::max_abs_diff(&ours, &theirs);
    assert!(diff <= TOL, "logits differ by {diff}");

    let loss = lm_loss(logits, y.clone(), None);
    assert!((loss.clone().into_scalar::<f32>() - scalar(&t, "fixture.loss")).abs() <= TOL);

    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let norm = global_grad_norm(&model, &grads);
    assert!((norm as f32 - scalar(&t, "fixture.grad_norm")).abs() <= TOL, "grad norm {norm}");

    let decay: HashSet<_> =
        params::param_infos(&model).into_iter().filter(|p| p.shape.len() == 2).map(|p| p.id).collect();
    let mut adamw = AdamW::new(AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 }, decay);
    let model: CausalLm = adamw.step(model, &grads, 1e-2, clip_scale(norm, 0.5));
    let after = lm_loss(
        model.valid().forward(ids(&t, "fixture.x", &device.clone().inner())),
        ids(&t, "fixture.y", &device.inner()),
        None,
    );
    let after = after.into_scalar::<f32>();
    assert!((after - scalar(&t, "fixture.loss_after_step")).abs() <= TOL, "loss after one step {after}");
}
