//! What the autodiff side of every custom op uses: Burn's tape types, and the registration of the gradients its
//! backward computes for its parents.

pub use burn::backend::autodiff::{
    Autodiff, NodeId,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, tensor::FloatTensor};

/// Registers ∂L/∂pᵢ for each parent pᵢ the tape tracks (`None`: a parent that needs no gradient).
pub fn register<B: Backend, const N: usize>(
    grads: &mut Gradients,
    parents: [Option<NodeId>; N],
    gradients: [FloatTensor<B>; N],
) {
    for (parent, gradient) in parents.into_iter().zip(gradients) {
        if let Some(id) = parent {
            grads.register::<B>(id, gradient);
        }
    }
}
