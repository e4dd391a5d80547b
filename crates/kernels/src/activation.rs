//! GELU(x) = x Φ(x) = ½ x (1 + erf(x/√2)) (exact, as torch.nn.GELU()) or its tanh approximation, and the gated units act(g) ⊙ u: SwiGLU's
//! SiLU(g) = g σ(g) and GeGLU's tanh-approximated GELU(g) = ½ g (1 + tanh(√(2/π) (g + 0.044715 g³))) (Gemma's
//! `gelu_pytorch_tanh`). On the CPU one pass forward and one pass backward each, chunks in parallel; elsewhere Burn's
//! activations.

use burn::backend::flex::FlexTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension, tensor::FloatTensor};
use burn::tensor::Tensor;
use rayon::prelude::*;

use crate::cpu::{contiguous, floats, multiversion, on_cpu, operands, stay_awake, tensor};
use crate::math;
use crate::tape::{self, Autodiff, Backward, CheckpointStrategy, Checkpointer, Gradients, Ops, OpsKind};

/// An elementwise activation the fused kernels compute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// Exact GELU x Φ(x).
    Gelu,
    /// GELU's tanh approximation (GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// SiLU g σ(g) (SwiGLU's gate).
    Silu,
}

/// The fused activation as backend operations (CPU only; other devices take Burn's `gelu` or `gelu_approximate`).
#[backend_extension(Flex, Autodiff)]
pub trait GeluOps: Backend {
    fn fused_gelu(x: FloatTensor<Self>, kind: Activation) -> FloatTensor<Self>;
}

/// GELU(x) elementwise.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if !on_cpu(&x.device()) {
        return burn::tensor::activation::gelu(x);
    }
    Tensor::from_dispatch(<Dispatch as GeluOps>::fused_gelu(x.into_dispatch(), Activation::Gelu))
}

/// GELU's tanh approximation ½ x (1 + tanh(√(2/π) (x + 0.044715 x³))) elementwise.
pub fn gelu_tanh<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if !on_cpu(&x.device()) {
        return burn::tensor::activation::gelu_approximate(x);
    }
    Tensor::from_dispatch(<Dispatch as GeluOps>::fused_gelu(x.into_dispatch(), Activation::GeluTanh))
}

/// The fused gated unit as backend operations (CPU only; other devices take Burn's activations and a product).
#[backend_extension(Flex, Autodiff)]
pub trait GatedOps: Backend {
    /// act(g) ⊙ u.
    fn fused_gated(g: FloatTensor<Self>, u: FloatTensor<Self>, gate: Activation) -> FloatTensor<Self>;
}

/// SiLU(g) ⊙ u elementwise (g and u of one shape).
pub fn swiglu<const D: usize>(g: Tensor<D>, u: Tensor<D>) -> Tensor<D> {
    if !on_cpu(&g.device()) {
        return burn::tensor::activation::silu(g) * u;
    }
    Tensor::from_dispatch(<Dispatch as GatedOps>::fused_gated(g.into_dispatch(), u.into_dispatch(), Activation::Silu))
}

/// GELU_tanh(g) ⊙ u elementwise (g and u of one shape).
pub fn geglu<const D: usize>(g: Tensor<D>, u: Tensor<D>) -> Tensor<D> {
    if !on_cpu(&g.device()) {
        return burn::tensor::activation::gelu_approximate(g) * u;
    }
    Tensor::from_dispatch(<Dispatch as GatedOps>::fused_gated(
        g.into_dispatch(),
        u.into_dispatch(),
        Activation::GeluTanh,
    ))
}

const CHUNK: usize = 16_384;

/// Φ(x) = ½ (1 + erf(x/√2)).
#[inline(always)]
fn cdf(x: f32) -> f32 {
    0.5 * (1.0 + math::erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// 1/√(2π), for φ(x) = e^(−x²/2) / √(2π).
const INV_SQRT_2PI: f32 = 0.5 * std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;

multiversion! {
    /// y = GELU(x), elementwise.
    fn gelu_chunk(y: &mut [f32], x: &[f32], kind: Activation) {
        y.iter_mut().zip(x).for_each(|(y, &x)| *y = activate(kind, x).0);
    }
}

multiversion! {
    /// dx = dy ⊙ GELU'(x), elementwise.
    fn gelu_backward_chunk(dx: &mut [f32], x: &[f32], dy: &[f32], kind: Activation) {
        for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
            *dx = dy * activate(kind, x).1;
        }
    }
}

impl GeluOps for Flex {
    fn fused_gelu(x: FloatTensor<Self>, kind: Activation) -> FloatTensor<Self> {
        let [x] = operands([x]);
        let shape = x.layout().shape().to_vec();
        let xs = floats(&x);
        let mut y = vec![0.0f32; xs.len()];
        y.par_chunks_mut(CHUNK).zip(xs.par_chunks(CHUNK)).for_each(|(y, x)| gelu_chunk(y, x, kind));
        tensor(y, &shape)
    }
}

/// dx = dy ⊙ GELU'(x): Φ(x) + x φ(x) for the exact one.
fn fused_gelu_backward(x: FloatTensor<Flex>, d_y: FloatTensor<Flex>, kind: Activation) -> FloatTensor<Flex> {
    stay_awake();
    zip_map(x, d_y, |dx, x, dy| gelu_backward_chunk(dx, x, dy, kind))
}

/// `chunk(out, a, b)` over two tensors of one shape, chunks in parallel.
fn zip_map(a: FlexTensor, b: FlexTensor, chunk: impl Fn(&mut [f32], &[f32], &[f32]) + Sync) -> FlexTensor {
    let (a, b) = (contiguous(a), contiguous(b));
    let shape = a.layout().shape().to_vec();
    let (xs, ys) = (floats(&a), floats(&b));
    let mut out = vec![0.0f32; xs.len()];
    out.par_chunks_mut(CHUNK).zip(xs.par_chunks(CHUNK).zip(ys.par_chunks(CHUNK))).for_each(|(out, (xs, ys))| {
        chunk(out, xs, ys);
    });
    tensor(out, &shape)
}

/// σ(x) = 1 / (1 + e^(−x)).
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + math::exp(-x))
}

