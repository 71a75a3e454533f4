//! Rakazo's actor runtime and domain rules.
//!
//! A tour of the crate:
//! - [`provider`] and [`home_store`]: the ports every backend and store implements.
//! - [`entity`]: the database rows (sea-orm); the schema is in the migrations crate.
//! - [`leases`], [`runs`], [`computers`]: the domain rules, decided at the database; [`awake`]:
//!   what holds a computer up against its idle timer.
//! - [`computer`], [`screen`], [`lease_actor`], [`checkpoint`]: the actors, one mailbox each.
//! - [`registry`]: the live actors of this process, by computer id; [`reconciler`]: adopts
//!   what no actor of this process holds and closes what nobody saw end.
//! - [`events`]: the in-process bus that feeds live subscriptions; [`timeline`]: each
//!   computer's attributed, hash-chained record of who did what.
//! - [`conformance`]: the generic test suite every provider must pass.
//!
//! Architecture invariant: nothing here knows Docker, a vendor API or HTTP.

#![forbid(unsafe_code)]

pub mod activity;
pub mod agent_sessions;
pub mod awake;
pub mod checkpoint;
pub mod clock;
pub mod computer;
pub mod computer_mode;
pub mod computers;
pub mod conformance;
pub mod crash_point;
pub mod entity;
pub mod error;
pub mod events;
pub mod home_store;
pub mod keys;
pub mod lease_actor;
pub mod leases;
pub mod maintenance;
pub mod maintenance_job;
pub mod owners;
pub mod processes;
pub mod provider;
pub mod reconciler;
pub mod registry;
pub mod run_checks;
pub mod run_reports;
pub mod runs;
pub mod runtime;
pub mod screen;
pub mod slots;
pub mod timeline;
pub mod workspace;
pub mod workspace_stream;

pub use error::{DomainError, DomainResult, ErrorCode};
