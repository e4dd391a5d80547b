//! Cross-entropy per row of logits, with label smoothing: ℓ = (1 − ε)(lse − x_y) + ε (lse − mean_v x_v), which is
//! −Σ_v q_v log p_v for q = (1 − ε) one_hot(y) + ε/V. On the CPU one pass per row computes lse and ℓ, and the
//! backward writes ∂ℓ/∂x = p − q in one more pass, with no [N, V] log-probability tensor kept; elsewhere the same
//! equations as tensor operations.

use burn::backend::flex::FlexTensor;
use burn::backend::{
    AutodiffBackend, Backend, Dispatch, Flex, backend_extension,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};
use rayon::prelude::*;

use crate::cpu::{floats, multiversion, on_cpu, operands, tensor};
use crate::math;
use crate::tape::{Autodiff, Backward, CheckpointStrategy, Checkpointer, Gradients, Ops, OpsKind};

/// The fused loss as backend operations (CPU only; other devices take [`reference`]).
#[backend_extension(Flex, Autodiff)]
pub trait CrossEntropyOps: Backend {
    /// (ℓ, lse) per row of logits [N, V] with targets [N].
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// ℓ per row of logits [N, V] against targets [N], label smoothing ε.
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>, epsilon: f64) -> Tensor<1> {
    if !on_cpu(&logits.device()) {
        return reference(logits, targets, epsilon);
    }
    let (loss, _) = <Dispatch as CrossEntropyOps>::cross_entropy_forward(
        logits.into_dispatch(),
        targets.into_dispatch(),
        epsilon as f32,
    );
    Tensor::from_dispatch(loss)
}

/// The reference: log p = log_softmax(x), ℓ = −(1 − ε) log p_y − ε mean_v log p_v.
pub fn reference(logits: Tensor<2>, targets: Tensor<1, Int>, epsilon: f64) -> Tensor<1> {
    let n = logits.dims()[0];
    let log_p = log_softmax(logits, 1);
    let nll = -log_p.clone().gather(1, targets.unsqueeze_dim::<2>(1)).reshape([n]);
    let uniform = -log_p.mean_dim(1).reshape([n]);
    nll * (1.0 - epsilon) + uniform * epsilon
}

fn indices(targets: FlexTensor) -> Vec<usize> {
    targets.into_data().iter::<i64>().map(|y| y as usize).collect()
}

multiversion! {
    /// (ℓ, lse) of one row of logits against target y.
    fn row_loss(row: &[f32], y: usize, epsilon: f32) -> (f32, f32) {
        let v = row.len();
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|&a| math::exp(a - m)).sum();
        let lse = m + sum.ln();
        let mean = row.iter().sum::<f32>() / v as f32;
        ((1.0 - epsilon) * (lse - row[y]) + epsilon * (lse - mean), lse)
    }
}

multiversion! {
    /// ∂L/∂x of one row: g (p − q) with q = (1 − ε) one_hot(y) + ε/V, p from the row's lse.
    fn row_gradient(dx: &mut [f32], row: &[f32], y: usize, g: f32, lse: f32, epsilon: f32) {
        let v = row.len();
        for (d, &a) in dx.iter_mut().zip(row) {
            *d = g * (math::exp(a - lse) - epsilon / v as f32);
        }
        dx[y] -= g * (1.0 - epsilon);
    }
}

impl CrossEntropyOps for Flex {
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [logits] = operands([logits]);
        let [n, v] = [logits.layout().shape()[0], logits.layout().shape()[1]];
        let (x, y) = (floats(&logits), indices(targets));
        let mut loss = vec![0.0f32; n];
        let mut lse = vec![0.0f32; n];
        loss.par_iter_mut().zip(lse.par_iter_mut()).enumerate().for_each(|(r, (loss, lse))| {
            (*loss, *lse) = row_loss(&x[r * v..][..v], y[r], epsilon);
        });
        (tensor(loss, &[n]), tensor(lse, &[n]))
    }
}

