//! GELU(x) = x Φ(x) = ½ x (1 + erf(x/√2)) (exact, as torch.nn.GELU()). On the CPU one pass forward and one pass
//! backward, ∂GELU/∂x = Φ(x) + x φ(x), chunks in parallel; elsewhere Burn's activation.

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{AutodiffBackend, Backend, Dispatch, Flex, backend_extension, tensor::FloatTensor};
use burn::tensor::Tensor;
use rayon::prelude::*;

use crate::cpu::{contiguous, floats, on_cpu, tensor};
use crate::math;

/// The fused activation as backend operations (CPU only; other devices take Burn's `gelu`).
#[backend_extension(Flex, Autodiff)]
pub trait GeluOps: Backend {
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// dx = dy ⊙ (Φ(x) + x φ(x)).
    fn fused_gelu_backward(x: FloatTensor<Self>, d_y: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// GELU(x) elementwise.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if !on_cpu(&x.device()) {
        return burn::tensor::activation::gelu(x);
    }
    Tensor::from_dispatch(<Dispatch as GeluOps>::fused_gelu(x.into_dispatch()))
}

const CHUNK: usize = 16_384;

/// Φ(x) = ½ (1 + erf(x/√2)).
fn cdf(x: f32) -> f32 {
    0.5 * (1.0 + math::erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

impl GeluOps for Flex {
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let x = contiguous(x);
        let shape = x.layout().shape().to_vec();
        let xs = floats(&x);
        let mut y = vec![0.0f32; xs.len()];
        y.par_chunks_mut(CHUNK).zip(xs.par_chunks(CHUNK)).for_each(|(y, x)| {
            y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * cdf(x));
        });
        tensor(y, &shape)
    }

    fn fused_gelu_backward(x: FloatTensor<Self>, d_y: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, d_y) = (contiguous(x), contiguous(d_y));
        let shape = x.layout().shape().to_vec();
        let (xs, dys) = (floats(&x), floats(&d_y));
        // φ(x) = e^(−x²/2) / √(2π).
        let inv_sqrt_2pi = 0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;
        let mut dx = vec![0.0f32; xs.len()];
        dx.par_chunks_mut(CHUNK).zip(xs.par_chunks(CHUNK).zip(dys.par_chunks(CHUNK))).for_each(|(dx, (x, dy))| {
            for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
                *dx = dy * (cdf(x) + x * inv_sqrt_2pi * math::exp(-0.5 * x * x));
            }
        });
        tensor(dx, &shape)
    }
}

#[derive(Debug)]
struct GeluBackward;

impl<B: GeluOps> Backward<B, 1> for GeluBackward {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let d_y = grads.consume::<B>(&ops.node);
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::fused_gelu_backward(ops.state, d_y));
        }
    }
}

impl<B: GeluOps, C: CheckpointStrategy> GeluOps for Autodiff<B, C> {
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let prepared = GeluBackward.prepare::<C>([x.node()]).compute_bound().stateful();
        let x = x.into_primitive();
        let y = B::fused_gelu(x.clone());
        match prepared {
            OpsKind::Tracked(prep) => prep.finish(x, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn fused_gelu_backward(x: FloatTensor<Self>, d_y: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_inner(B::fused_gelu_backward(x.into_primitive(), d_y.into_primitive()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution, TensorData};

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn fused_gelu_equals_burns_forward_and_backward() {
        let dev = Device::flex();
        let device = dev.clone().autodiff();
        for n in [7, 40_000] {
            let x = values(Tensor::<2>::random([2, n], Distribution::Normal(0.0, 3.0), &dev));
            let w = values(Tensor::<2>::random([2, n], Distribution::Normal(0.0, 1.0), &dev));
            let run = |fused: bool| {
                let x = Tensor::<2>::from_data(TensorData::new(x.clone(), [2, n]), &device).require_grad();
                let w = Tensor::<2>::from_data(TensorData::new(w.clone(), [2, n]), &device);
                let y = if fused { gelu(x.clone()) } else { burn::tensor::activation::gelu(x.clone()) };
                let grads = (y.clone() * w).sum().backward();
                [values(y.inner()), values(x.grad(&grads).unwrap())]
            };
            for (what, (a, b)) in ["y", "dx"].iter().zip(run(true).iter().zip(&run(false))) {
                let diff = a.iter().zip(b).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
                assert!(diff <= 1e-4, "{what}, n {n}: max abs error {diff}");
            }
        }
    }
}