/// √(2/π) and the cubic's coefficient of the tanh approximation.
const SQRT_2_OVER_PI: f32 = std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;
const CUBIC: f32 = 0.044_715;

/// (act(g), act'(g)): GELU g Φ(g) and Φ(g) + g φ(g); SiLU g σ(g) and σ(g) (1 + g (1 − σ(g))); or GELU_tanh
/// ½ g (1 + t) with t = tanh(z), z = √(2/π)(g + 0.044715 g³), tanh(z) = 1 − 2/(e^(2z) + 1), and its derivative
/// ½ (1 + t) + ½ g (1 − t²) √(2/π)(1 + 3 · 0.044715 g²).
#[inline(always)]
fn activate(activation: Activation, g: f32) -> (f32, f32) {
    match activation {
        Activation::Gelu => {
            let c = cdf(g);
            (g * c, c + g * INV_SQRT_2PI * math::exp(-0.5 * g * g))
        }
        Activation::Silu => {
            let s = sigmoid(g);
            (g * s, s * (1.0 + g * (1.0 - s)))
        }
        Activation::GeluTanh => {
            let z = SQRT_2_OVER_PI * (g + CUBIC * g * g * g);
            let t = 1.0 - 2.0 / (math::exp(2.0 * z) + 1.0);
            let dz = SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * g * g);
            (0.5 * g * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * dz)
        }
    }
}

multiversion! {
    /// y = act(g) u, elementwise.
    fn gated_chunk(y: &mut [f32], g: &[f32], u: &[f32], gate: Activation) {
        for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
            *y = activate(gate, g).0 * u;
        }
    }
}

multiversion! {
    /// (dg, du) = (dy ⊙ u ⊙ act'(g), dy ⊙ act(g)), elementwise.
    fn gated_backward_chunk(dg: &mut [f32], du: &mut [f32], g: &[f32], u: &[f32], dy: &[f32], gate: Activation) {
        for i in 0..g.len() {
            let (a, da) = activate(gate, g[i]);
            dg[i] = dy[i] * u[i] * da;
            du[i] = dy[i] * a;
        }
    }
}

impl GatedOps for Flex {
    fn fused_gated(g: FloatTensor<Self>, u: FloatTensor<Self>, gate: Activation) -> FloatTensor<Self> {
        stay_awake();
        zip_map(g, u, |y, g, u| gated_chunk(y, g, u, gate))
    }
}

/// (dg, du) = (dy ⊙ u ⊙ act'(g), dy ⊙ act(g)).
fn fused_gated_backward(
    g: FloatTensor<Flex>,
    u: FloatTensor<Flex>,
    d_y: FloatTensor<Flex>,
    gate: Activation,
) -> (FloatTensor<Flex>, FloatTensor<Flex>) {
    let [g, u, d_y] = operands([g, u, d_y]);
    let shape = g.layout().shape().to_vec();
    let (gs, us, dys) = (floats(&g), floats(&u), floats(&d_y));
    let (mut dg, mut du) = (vec![0.0f32; gs.len()], vec![0.0f32; gs.len()]);
    let outs = dg.par_chunks_mut(CHUNK).zip(du.par_chunks_mut(CHUNK));
    outs.zip(gs.par_chunks(CHUNK).zip(us.par_chunks(CHUNK)).zip(dys.par_chunks(CHUNK)))
        .for_each(|((dg, du), ((g, u), dy))| gated_backward_chunk(dg, du, g, u, dy, gate));
    (tensor(dg, &shape), tensor(du, &shape))
}

#[derive(Debug)]
struct GatedBackward;

