//! LayerNorm and RMSNorm over the last dimension, y = γ ⊙ x̂ + β. On the CPU one fused pass per row forward (saving
//! the row's μ and 1/σ) and one backward, rows in parallel; elsewhere the same equations as tensor operations.

use burn::backend::{AutodiffBackend, Backend, Dispatch, Flex, backend_extension, tensor::FloatTensor};
use burn::tensor::{FloatDType, Tensor};
use rayon::prelude::*;

use crate::cpu::{floats, multiversion, on_cpu, operands, tensor};
use crate::tape::{self, Autodiff, Backward, CheckpointStrategy, Checkpointer, Gradients, Ops, OpsKind};

/// Which normalisation, and its ε.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormParams {
    /// RMSNorm x̂ = x / sqrt(mean(x²) + ε); else LayerNorm x̂ = (x − μ) / sqrt(σ² + ε).
    pub rms: bool,
    pub eps: f64,
}

/// The fused normalisation as backend operations (CPU only; other devices take [`reference`]).
#[backend_extension(Flex, Autodiff)]
pub trait NormOps: Backend {
    /// (y, μ, 1/σ) for x [N, d], γ and β [d]; μ and 1/σ per row, μ = 0 for RMSNorm.
    fn norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        params: NormParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// γ ⊙ x̂ + β over the last dimension of x (β absent: 0).
pub fn norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, beta: Option<Tensor<1>>, params: NormParams) -> Tensor<D> {
    if !on_cpu(&x.device()) {
        // The statistics in f32 whatever x's dtype: in f16, Σ x² overflows (65,504) once the row's RMS passes 256/√d.
        let (dtype, f32) = (FloatDType::from(x.dtype()), FloatDType::F32);
        return reference(x.cast(f32), gamma.cast(f32), beta.map(|b| b.cast(f32)), params).cast(dtype);
    }
    let dims = x.dims();
    let d = dims[D - 1];
    let beta = beta.unwrap_or_else(|| Tensor::zeros([d], &x.device()));
    let rows: Tensor<2> = x.reshape([dims.iter().product::<usize>() / d.max(1), d]);
    let (y, _, _) =
        <Dispatch as NormOps>::norm_forward(rows.into_dispatch(), gamma.into_dispatch(), beta.into_dispatch(), params);
    Tensor::<2>::from_dispatch(y).reshape(dims)
}

/// The reference: LN(x) = (x − μ) / sqrt(σ² + ε) with the biased variance, RMS(x) = x / sqrt(mean(x²) + ε), then
/// γ ⊙ · + β.
pub fn reference<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    params: NormParams,
) -> Tensor<D> {
    let y = if params.rms {
        x.clone() / (x.square().mean_dim(D - 1) + params.eps).sqrt()
    } else {
        let (var, mean) = x.clone().var_mean_bias(D - 1);
        (x - mean) / (var + params.eps).sqrt()
    };
    let y = y * gamma.unsqueeze();
    match beta {
        Some(beta) => y + beta.unsqueeze(),
        None => y,
    }
}

/// Rows per rayon task: enough work per task to outweigh scheduling.
fn rows_per_task(n: usize, d: usize) -> usize {
    (16_384 / d.max(1)).clamp(1, n.max(1))
}

multiversion! {
    /// The forward of rows of `d` values: y = γ ⊙ x̂ + β with each row's μ and 1/σ, for the rows of x from its start.
    fn norm_rows(
        y: &mut [f32],
        mean: &mut [f32],
        rstd: &mut [f32],
        xs: &[f32],
        g: &[f32],
        b: &[f32],
        d: usize,
        params: NormParams,
    ) {
        for (r, y) in y.chunks_mut(d).enumerate() {
            let x = &xs[r * d..][..d];
            // μ and σ² (biased) of the row; RMSNorm: μ = 0, σ² = mean(x²).
            let mu = if params.rms { 0.0 } else { x.iter().sum::<f32>() / d as f32 };
            let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / d as f32;
            let s = 1.0 / (var + params.eps as f32).sqrt();
            for e in 0..d {
                y[e] = (x[e] - mu) * s * g[e] + b[e];
            }
            (mean[r], rstd[r]) = (mu, s);
        }
    }
}

