//! walrus: a sidecar durability proxy for in-memory Valkey.
pub mod cli;
pub mod config;
pub mod journal;