impl Backward<Flex, 2> for GatedBackward {
    type State = (FloatTensor<Flex>, FloatTensor<Flex>, Activation);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let parents = ops.parents.map(|p| p.map(|node| node.id));
        let d_y = grads.consume::<Flex>(&ops.node);
        let (g, u, gate) = ops.state;
        let (dg, du) = fused_gated_backward(g, u, d_y, gate);
        tape::register::<Flex, 2>(grads, parents, [dg, du]);
    }
}

impl<C: CheckpointStrategy> GatedOps for Autodiff<Flex, C> {
    fn fused_gated(g: FloatTensor<Self>, u: FloatTensor<Self>, gate: Activation) -> FloatTensor<Self> {
        let prepared = GatedBackward.prepare::<C>([g.node(), u.node()]).compute_bound().stateful();
        let (g, u) = (g.into_primitive(), u.into_primitive());
        let y = Flex::fused_gated(g.clone(), u.clone(), gate);
        match prepared {
            OpsKind::Tracked(prep) => prep.finish((g, u, gate), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    type State = (FloatTensor<Flex>, Activation);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let d_y = grads.consume::<Flex>(&ops.node);
        if let Some(node) = node_x {
            let (x, kind) = ops.state;
            grads.register::<Flex>(node.id, fused_gelu_backward(x, d_y, kind));
        }
    }
}

impl<C: CheckpointStrategy> GeluOps for Autodiff<Flex, C> {
    fn fused_gelu(x: FloatTensor<Self>, kind: Activation) -> FloatTensor<Self> {
        let prepared = GeluBackward.prepare::<C>([x.node()]).compute_bound().stateful();
        let x = x.into_primitive();
        let y = Flex::fused_gelu(x.clone(), kind);
        match prepared {
            OpsKind::Tracked(prep) => prep.finish((x, kind), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution, TensorData};
    use ember_test_support::{assert_outputs_close, values};

    const ALL: [Activation; 3] = [Activation::Gelu, Activation::GeluTanh, Activation::Silu];

    /// Burn's own activation, the reference.
    fn reference(activation: Activation, x: Tensor<2>) -> Tensor<2> {
        match activation {
            Activation::Gelu => burn::tensor::activation::gelu(x),
            Activation::GeluTanh => burn::tensor::activation::gelu_approximate(x),
            Activation::Silu => burn::tensor::activation::silu(x),
        }
    }

    #[test]
    fn fused_activations_equal_burns_forward_and_backward() {
        let dev = Device::flex();
        let device = dev.clone().autodiff();
        for n in [7, 40_000] {
            let x = values(Tensor::<2>::random([2, n], Distribution::Normal(0.0, 3.0), &dev));
            let w = values(Tensor::<2>::random([2, n], Distribution::Normal(0.0, 1.0), &dev));
            let run = |kind: Activation, fused: bool| {
                let x = Tensor::<2>::from_data(TensorData::new(x.clone(), [2, n]), &device).require_grad();
                let w = Tensor::<2>::from_data(TensorData::new(w.clone(), [2, n]), &device);
                let y = match fused {
                    true => Tensor::from_dispatch(<Dispatch as GeluOps>::fused_gelu(x.clone().into_dispatch(), kind)),
                    false => reference(kind, x.clone()),
                };
                let grads = (y.clone() * w).sum().backward();
                [values(y.inner()), values(x.grad(&grads).unwrap())]
            };
            for kind in ALL {
                assert_outputs_close(
                    &["y", "dx"],
                    &run(kind, true),
                    &run(kind, false),
                    1e-4,
                    &format!("{kind:?}, n {n}"),
                );
            }
        }
    }

    #[test]
    fn fused_gated_units_equal_burns_activation_times_u_forward_and_backward() {
        let dev = Device::flex();
        let device = dev.clone().autodiff();
        for n in [7, 40_000] {
            let [g, u, w] =
                [3.0, 1.0, 1.0].map(|s| values(Tensor::<2>::random([2, n], Distribution::Normal(0.0, s), &dev)));
            let run = |gate: Activation, fused: bool| {
                let leaf =
                    |v: &Vec<f32>| Tensor::<2>::from_data(TensorData::new(v.clone(), [2, n]), &device).require_grad();
                let (g, u) = (leaf(&g), leaf(&u));
                let w = Tensor::<2>::from_data(TensorData::new(w.clone(), [2, n]), &device);
                let y = match fused {
                    true => Tensor::from_dispatch(<Dispatch as GatedOps>::fused_gated(
                        g.clone().into_dispatch(),
                        u.clone().into_dispatch(),
                        gate,
                    )),
                    false => reference(gate, g.clone()) * u.clone(),
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                [values(y.inner()), values(g.grad(&grads).unwrap()), values(u.grad(&grads).unwrap())]
            };
            for gate in ALL {
                let case = format!("{gate:?}, n {n}");
                assert_outputs_close(&["y", "dg", "du"], &run(gate, true), &run(gate, false), 1e-4, &case);
            }
        }
    }
}
