//! KV stores behind core-model's [`KvCache`](ember_core_model::cache::KvCache) seam.

pub mod contiguous;

pub use contiguous::ContiguousCache;
