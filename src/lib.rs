//! walrus: a sidecar durability proxy for in-memory Valkey.
//!
//! Clients connect to walrus instead of Valkey. Reading the modules in this order tells the
//! whole story:
//!
//! - [`config`]: every setting and limit, one place each.
//! - [`resp`]: requests parsed and replies delimited, bounded and resumable.
//! - [`commands`]: what each command does (writes? which keys? blocking?), learned from
//!   Valkey's own command table.
//! - [`upstream`]: where Valkey is, authenticated connections to it, and the managed
//!   valkey-server child.
//! - [`proxy`]: client sessions, the shared upstream pool, pinned connections for stateful
//!   sessions, the accept loop and graceful shutdown.
//! - [`replication`]: walrus as Valkey's replica: the handshake, RDB capture, and the link
//!   that cuts Valkey's replication stream into journal entries.
//! - [`journal`]: the recycled ring of log segments that makes writes durable.
//! - [`durability`]: the rule that a reply leaves only when the journal covers it: held
//!   replies, the dirty-key map, backpressure.
//! - [`checkpoint`]: RDB checkpoints that let the journal ring recycle, and the manifest
//!   that names the current one.
//! - [`restore`]: after any restart, Valkey is loaded back from the checkpoint and the
//!   journal; the decision table for every attach.
//! - [`metrics`]: Prometheus counters and the HTTP endpoint.
//! - [`cli`]: the `walrus` command.

pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod config;
pub mod disk;
pub mod durability;
pub mod fault;
pub mod http;
pub mod journal;
pub mod metrics;
pub mod proxy;
pub mod replication;
pub mod resp;
pub mod restore;
pub mod supervisor;
pub mod upstream;
pub mod valkey;
