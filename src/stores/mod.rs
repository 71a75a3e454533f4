//! `HomeStore` adapters and the pieces they share: workspace archives, sealing, atomic files.

pub mod archive;
pub mod local;
pub mod seal;
