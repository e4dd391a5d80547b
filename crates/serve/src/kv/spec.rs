//! Which KV store a generation decodes from, and its parameters, checked against the model.

use ember_core_model::ModelConfig;
use ember_core_model::cache::KvCache;
use ember_core_model::config::AttentionKernel;
use serde::{Deserialize, Serialize};

use super::{Bits, ContiguousCache, PagePool, PagedCache, QuantizedCache, StateCache};

/// Where keys and values live between steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvKind {
    /// No cache: every step recomputes the whole context.
    None,
    /// One growing buffer per layer.
    #[default]
    Contiguous,
    /// Fixed pages through a page table.
    Paged,
    /// int8 with a scale per group.
    Int8,
    /// int4 with a scale per group.
    Int4,
    /// No keys: the fixed recurrent state of linear attention (`attention_kernel = "linear"` or `"favor"`).
    State,
}

impl KvKind {
    /// The store a model decodes from unless told otherwise: its recurrent state when its attention is a feature
    /// map's, one growing buffer of keys and values when it is softmax.
    pub fn for_model(config: &ModelConfig) -> Self {
        if config.attention_kernel == AttentionKernel::Softmax { KvKind::Contiguous } else { KvKind::State }
    }
}

/// A KV store and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub kind: KvKind,
    /// Tokens per page (paged).
    pub page_size: usize,
    /// Values per scale (int8, int4).
    pub group: usize,
}

impl KvSpec {
    /// Checks the parameters against a model: a paged store's page holds 1 to `block_size` tokens (a larger one
    /// would be allocated whole for nothing; other stores have no pages), a scale covers at least one value, a
    /// recurrent state needs linear attention.
    pub fn check(&self, config: &ModelConfig) -> Result<(), String> {
        let context = config.block_size;
        if self.kind == KvKind::State && config.attention_kernel == AttentionKernel::Softmax {
            return Err("--kv-cache state holds linear attention's recurrent state; this model's attention is \
                        softmax, which needs its keys (contiguous, paged, int8, int4)"
                .into());
        }
        if self.page_size == 0 || self.group == 0 {
            return Err("--page-size and --kv-group must be at least 1".into());
        }
        if self.kind == KvKind::Paged && self.page_size > context {
            return Err(format!(
                "--page-size {} is larger than the model's context of {context} tokens",
                self.page_size
            ));
        }
        Ok(())
    }
}

impl From<KvKind> for KvSpec {
    fn from(kind: KvKind) -> Self {
        Self { kind, page_size: 16, group: 32 }
    }
}

/// Tokens a contiguous store grows by.
const CHUNK: usize = 256;

impl std::str::FromStr for KvKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ember_formats::config::from_name(s)
    }
}

impl KvSpec {
    pub fn build(self) -> Option<Box<dyn KvCache>> {
        match self.kind {
            KvKind::None => None,
            KvKind::Contiguous => Some(Box::new(ContiguousCache::new(CHUNK))),
            KvKind::Paged => Some(Box::new(PagedCache::new(PagePool::new(self.page_size)))),
            KvKind::Int8 => Some(Box::new(QuantizedCache::new(Bits::Int8, self.group))),
            KvKind::Int4 => Some(Box::new(QuantizedCache::new(Bits::Int4, self.group))),
            KvKind::State => Some(Box::<StateCache>::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a paged store has pages: a model whose context is shorter than a page decodes with every other store,
    /// and a paged store is refused naming both sizes.
    #[test]
    fn the_page_size_binds_only_a_paged_store() {
        let config = ModelConfig::gpt(20, 1, 2, 8, 8);
        for kind in [KvKind::None, KvKind::Contiguous, KvKind::Int8, KvKind::Int4] {
            assert_eq!(KvSpec::from(kind).check(&config), Ok(()), "{kind:?}");
        }
        let refused = KvSpec::from(KvKind::Paged).check(&config);
        assert_eq!(refused, Err("--page-size 16 is larger than the model's context of 8 tokens".into()));
        assert_eq!(KvSpec { page_size: 8, ..KvKind::Paged.into() }.check(&config), Ok(()));
    }
}
