//! The affine map y = x W + b of every projection (W [d_in, d_out], Burn's layout), and x Eᵀ through a tied
//! embedding E. On the CPU one matrix product over all rows (batch and time folded together) into the bias rows, and a
//! backward of two products and a column sum, rows in parallel; elsewhere Burn's `Linear::forward` and `matmul`.

use burn::backend::{Backend, Dispatch, Flex, backend_extension, tensor::FloatTensor};
use burn::nn::Linear;
use burn::tensor::{DType, Tensor};

use crate::cpu::{Mat, column_sums, floats, matmul_in_blocks, on_cpu, operands, tensor};
use crate::tape::{self, Autodiff, Backward, CheckpointStrategy, Checkpointer, Gradients, Ops, OpsKind};

/// The fused affine map as backend operations (CPU only; other devices take Burn's).
#[backend_extension(Flex, Autodiff)]
pub trait LinearOps: Backend {
    /// y = x W + b for x [N, d_in], W [d_in, d_out] (any non-negative strides: a transposed view is read in place),
    /// b [d_out].
    fn linear_forward(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// `layer` applied to the last dimension of x.
pub fn linear<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    let w = layer.weight.val();
    if !on_cpu(&x.device()) || w.dtype() != DType::F32 {
        return layer.forward(x);
    }
    affine(x, w, layer.bias.as_ref().map(|b| b.val()))
}

/// x Eᵀ for E [d_out, d_in] (an embedding matrix tied to the output projection). On the CPU E is read in place
/// through the transposed view; elsewhere as (E xᵀ)ᵀ, which reads E row-major as stored (Eᵀ would be copied).
pub fn tied_linear<const D: usize>(e: Tensor<2>, x: Tensor<D>) -> Tensor<D> {
    if on_cpu(&x.device()) && e.dtype() == DType::F32 {
        return affine(x, e.transpose(), None);
    }
    let mut dims = x.dims();
    let [d_out, d_in] = e.dims();
    let rows: Tensor<2> = x.reshape([dims.iter().product::<usize>() / d_in.max(1), d_in]);
    dims[D - 1] = d_out;
    e.matmul(rows.transpose()).transpose().reshape(dims)
}

/// x W + b over the last dimension of x, by the CPU kernel (W [d_in, d_out], any strides).
fn affine<const D: usize>(x: Tensor<D>, w: Tensor<2>, b: Option<Tensor<1>>) -> Tensor<D> {
    let [d_in, d_out] = w.dims();
    let mut dims = x.dims();
    let rows: Tensor<2> = x.reshape([dims.iter().product::<usize>() / d_in.max(1), d_in]);
    let b = b.unwrap_or_else(|| Tensor::zeros([d_out], &rows.device()));
    let y = <Dispatch as LinearOps>::linear_forward(rows.into_dispatch(), w.into_dispatch(), b.into_dispatch());
    dims[D - 1] = d_out;
    Tensor::<2>::from_dispatch(y).reshape(dims)
}

impl LinearOps for Flex {
    fn linear_forward(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let [x, b] = operands([x, b]);
        let (n, k, m) = (x.layout().shape()[0], x.layout().shape()[1], w.layout().shape()[1]);
        tensor(matmul_in_blocks(n, m, k, Mat::rows(floats(&x), k), Mat::of(&w), Some(floats(&b))), &[n, m])
    }
}

/// (dx, dW, db) = (dy Wᵀ, xᵀ dy, Σ_rows dy).
fn linear_backward(
    x: FloatTensor<Flex>,
    w: FloatTensor<Flex>,
    d_y: FloatTensor<Flex>,
) -> (FloatTensor<Flex>, FloatTensor<Flex>, FloatTensor<Flex>) {
    let [x, d_y] = operands([x, d_y]);
    let (n, k, m) = (x.layout().shape()[0], x.layout().shape()[1], w.layout().shape()[1]);
    let (xs, dys) = (floats(&x), floats(&d_y));
    // dx = dy Wᵀ; dW = xᵀ dy (its row blocks are column blocks of x).
    let dx = matmul_in_blocks(n, k, m, Mat::rows(dys, m), Mat::of(&w).t(), None);
    let dw = matmul_in_blocks(k, m, n, Mat::transposed(xs, k), Mat::rows(dys, m), None);
    // db = Σ_rows dy.
    (tensor(dx, &[n, k]), tensor(dw, &[k, m]), tensor(column_sums(dys, m), &[m]))
}

#[derive(Debug)]
struct LinearBackward;

impl Backward<Flex, 3> for LinearBackward {
    type State = (FloatTensor<Flex>, FloatTensor<Flex>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let parents = ops.parents.map(|p| p.map(|node| node.id));
        let d_y = grads.consume::<Flex>(&ops.node);
        let (x, w) = ops.state;
        let (dx, dw, db) = linear_backward(x, w, d_y);
        tape::register::<Flex, 3>(grads, parents, [dx, dw, db]);
    }
}

impl<C: CheckpointStrategy> LinearOps for Autodiff<Flex, C> {
    fn linear_forward(x: FloatTensor<Self>, w: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let prepared = LinearBackward.prepare::<C>([x.node(), w.node(), b.node()]).compute_bound().stateful();
        let (x, w) = (x.into_primitive(), w.into_primitive());
        let y = Flex::linear_forward(x.clone(), w.clone(), b.into_primitive());
        match prepared {
            OpsKind::Tracked(prep) => prep.finish((x, w), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::LinearConfig;
    use burn::tensor::{Device, Distribution, TensorData};
    use ember_test_support::{assert_outputs_close, values};

    #[test]
    fn fused_linear_equals_burns_forward_and_gradients() {
        let dev = Device::flex();
        let device = dev.clone().autodiff();
        // Row counts below, at and above one chunk per core, 320 rows in three chunks (and dW = xᵀ dy over three chunks
        // of its inner dimension), and few rows by a long inner dimension (inner chunks, k ≥ 64 per core: one token
        // decoded, or three; the second also in dx = dy Wᵀ, without bias); with and without bias.
        let shapes = [
            (1, 1, 5, 3, true),
            (2, 7, 16, 9, false),
            (3, 50, 64, 96, true),
            (4, 80, 48, 40, true),
            (1, 1, 200, 64, true),
            (1, 3, 300, 160, false),
        ];
        for (b, t, d_in, d_out, bias) in shapes {
            let layer = LinearConfig::new(d_in, d_out).with_bias(bias).init(&device);
            let x = values(Tensor::<3>::random([b, t, d_in], Distribution::Normal(0.0, 1.0), &dev));
            let w = values(Tensor::<3>::random([b, t, d_out], Distribution::Normal(0.0, 1.0), &dev));
            let run = |fused: bool| {
                let x = Tensor::<3>::from_data(TensorData::new(x.clone(), [b, t, d_in]), &device).require_grad();
                let w = Tensor::<3>::from_data(TensorData::new(w.clone(), [b, t, d_out]), &device);
                let y = if fused { linear(&layer, x.clone()) } else { layer.forward(x.clone()) };
                let grads = (y.clone() * w).sum().backward();
                let mut out = vec![values(y.inner()), values(x.grad(&grads).unwrap())];
                out.push(values(layer.weight.grad(&grads).unwrap()));
                if let Some(bias) = &layer.bias {
                    out.push(values(bias.grad(&grads).unwrap()));
                }
                out
            };
            let case = format!("[{b}, {t}, {d_in}] -> {d_out}");
            assert_outputs_close(&["y", "dx", "dW", "db"], &run(true), &run(false), 1e-4, &case);
        }
    }

    /// x Eᵀ through a tied embedding equals Burn's product with E transposed, forward and both gradients: E is read
    /// in place as a strided view (row chunks, and the inner chunks of a decoded token: d = 200).
    #[test]
    fn tied_linear_equals_the_product_with_the_transposed_embedding() {
        let dev = Device::flex();
        let device = dev.clone().autodiff();
        for (b, t, d, v) in [(2, 9, 16, 11), (1, 1, 200, 70), (3, 40, 24, 65)] {
            let e = values(Tensor::<2>::random([v, d], Distribution::Normal(0.0, 1.0), &dev));
            let x = values(Tensor::<3>::random([b, t, d], Distribution::Normal(0.0, 1.0), &dev));
            let w = values(Tensor::<3>::random([b, t, v], Distribution::Normal(0.0, 1.0), &dev));
            let run = |fused: bool| {
                let e = Tensor::<2>::from_data(TensorData::new(e.clone(), [v, d]), &device).require_grad();
                let x = Tensor::<3>::from_data(TensorData::new(x.clone(), [b, t, d]), &device).require_grad();
                let w = Tensor::<3>::from_data(TensorData::new(w.clone(), [b, t, v]), &device);
                let y = if fused {
                    tied_linear(e.clone(), x.clone())
                } else {
                    x.clone().matmul(e.clone().transpose().unsqueeze())
                };
                let grads = (y.clone() * w).sum().backward();
                [values(y.inner()), values(x.grad(&grads).unwrap()), values(e.grad(&grads).unwrap())]
            };
            let case = format!("[{b}, {t}, {d}] through E [{v}, {d}]");
            assert_outputs_close(&["y", "dx", "dE"], &run(true), &run(false), 1e-4, &case);
        }
    }
}
