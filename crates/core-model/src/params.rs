//! Parameters by dotted path ("blocks.0.attn.c_attn.weight"): listing, reading out, and loading back.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{FloatDType, Tensor, TensorData};

use ember_formats::config::Precision;

/// A parameter's path, identity and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamInfo {
    pub path: String,
    pub id: ParamId,
    pub shape: Vec<usize>,
}

/// The dotted path of the module being visited; enum variants (`Attention::Mha`) add no segment, so a parameter's
/// path names the field it lives in ("blocks.0.attn.c_attn.weight").
#[derive(Default)]
struct Paths {
    stack: Vec<Option<String>>,
}

impl Paths {
    fn enter(&mut self, name: &str, container_type: &str) {
        self.stack.push((!container_type.starts_with("Enum:")).then(|| name.to_string()));
    }
    fn exit(&mut self) {
        self.stack.pop();
    }
    fn path(&self) -> String {
        self.stack.iter().flatten().cloned().collect::<Vec<_>>().join(".")
    }
}

struct Lister {
    paths: Paths,
    infos: Vec<ParamInfo>,
    data: Option<Vec<TensorData>>,
}

impl ModuleVisitor for Lister {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.paths.enter(name, container_type);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.paths.exit();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let tensor = param.val();
        self.infos.push(ParamInfo { path: self.paths.path(), id: param.id, shape: tensor.dims().to_vec() });
        if let Some(data) = self.data.as_mut() {
            data.push(tensor.into_data());
        }
    }
}

/// Every float parameter, in module order.
pub fn param_infos<M: Module>(module: &M) -> Vec<ParamInfo> {
    let mut lister = Lister { paths: Paths::default(), infos: Vec::new(), data: None };
    module.visit(&mut lister);
    lister.infos
}

/// Every float parameter's path and values, read back to the host.
pub fn state_dict<M: Module>(module: &M) -> Vec<(String, TensorData)> {
    let mut lister = Lister { paths: Paths::default(), infos: Vec::new(), data: Some(Vec::new()) };
    module.visit(&mut lister);
    let data = lister.data.unwrap_or_default();
    lister.infos.into_iter().map(|i| i.path).zip(data).collect()
}

/// A stored parameter set that does not fit the model.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Mismatch {
    #[error("parameter {0} is missing")]
    Missing(String),
    #[error("parameter {path} has shape {found:?}, the model needs {expected:?}")]
    Shape { path: String, expected: Vec<usize>, found: Vec<usize> },
    #[error(
        "{} stored tensor(s) are not parameters of the configured model (the config and the weights disagree): {}",
        .0.len(),
        .0.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
    )]
    Unused(Vec<String>),
}

struct Loader<'a> {
    paths: Paths,
    tensors: &'a HashMap<String, TensorData>,
    /// Parameters loaded so far.
    loaded: usize,
    error: Option<Mismatch>,
}

impl ModuleMapper for Loader<'_> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.paths.enter(name, container_type);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.paths.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let path = self.paths.path();
        let (id, tensor, mapper) = param.consume();
        let expected = tensor.dims().to_vec();
        let tensor = match self.tensors.get(&path) {
            _ if self.error.is_some() => tensor,
            None => {
                self.error = Some(Mismatch::Missing(path));
                tensor
            }
            Some(data) if data.shape().as_slice() != expected.as_slice() => {
                self.error = Some(Mismatch::Shape { path, expected, found: data.shape().to_vec() });
                tensor
            }
            Some(data) => {
                self.loaded += 1;
                let loaded = Tensor::<D>::from_data(data.clone(), &tensor.device());
                if tensor.is_require_grad() { loaded.require_grad() } else { loaded }
            }
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// The module with every parameter replaced by the stored tensor of the same path and shape; a stored tensor that
/// is no parameter of the module is an error too (a config of fewer layers than the weights, say).
pub fn load_state_dict<M: Module>(module: M, tensors: &HashMap<String, TensorData>) -> Result<M, Mismatch> {
    let mut loader = Loader { paths: Paths::default(), tensors, loaded: 0, error: None };
    let module = module.map(&mut loader);
    if let Some(e) = loader.error {
        return Err(e);
    }
    if loader.loaded < tensors.len() {
        let paths: std::collections::HashSet<String> = param_infos(&module).into_iter().map(|p| p.path).collect();
        let mut unused: Vec<String> = tensors.keys().filter(|k| !paths.contains(*k)).cloned().collect();
        unused.sort();
        return Err(Mismatch::Unused(unused));
    }
    Ok(module)
}

/// Casts every float parameter to `dtype`.
struct Caster(FloatDType);

impl ModuleMapper for Caster {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.cast(self.0), mapper)
    }
}

/// The module with every float parameter in `dtype` (f16 on a wgpu adapter with `SHADER_F16`, say). On an autodiff
/// device the cast is part of the graph: gradients reach the original parameters in their own type.
pub fn cast_params<M: Module>(module: M, dtype: FloatDType) -> M {
    module.map(&mut Caster(dtype))
}

/// Burn's float type for a precision.
pub fn float_dtype(precision: Precision) -> FloatDType {
    match precision {
        Precision::F32 => FloatDType::F32,
        Precision::F16 => FloatDType::F16,
    }
}

/// The module with its parameters in `precision` (as it is in f32, where they already are).
pub fn in_precision<M: Module>(module: M, precision: Precision) -> M {
    match precision {
        Precision::F32 => module,
        Precision::F16 => cast_params(module, FloatDType::F16),
    }
}
