//! Where a model's parameters come from while it is built: Ember's own generator, so the same seed gives the same
//! weights on every device, or stored tensors by name.

use std::collections::{HashMap, HashSet};

use burn::module::{Param, ParamId};
use burn::tensor::{Device, Tensor, TensorData};
use ember_formats::packed::Packed;

use crate::params::Mismatch;
use ember_formats::Rng;

/// The parameters of a module under construction, each drawn or read at its dotted path
/// ("blocks.0.attn.c_attn.weight", as [`crate::params::state_dict`] names it).
pub struct Init<'a> {
    source: Source<'a>,
    device: Device,
    path: Vec<String>,
    /// The stored tensors read so far.
    read: HashSet<String>,
    error: Option<Mismatch>,
}

/// A model made from its config by one `build` that asks an [`Init`] for each parameter: drawn fresh, or read from
/// stored tensors (some kept in ggml blocks).
pub trait Build: Sized {
    type Config;

    fn build(config: &Self::Config, init: &mut Init) -> Self;

    /// The model of `config` initialised from `rng` on `device`.
    fn new(config: &Self::Config, rng: &mut Rng, device: &Device) -> Self {
        Self::build(config, &mut Init::draw(rng, device))
    }

    /// The model of `config` with the parameters of `tensors` (by path, as [`crate::params::state_dict`] names
    /// them) on `device`; a missing, misshapen or unused tensor is the error.
    fn load(config: &Self::Config, tensors: &HashMap<String, TensorData>, device: &Device) -> Result<Self, Mismatch> {
        Init::load(tensors, device, |init| Self::build(config, init))
    }

    /// [`Build::load`] with the matrices of `packed` kept in their ggml blocks where the model takes them so.
    fn load_packed(
        config: &Self::Config,
        tensors: &HashMap<String, TensorData>,
        packed: &HashMap<String, Packed>,
        device: &Device,
    ) -> Result<Self, Mismatch> {
        Init::load_packed(tensors, packed, device, |init| Self::build(config, init))
    }
}

enum Source<'a> {
    Draw(&'a mut Rng),
    /// Dense tensors, and matrices kept in ggml blocks.
    Read(&'a HashMap<String, TensorData>, &'a HashMap<String, Packed>),
}

impl<'a> Init<'a> {
    /// Parameters drawn from `rng` in construction order, on `device`.
    pub fn draw(rng: &'a mut Rng, device: &Device) -> Self {
        Self { source: Source::Draw(rng), device: device.clone(), path: Vec::new(), read: HashSet::new(), error: None }
    }

    /// The module `build` makes with its parameters read from `tensors` by path, on `device`; the first parameter
    /// missing or misshapen is the error, and so are stored tensors the module has no parameter for (a config of
    /// fewer layers than the weights loads no smaller model).
    pub fn load<M>(
        tensors: &'a HashMap<String, TensorData>,
        device: &Device,
        build: impl FnOnce(&mut Self) -> M,
    ) -> Result<M, Mismatch> {
        static NONE: std::sync::LazyLock<HashMap<String, Packed>> = std::sync::LazyLock::new(HashMap::new);
        Self::load_packed(tensors, &NONE, device, build)
    }

    /// [`Init::load`] with some matrices in ggml blocks: the module takes them as they are where it asks for a
    /// packed matrix ([`Init::packed`]).
    pub fn load_packed<M>(
        tensors: &'a HashMap<String, TensorData>,
        packed: &'a HashMap<String, Packed>,
        device: &Device,
        build: impl FnOnce(&mut Self) -> M,
    ) -> Result<M, Mismatch> {
        let mut init = Self {
            source: Source::Read(tensors, packed),
            device: device.clone(),
            path: Vec::new(),
            read: HashSet::new(),
            error: None,
        };
        let module = build(&mut init);
        if let Some(e) = init.error {
            return Err(e);
        }
        let stored = tensors.keys().chain(packed.keys());
        let mut unused: Vec<String> = stored.filter(|k| !init.read.contains(*k)).cloned().collect();
        if !unused.is_empty() {
            unused.sort();
            return Err(Mismatch::Unused(unused));
        }
        Ok(module)
    }

    /// `build` run with the same source inside the sub-module `name`: its parameters' paths are prefixed with it.
    pub fn scope<T>(&mut self, name: impl Into<String>, build: impl FnOnce(&mut Self) -> T) -> T {
        self.path.push(name.into());
        let built = build(self);
        self.path.pop();
        built
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The stored packed matrix at `name` in the current scope, [rows, cols] = `shape`; None when there is none (a
    /// drawn model, or a dense weight), or after a mismatch.
    pub fn packed(&mut self, name: &str, shape: [usize; 2]) -> Option<Packed> {
        let Source::Read(_, packed) = self.source else { return None };
        let path = self.path_of(name);
        let w = packed.get(&path)?;
        if self.error.is_some() {
            return None;
        }
        if [w.rows(), w.cols] != shape {
            self.error = Some(Mismatch::Shape { path, expected: shape.to_vec(), found: vec![w.rows(), w.cols] });
            return None;
        }
        self.read.insert(path);
        Some(w.clone())
    }

    /// `name`'s dotted path in the current scope.
    fn path_of(&self, name: &str) -> String {
        self.path.iter().map(String::as_str).chain([name]).collect::<Vec<_>>().join(".")
    }

    /// A seed for what a layer draws outside its parameters (FAVOR+'s projections): FNV-1a of the scope's path, so
    /// the same layer of the same model draws the same values whether built afresh or loaded.
    pub fn scope_seed(&self) -> u64 {
        self.path.join(".").bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    }

    /// A parameter drawn from N(0, std²), or the stored tensor at `name`.
    pub fn normal<const D: usize>(&mut self, name: &str, shape: [usize; D], std: f64) -> Param<Tensor<D>> {
        match self.source {
            Source::Draw(ref mut rng) => {
                let n = shape.iter().product();
                let values: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
                Param::from_data(TensorData::new(values, shape), &self.device)
            }
            Source::Read(tensors, _) => self.stored(tensors, name, shape),
        }
    }

    /// A parameter filled with `value` (zeros for biases, ones for norm gains), or the stored tensor at `name`.
    pub fn constant<const D: usize>(&mut self, name: &str, shape: [usize; D], value: f32) -> Param<Tensor<D>> {
        match self.source {
            Source::Draw(_) => {
                Param::from_data(TensorData::new(vec![value; shape.iter().product()], shape), &self.device)
            }
            Source::Read(tensors, _) => self.stored(tensors, name, shape),
        }
    }

    /// The tensor at `name` in the current scope; after a mismatch, a parameter that is never materialised.
    fn stored<const D: usize>(
        &mut self,
        tensors: &HashMap<String, TensorData>,
        name: &str,
        shape: [usize; D],
    ) -> Param<Tensor<D>> {
        let path = self.path_of(name);
        if self.error.is_none() {
            match tensors.get(&path) {
                Some(data) if data.shape().as_slice() == shape.as_slice() => {
                    self.read.insert(path);
                    return Param::from_data(data.clone(), &self.device);
                }
                Some(data) => {
                    self.error = Some(Mismatch::Shape { path, expected: shape.to_vec(), found: data.shape().to_vec() })
                }
                None => self.error = Some(Mismatch::Missing(path)),
            }
        }
        Param::uninitialized(
            ParamId::new(),
            move |device, _| Tensor::zeros(shape, device),
            self.device.clone(),
            false,
            shape.into(),
        )
    }
}
