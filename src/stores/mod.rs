//! `HomeStore` adapters.

pub mod local;
