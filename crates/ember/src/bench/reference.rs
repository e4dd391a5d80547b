//! The Python reference scripts that `ember bench` runs beside Ember on the same machine (PyTorch, transformers): the
//! file given with `--script`, else the copy built into the binary, so an installed `ember` needs no source tree.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A reference script: its name and its text as built into the binary.
pub struct Reference {
    pub name: &'static str,
    pub text: &'static str,
}

/// The PyTorch nanoGPT-style trainer that `bench train --pytorch` times.
pub const GPT_TRAIN: Reference =
    Reference { name: "gpt_train.py", text: include_str!("../../../../scripts/reference/gpt_train.py") };

/// The transformers `generate` timing that `bench decode --transformers` runs.
pub const HF_GENERATE: Reference =
    Reference { name: "hf_generate.py", text: include_str!("../../../../scripts/reference/hf_generate.py") };

/// A script ready to run: the given file, or the built-in copy in a temporary file that lives as long as this.
pub struct Script {
    path: PathBuf,
    _temporary: Option<tempfile::TempPath>,
}

impl Script {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Reference {
    /// `given` when set (an edited copy, say), else this script's built-in text written to a temporary file.
    pub fn script(&self, given: Option<&Path>) -> Result<Script> {
        if let Some(path) = given {
            return Ok(Script { path: path.to_path_buf(), _temporary: None });
        }
        let mut file = tempfile::Builder::new()
            .prefix("ember-")
            .suffix(&format!("-{}", self.name))
            .tempfile()
            .context("creating a temporary file for the reference script")?;
        file.write_all(self.text.as_bytes()).with_context(|| format!("writing {}", self.name))?;
        let path = file.into_temp_path();
        Ok(Script { path: path.to_path_buf(), _temporary: Some(path) })
    }
}
