//! KV stores behind core-model's [`KvCache`](ember_core_model::cache::KvCache) seam: contiguous, paged with shared
//! prefixes, int8 / int4 quantized, and the fixed recurrent state of linear attention. MLA models cache their latent
//! and shared rope key through any of the key stores.

pub mod contiguous;
pub mod paged;
pub mod quantized;
pub mod spec;
pub mod state;

pub use contiguous::ContiguousCache;
pub use paged::{PagePool, PagedCache};
pub use quantized::{Bits, QuantizedCache, dequantize, quantize};
pub use state::StateCache;