/// What the backward reads: x, dy, γ, the saved μ and 1/σ per row, rows of `d` values.
#[derive(Clone, Copy)]
struct Saved<'a> {
    xs: &'a [f32],
    dys: &'a [f32],
    g: &'a [f32],
    mus: &'a [f32],
    ss: &'a [f32],
    d: usize,
}

multiversion! {
    /// dx of the rows from `first` on (as many as `dx` holds), and their sums for dγ and dβ.
    fn norm_backward_rows(dx: &mut [f32], first: usize, saved: Saved<'_>, params: NormParams) -> (Vec<f32>, Vec<f32>) {
        let Saved { xs, dys, g, mus, ss, d } = saved;
        let (mut dg, mut db) = (vec![0.0f32; d], vec![0.0f32; d]);
        let mut xhat = vec![0.0f32; d];
        for (r, dx) in dx.chunks_mut(d).enumerate() {
            let row = first + r;
            let (x, dy, mu, s) = (&xs[row * d..][..d], &dys[row * d..][..d], mus[row], ss[row]);
            let (mut sum_g, mut sum_gx) = (0.0f32, 0.0f32);
            for e in 0..d {
                xhat[e] = (x[e] - mu) * s;
                let gh = dy[e] * g[e];
                sum_g += gh;
                sum_gx += gh * xhat[e];
                dg[e] += dy[e] * xhat[e];
                db[e] += dy[e];
            }
            let mean_g = if params.rms { 0.0 } else { sum_g / d as f32 };
            let mean_gx = sum_gx / d as f32;
            for e in 0..d {
                dx[e] = s * (dy[e] * g[e] - mean_g - xhat[e] * mean_gx);
            }
        }
        (dg, db)
    }
}

impl NormOps for Flex {
    fn norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        params: NormParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [x, gamma, beta] = operands([x, gamma, beta]);
        let shape = x.layout().shape().to_vec();
        let d = shape[1];
        let (xs, g, b) = (floats(&x), floats(&gamma), floats(&beta));
        let mut y = vec![0.0f32; xs.len()];
        let mut mean = vec![0.0f32; shape[0]];
        let mut rstd = vec![0.0f32; shape[0]];
        let rows = rows_per_task(shape[0], d);
        let tasks = y.par_chunks_mut(rows * d).zip(mean.par_chunks_mut(rows)).zip(rstd.par_chunks_mut(rows));
        tasks.enumerate().for_each(|(task, ((y, mean), rstd))| {
            norm_rows(y, mean, rstd, &xs[task * rows * d..], g, b, d, params);
        });
        let n = shape[0];
        (tensor(y, &shape), tensor(mean, &[n]), tensor(rstd, &[n]))
    }
}

/// (dx, dγ, dβ) from dy and the saved μ, 1/σ.
#[allow(clippy::type_complexity)]
fn norm_backward(
    x: FloatTensor<Flex>,
    gamma: FloatTensor<Flex>,
    d_y: FloatTensor<Flex>,
    mean: FloatTensor<Flex>,
    rstd: FloatTensor<Flex>,
    params: NormParams,
) -> (FloatTensor<Flex>, FloatTensor<Flex>, FloatTensor<Flex>) {
    let [x, gamma, d_y, mean, rstd] = operands([x, gamma, d_y, mean, rstd]);
    let shape = x.layout().shape().to_vec();
    let d = shape[1];
    let (xs, g, dys, mus, ss) = (floats(&x), floats(&gamma), floats(&d_y), floats(&mean), floats(&rstd));
    let mut dx = vec![0.0f32; xs.len()];
    let rows = rows_per_task(shape[0], d);
    let saved = Saved { xs, dys, g, mus, ss, d };
    // dx = s (ĝ − mean(ĝ) − x̂ mean(ĝ ⊙ x̂)) with ĝ = dy ⊙ γ (RMSNorm: no mean(ĝ) term); dγ = Σ dy ⊙ x̂,
    // dβ = Σ dy, summed per task and then over tasks.
    let partial: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(rows * d)
        .enumerate()
        .map(|(task, dx)| norm_backward_rows(dx, task * rows, saved, params))
        .collect();
    let (mut dg, mut db) = (vec![0.0f32; d], vec![0.0f32; d]);
    for (pg, pb) in partial {
        dg.iter_mut().zip(pg).for_each(|(a, b)| *a += b);
        db.iter_mut().zip(pb).for_each(|(a, b)| *a += b);
    }
    (tensor(dx, &shape), tensor(dg, &[d]), tensor(db, &[d]))
}

