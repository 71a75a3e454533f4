//! Rakazo's actor runtime and domain rules.
//!
//! A tour of the crate:
//! - [`provider`] and [`home_store`]: the ports every backend and store implements.
//! - [`entity`]: the database rows (sea-orm); the schema is in the migrations crate.
//! - [`leases`]: fenced lease grants, decided at the database by compare-and-set.
//! - [`computer`], [`screen`], [`lease_actor`], [`checkpoint`]: the actors, one mailbox each.
//! - [`registry`]: the live actors of this process, by computer id.
//! - [`events`]: the in-process bus that feeds live subscriptions.
//! - [`conformance`]: the generic test suite every provider must pass.
//!
//! Architecture invariant: nothing here knows Docker, a vendor API or HTTP.

#![forbid(unsafe_code)]

pub mod clock;
pub mod entity;
pub mod error;
pub mod provider;

pub use error::{DomainError, DomainResult, ErrorCode};
