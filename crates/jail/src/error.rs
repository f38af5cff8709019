//! Errors of the process tier.

/// Placeholder until the sandbox module lands.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("placeholder")]
    Placeholder,
}
