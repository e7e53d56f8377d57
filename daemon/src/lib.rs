//! tt-servingd, the tt-serving daemon, and ttctl, its operator tool.
//!
//! Layout:
//! - [`config`]: the TOML file, parsed strictly and validated as a whole.
pub mod config;