/// ∂L/∂x = dℓ ⊙ (softmax(x) − q), row by row, from the saved lse.
fn cross_entropy_backward(
    logits: FloatTensor<Flex>,
    targets: IntTensor<Flex>,
    lse: FloatTensor<Flex>,
    d_loss: FloatTensor<Flex>,
    epsilon: f32,
) -> FloatTensor<Flex> {
    let [logits, lse, d_loss] = operands([logits, lse, d_loss]);
    let shape = logits.layout().shape().to_vec();
    let v = shape[1];
    let (x, y, lse, dl) = (floats(&logits), indices(targets), floats(&lse), floats(&d_loss));
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(v.max(1)).enumerate().for_each(|(r, dx)| {
        row_gradient(dx, &x[r * v..][..v], y[r], dl[r], lse[r], epsilon);
    });
    tensor(dx, &shape)
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl Backward<Flex, 1> for CrossEntropyBackward {
    type State = (FloatTensor<Flex>, IntTensor<Flex>, FloatTensor<Flex>, f32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_logits] = ops.parents;
        let d_loss = grads.consume::<Flex>(&ops.node);
        let (logits, targets, lse, epsilon) = ops.state;
        if let Some(node) = node_logits {
            grads.register::<Flex>(node.id, cross_entropy_backward(logits, targets, lse, d_loss, epsilon));
        }
    }
}

impl<C: CheckpointStrategy> CrossEntropyOps for Autodiff<Flex, C> {
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        epsilon: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let prepared = CrossEntropyBackward.prepare::<C>([logits.node()]).compute_bound().stateful();
        let x = logits.into_primitive();
        let (loss, lse) = Flex::cross_entropy_forward(x.clone(), targets.clone(), epsilon);
        match prepared {
            OpsKind::Tracked(prep) => (prep.finish((x, targets, lse.clone(), epsilon), loss), Self::from_inner(lse)),
            OpsKind::UnTracked(prep) => (prep.finish(loss), Self::from_inner(lse)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution, TensorData};
    use ember_test_support::{assert_outputs_close, values};

    /// Per-row losses and the gradient of Σ w ⊙ ℓ for the logits, fused or by the reference.
    fn run(fused: bool, x: &[f32], y: &[i64], w: &[f32], [n, v]: [usize; 2], epsilon: f64) -> [Vec<f32>; 2] {
        let device = Device::flex().autodiff();
        let logits = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [n, v]), &device).require_grad();
        let targets = Tensor::<1, Int>::from_data(TensorData::new(y.to_vec(), [n]), &device);
        let weights = Tensor::<1>::from_data(TensorData::new(w.to_vec(), [n]), &device);
        let loss = if fused {
            cross_entropy(logits.clone(), targets, epsilon)
        } else {
            reference(logits.clone(), targets, epsilon)
        };
        let grads = (loss.clone() * weights).sum().backward();
        [values(loss.inner()), values(logits.grad(&grads).unwrap())]
    }

    #[test]
    fn fused_cross_entropy_equals_the_reference_forward_and_backward() {
        let dev = Device::flex();
        for (n, v) in [(1, 2), (13, 65), (70, 6000)] {
            let x = values(Tensor::<2>::random([n, v], Distribution::Normal(0.0, 3.0), &dev));
            let w = values(Tensor::<1>::random([n], Distribution::Normal(0.0, 1.0), &dev));
            let y: Vec<i64> = (0..n).map(|r| ((r * 7919 + 3) % v) as i64).collect();
            for epsilon in [0.0, 0.1] {
                let fused = run(true, &x, &y, &w, [n, v], epsilon);
                let reference = run(false, &x, &y, &w, [n, v], epsilon);
                let case = format!("N {n}, V {v}, ε {epsilon}");
                assert_outputs_close(&["loss", "dlogits"], &fused, &reference, 1e-4, &case);
            }
        }
    }
}
