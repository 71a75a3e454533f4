//! Rakazo library root.
pub mod desktop;
