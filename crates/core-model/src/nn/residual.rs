//! Where the norm sits around a residual sub-layer F.

use burn::tensor::Tensor;

use crate::nn::norm::Norm;
use ember_formats::config::NormPlacement;

/// Post: LN(x + F(x)); Pre: x + F(LN(x)); Peri: x + LN_out(F(LN_in(x))).
pub fn sublayer(
    placement: NormPlacement,
    x: Tensor<3>,
    ln: &Norm,
    ln_out: Option<&Norm>,
    f: impl FnOnce(Tensor<3>) -> Tensor<3>,
) -> Tensor<3> {
    match (placement, ln_out) {
        (NormPlacement::Post, _) => ln.forward(x.clone() + f(x)),
        (NormPlacement::Peri | NormPlacement::Sandwich, Some(out)) => x.clone() + out.forward(f(ln.forward(x))),
        _ => x.clone() + f(ln.forward(x)),
    }
}
