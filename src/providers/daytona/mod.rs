//! The `daytona` provider: the adapter of the shared remote provider ([`adapter`]), the API and
//! toolbox client ([`client`]), their JSON ([`wire`]) and the toolbox's multipart bodies
//! ([`multipart`]).

pub mod adapter;
pub mod client;
pub mod multipart;
pub mod wire;
