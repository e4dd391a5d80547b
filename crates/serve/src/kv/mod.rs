//! KV stores behind core-model's [`KvCache`](ember_core_model::cache::KvCache) seam: contiguous, paged with shared
//! prefixes, and int8 / int4 quantized. MLA models cache their latent and shared rope key through any of them.

pub mod contiguous;
pub mod paged;
pub mod quantized;

pub use contiguous::ContiguousCache;
pub use paged::{PagePool, PagedCache};
pub use quantized::{Bits, QuantizedCache, dequantize, quantize};