#[derive(Debug)]
struct NormBackward;

impl Backward<Flex, 3> for NormBackward {
    type State = (FloatTensor<Flex>, FloatTensor<Flex>, FloatTensor<Flex>, FloatTensor<Flex>, NormParams);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let parents = ops.parents.map(|p| p.map(|node| node.id));
        let d_y = grads.consume::<Flex>(&ops.node);
        let (x, gamma, mean, rstd, params) = ops.state;
        let (dx, dg, db) = norm_backward(x, gamma, d_y, mean, rstd, params);
        tape::register::<Flex, 3>(grads, parents, [dx, dg, db]);
    }
}

impl<C: CheckpointStrategy> NormOps for Autodiff<Flex, C> {
    fn norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        params: NormParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let prepared = NormBackward.prepare::<C>([x.node(), gamma.node(), beta.node()]).compute_bound().stateful();
        let (xi, gi) = (x.into_primitive(), gamma.into_primitive());
        let (y, mean, rstd) = Flex::norm_forward(xi.clone(), gi.clone(), beta.into_primitive(), params);
        match prepared {
            OpsKind::Tracked(prep) => {
                let state = (xi, gi, mean.clone(), rstd.clone(), params);
                (prep.finish(state, y), Self::from_inner(mean), Self::from_inner(rstd))
            }
            OpsKind::UnTracked(prep) => (prep.finish(y), Self::from_inner(mean), Self::from_inner(rstd)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, Distribution, TensorData};
    use ember_test_support::{max_abs_diff, values};

    /// y and the gradients of Σ w ⊙ y for x, γ, β, by the fused path or the reference.
    fn run(
        fused: bool,
        rms: bool,
        bias: bool,
        x: &Tensor<3>,
        w: &Tensor<3>,
        g: &Tensor<1>,
        b: &Tensor<1>,
    ) -> Vec<Vec<f32>> {
        let device = Device::flex().autodiff();
        let on = |t: Vec<f32>, shape: Vec<usize>| TensorData::new(t, shape);
        let x = Tensor::<3>::from_data(on(values(x.clone()), x.dims().to_vec()), &device).require_grad();
        let g = Tensor::<1>::from_data(on(values(g.clone()), g.dims().to_vec()), &device).require_grad();
        let b = Tensor::<1>::from_data(on(values(b.clone()), b.dims().to_vec()), &device).require_grad();
        let w = Tensor::<3>::from_data(on(values(w.clone()), w.dims().to_vec()), &device);
        let params = NormParams { rms, eps: 1e-5 };
        let beta = bias.then(|| b.clone());
        let y = if fused {
            norm(x.clone(), g.clone(), beta, params)
        } else {
            reference(x.clone(), g.clone(), beta, params)
        };
        let grads = (y.clone() * w).sum().backward();
        let mut out = vec![values(y.inner()), values(x.grad(&grads).unwrap()), values(g.grad(&grads).unwrap())];
        if bias {
            out.push(values(b.grad(&grads).unwrap()));
        }
        out
    }

    #[test]
    fn fused_norms_equal_the_reference_forward_and_backward() {
        let dev = Device::flex();
        for (rows, d) in [(3, 7), (37, 64), (300, 384)] {
            let x = Tensor::<3>::random([1, rows, d], Distribution::Normal(0.5, 2.0), &dev);
            let w = Tensor::<3>::random([1, rows, d], Distribution::Normal(0.0, 1.0), &dev);
            let g = Tensor::<1>::random([d], Distribution::Normal(1.0, 0.3), &dev);
            let b = Tensor::<1>::random([d], Distribution::Normal(0.0, 0.3), &dev);
            for (rms, bias) in [(false, true), (false, false), (true, false)] {
                let fused = run(true, rms, bias, &x, &w, &g, &b);
                let reference = run(false, rms, bias, &x, &w, &g, &b);
                for (i, (a, r)) in fused.into_iter().zip(reference).enumerate() {
                    let diff = max_abs_diff(&a, &r);
                    assert!(diff <= 1e-4, "rows {rows}, d {d}, rms {rms}, output {i}: max abs error {diff}");
                }
            }
        }
    }
}
