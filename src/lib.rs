//! Rakazo library root.
