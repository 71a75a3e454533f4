//! The `box` provider's vendor side (Box, also called Boat): the API client ([`client`]) and
//! its JSON ([`wire`]).

pub mod client;
pub mod wire;
pub mod adapter;
