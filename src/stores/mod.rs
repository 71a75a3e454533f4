//! `HomeStore` adapters and the pieces they share: workspace archives, sealing, atomic files,
//! the bucket client, the deployment's root in it and the reconciler of orphaned stored
//! revisions.

pub mod archive;
pub mod bucket;
pub mod chunks;
pub mod deployment;
pub mod doctor;
pub mod durable;
pub mod local;
pub mod object;
pub mod reconciler;
pub mod seal;
pub mod stream;
