//! Offline emulators of the remote vendors: each serves the vendor's wire protocol on
//! loopback (`rakazo emulator <vendor> --listen ADDR`) with real machines, containers of the
//! computer image through the supervisor, behind its sandboxes.
//!
//! - [`machines`]: what an emulator needs of a machine, and its supervisor implementation.
//! - [`daytona`]: the daytona-emulator (API and toolbox).
//! - [`boat`]: the box-emulator (Box, also called Boat).

pub mod boat;
pub mod daytona;
pub mod machines;
