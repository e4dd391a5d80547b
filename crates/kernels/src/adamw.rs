//! One AdamW update of a flattened parameter: g ← c·g; m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
//! θ ← θ·(1 − ηλ) − η·(m/(1−β₁ᵗ)) / (√(v/(1−β₂ᵗ)) + ε). On the CPU one pass that reads θ, g, m, v and writes θ, m, v
//! (chunks in parallel); elsewhere the same equations as tensor operations.

use burn::backend::{Backend, Dispatch, Flex, backend_extension, tensor::FloatTensor};
use burn::tensor::Tensor;
use rayon::prelude::*;

use crate::cpu::{floats, multiversion, on_cpu, operands, tensor};

/// The constants of one update.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// η.
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// 1 − ηλ for decayed parameters, else 1.
    pub decay: f64,
    /// The bias corrections 1 − β₁ᵗ and 1 − β₂ᵗ.
    pub bc1: f64,
    pub bc2: f64,
    /// c, the gradient's scale (clipping).
    pub grad_scale: f64,
}

/// The fused update as a backend operation (CPU only; other devices take [`reference`]).
#[backend_extension(Flex)]
pub trait AdamWOps: Backend {
    /// (θ, m, v) after one update of flat θ with gradient g and moments m, v.
    fn adamw_update(
        theta: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// (θ, m, v) after one update; m and v are zeros before the first.
pub fn adamw(
    theta: Tensor<1>,
    g: Tensor<1>,
    m: Tensor<1>,
    v: Tensor<1>,
    step: AdamWStep,
) -> (Tensor<1>, Tensor<1>, Tensor<1>) {
    if !on_cpu(&theta.device()) || theta.device().is_autodiff() {
        return reference(theta, g, m, v, step);
    }
    let d = |t: Tensor<1>| t.into_dispatch();
    let (theta, m, v) = <Dispatch as AdamWOps>::adamw_update(d(theta), d(g), d(m), d(v), step);
    (Tensor::from_dispatch(theta), Tensor::from_dispatch(m), Tensor::from_dispatch(v))
}

/// The update as tensor operations.
pub fn reference(
    theta: Tensor<1>,
    g: Tensor<1>,
    m: Tensor<1>,
    v: Tensor<1>,
    s: AdamWStep,
) -> (Tensor<1>, Tensor<1>, Tensor<1>) {
    let g = g * s.grad_scale;
    let m = m * s.beta1 + g.clone() * (1.0 - s.beta1);
    let v = v * s.beta2 + g.square() * (1.0 - s.beta2);
    let update = (m.clone() / s.bc1) / ((v.clone() / s.bc2).sqrt() + s.eps);
    (theta * s.decay - update * s.lr, m, v)
}

const CHUNK: usize = 16_384;

multiversion! {
    /// The update of one chunk: (θ, m, v) into the outputs, with the step's constants
    /// [η, β₁, β₂, ε, 1 − ηλ, 1 − β₁ᵗ, 1 − β₂ᵗ, c].
    fn update_chunk(
        t_out: &mut [f32],
        m_out: &mut [f32],
        v_out: &mut [f32],
        t: &[f32],
        g: &[f32],
        m: &[f32],
        v: &[f32],
        constants: [f32; 8],
    ) {
        let [lr, b1, b2, eps, decay, bc1, bc2, c] = constants;
        for i in 0..t.len() {
            let g = c * g[i];
            let m = b1 * m[i] + (1.0 - b1) * g;
            let v = b2 * v[i] + (1.0 - b2) * g * g;
            t_out[i] = t[i] * decay - lr * (m / bc1) / ((v / bc2).sqrt() + eps);
            m_out[i] = m;
            v_out[i] = v;
        }
    }
}

impl AdamWOps for Flex {
    fn adamw_update(
        theta: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        s: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [theta, g, m, v] = operands([theta, g, m, v]);
        let n = floats(&theta).len();
        let (mut theta_out, mut m_out, mut v_out) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
        let constants = [s.lr, s.beta1, s.beta2, s.eps, s.decay, s.bc1, s.bc2, s.grad_scale].map(|x| x as f32);
        let outs = theta_out.par_chunks_mut(CHUNK).zip(m_out.par_chunks_mut(CHUNK)).zip(v_out.par_chunks_mut(CHUNK));
        let ins = floats(&theta).par_chunks(CHUNK).zip(floats(&g).par_chunks(CHUNK));
        let moments = floats(&m).par_chunks(CHUNK).zip(floats(&v).par_chunks(CHUNK));
        outs.zip(ins.zip(moments)).for_each(|(((t_out, m_out), v_out), ((t, g), (m, v)))| {
            update_chunk(t_out, m_out, v_out, t, g, m, v, constants);
        });
        (tensor(theta_out, &[n]), tensor(m_out, &[n]), tensor(v_out, &[n]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution};
    use ember_test_support::max_abs_diff_tensors;

    #[test]
    fn the_fused_update_equals_the_reference_over_several_steps() {
        let device = Device::flex();
        let n = 40_000;
        let random = |scale: f64| Tensor::<1>::random([n], Distribution::Normal(0.0, scale), &device);
        let zeros = Tensor::<1>::zeros([n], &device);
        let mut fused = (random(1.0), zeros.clone(), zeros);
        let mut plain = fused.clone();
        for t in 1..=3 {
            let g = random(0.1);
            let step = AdamWStep {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.99,
                eps: 1e-8,
                decay: 1.0 - 1e-3 * 0.1,
                bc1: 1.0 - 0.9f64.powi(t),
                bc2: 1.0 - 0.99f64.powi(t),
                grad_scale: 0.5,
            };
            plain = reference(plain.0, g.clone(), plain.1, plain.2, step);
            fused = adamw(fused.0, g, fused.1, fused.2, step);
        }
        for (a, b) in [(fused.0, plain.0), (fused.1, plain.1), (fused.2, plain.2)] {
            let diff = max_abs_diff_tensors(a, b);
            assert!(diff <= 1e-6, "max abs error {diff}");
        }
    }
}
