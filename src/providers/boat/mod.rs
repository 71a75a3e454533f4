//! The `box` provider (Box, also called Boat): the adapter of the shared remote provider
//! ([`adapter`]), the API client ([`client`]) and its JSON ([`wire`]).

pub mod adapter;
pub mod client;
pub mod wire;
