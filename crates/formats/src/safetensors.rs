//! safetensors files read as f32.

use std::collections::HashMap;

pub use safetensors::Dtype;

use crate::ggml::f16;

/// One tensor of a safetensors file, converted to f32.
pub struct Tensor {
    pub name: String,
    /// The dtype the file stores it in.
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Every tensor of a safetensors file's bytes as f32 (F32, F16 and BF16 are converted) and the header's metadata. A
/// tensor of another dtype is an error naming it, unless `skip` accepts its name: such tensors are left out.
pub fn read(bytes: &[u8], skip: impl Fn(&str) -> bool) -> Result<(Vec<Tensor>, HashMap<String, String>), String> {
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
    let file = safetensors::SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let mut tensors = Vec::new();
    for (name, view) in file.tensors() {
        let raw = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            Dtype::F16 => raw.chunks_exact(2).map(|b| f16(u16::from_le_bytes([b[0], b[1]]))).collect(),
            Dtype::BF16 => {
                raw.chunks_exact(2).map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)).collect()
            }
            _ if skip(&name) => continue,
            other => return Err(format!("tensor {name} is {other:?}; Ember reads F32, F16 and BF16 tensors")),
        };
        tensors.push(Tensor { dtype: view.dtype(), shape: view.shape().to_vec(), values, name });
    }
    Ok((tensors, header.metadata().clone().unwrap_or_default()))
}
