//! Local stand-ins for the vendors' services, for tests and trials without an account or a
//! cluster: each speaks its vendor's wire protocol closely enough for the vendor's own client.

pub mod kubernetes;
