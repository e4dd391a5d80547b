//! The validation error every config section shares: the key, the value and the rule it breaks.

use std::fmt::Display;

/// A config value outside what is allowed: names the key, the value and the rule.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{key} = {value}: {allowed}")]
pub struct Invalid {
    pub key: String,
    pub value: String,
    pub allowed: String,
}

/// `Ok` when `ok`, else an [`Invalid`] for `key = value` that says what is `allowed`.
pub fn require(ok: bool, key: &str, value: impl Display, allowed: impl Into<String>) -> Result<(), Invalid> {
    if ok { Ok(()) } else { Err(Invalid { key: key.into(), value: value.to_string(), allowed: allowed.into() }) }
}
