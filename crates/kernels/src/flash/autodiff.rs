//! The kernels' backward pass as autodiff's: the forward saves (q, k, v, o, lse); the backward computes
//! D = rowsum(dO ⊙ o) with backend ops, then dq, dk, dv with the FlashAttention-2 kernels.

use burn::backend::{AutodiffBackend, Flex, TensorMetadata, tensor::FloatTensor};

use burn::tensor::FloatDType;

use super::{FlashGradOps, FlashOps, FlashParams, KvLayout, PackedAttentionOps, flex};
use crate::spec::PackedHeads;
use crate::tape::{self, Autodiff, Backward, CheckpointStrategy, Checkpointer, Gradients, NodeId, Ops, OpsKind};

#[derive(Debug)]
struct FlashBackward;

impl<B: FlashGradOps> Backward<B, 3> for FlashBackward {
    type State = (NodeId, NodeId, NodeId, FloatTensor<B>, FloatTensor<B>, FlashParams);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let parents = ops.parents.map(|p| p.map(|node| node.id));
        let d_o = grads.consume::<B>(&ops.node);
        let (qs, ks, vs, o, lse, params) = ops.state;
        let q: FloatTensor<B> = checkpointer.retrieve_node_output(qs);
        let k: FloatTensor<B> = checkpointer.retrieve_node_output(ks);
        let v: FloatTensor<B> = checkpointer.retrieve_node_output(vs);
        // D_i = Σ_e dO_ie o_ie, [B, Hq, Tq], summed in f32 whatever the inputs' dtype.
        let [b, h, t, _] = <[usize; 4]>::try_from(o.shape().as_slice()).expect("rank 4");
        let f32 = |x| B::float_cast(x, FloatDType::F32);
        let delta = B::float_reshape(B::float_sum_dim(B::float_mul(f32(d_o.clone()), f32(o)), 3), [b, h, t].into());
        let (d_q, d_k, d_v) = B::flash_backward(q, k, v, d_o, lse, delta, params);
        tape::register::<B, 3>(grads, parents, [d_q, d_k, d_v]);
    }
}

impl<B: FlashOps + FlashGradOps, C: CheckpointStrategy> FlashOps for Autodiff<B, C> {
    fn flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let prepared = FlashBackward.prepare::<C>([q.node(), k.node(), v.node()]).compute_bound().stateful();
        match prepared {
            // Paged decoding reads a cache, not the step's keys: nothing to differentiate.
            OpsKind::Tracked(mut prep) if params.layout == KvLayout::Contiguous => {
                let (qs, ks, vs) = (prep.checkpoint(&q), prep.checkpoint(&k), prep.checkpoint(&v));
                let (o, lse) =
                    B::flash_forward(q.into_primitive(), k.into_primitive(), v.into_primitive(), params.clone());
                let state = (qs, ks, vs, o.clone(), lse.clone(), params);
                (prep.finish(state, o), Self::from_inner(lse))
            }
            _ => {
                let (o, lse) = B::flash_forward(q.into_primitive(), k.into_primitive(), v.into_primitive(), params);
                (Self::from_inner(o), Self::from_inner(lse))
            }
        }
    }
}

#[derive(Debug)]
struct PackedBackward;

impl Backward<Flex, 1> for PackedBackward {
    type State = (FloatTensor<Flex>, FloatTensor<Flex>, FloatTensor<Flex>, PackedHeads, FlashParams);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node] = ops.parents;
        let d_o = grads.consume::<Flex>(&ops.node);
        let (qkv, o, lse, heads, params) = ops.state;
        if let Some(node) = node {
            grads.register::<Flex>(node.id, flex::packed_attention_backward(qkv, o, lse, d_o, heads, params));
        }
    }
}

impl<C: CheckpointStrategy> PackedAttentionOps for Autodiff<Flex, C> {
    fn packed_attention_forward(
        qkv: FloatTensor<Self>,
        heads: PackedHeads,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let prepared = PackedBackward.prepare::<C>([qkv.node()]).compute_bound().stateful();
        let qkv = qkv.into_primitive();
        let (o, lse) = Flex::packed_attention_forward(qkv.clone(), heads, params.clone());
        match prepared {
            OpsKind::Tracked(prep) => {
                let state = (qkv, o.clone(), lse.clone(), heads, params);
                (prep.finish(state, o), Self::from_inner(lse))
            }
            OpsKind::UnTracked(prep) => (prep.finish(o), Self::from_inner(lse)),
        }
    }
}
