//! walrus: a sidecar durability proxy for in-memory Valkey.
//!
//! Clients connect to walrus instead of Valkey. The modules, lowest layer first; a module
//! imports only from the layers above it in this list (`.ci/layers.py` checks it, and
//! `tests/it/layers.rs` runs that check):
//!
//! - [`fault`] (fault injection for tests), [`supervisor`] (systemd's notify protocol and
//!   watchdog), [`task`] (what tasks share: [`task::AbortOnDrop`], one
//!   [`task::backoff::Backoff`] for every retry) and [`units`] (sizes and durations as
//!   written in configuration): leaves that import nothing of walrus.
//! - [`resp`]: requests parsed and replies delimited, bounded and resumable.
//! - [`metrics`]: Prometheus families, registered once; the hot path touches atomics only.
//! - [`journal`]: the recycled ring of log segments that makes writes durable.
//! - [`config`]: every setting and limit, one place each.
//! - [`net`]: one stream type for TCP, Unix sockets and TLS; TLS configurations and their
//!   reloading.
//! - [`upstream`]: where Valkey is, authenticated connections to it, and the managed
//!   valkey-server child.
//! - [`valkey`]: speaking to Valkey about replication and state: the replica handshake, the
//!   RDB receiver, `ROLE` and the offset oracle, `INFO`.
//! - [`commands`]: what each command does (writes? which keys? blocking?), learned from
//!   Valkey's own command table.
//! - [`durability`]: the rule that a reply leaves only when the journal covers it, and the
//!   gate that enforces it: held replies, the dirty-key map, backpressure.
//! - [`disk`]: disk watermarks that refuse new writes before a disk fills.
//! - [`checkpoint`]: RDB checkpoints that let the ring recycle.
//! - [`datadir`]: a data directory as files: whether its parts prove what it holds, the chain
//!   of checkpoint and journal read from it, and what is done with it offline (verified,
//!   backed up, cut at a point in time, exported as an AOF) or by a running walrus's backups.
//! - [`restore`]: after any restart, Valkey loaded back from checkpoint and journal; the
//!   decision table for every attach.
//! - [`archive`]: checkpoints and the journal copied continuously to object storage, and a
//!   data directory made from it (a new node's).
//! - [`replication`] (the replica link: Valkey's stream into the journal, the durable
//!   offset into the gate) and [`proxy`] (client sessions, the shared pool, pinned
//!   connections, the accept loop).
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`, `/status`, `POST /checkpoint`,
//!   `POST /backup` and `POST /rewind`.
//! - [`daemon`]: what `walrus serve` runs: the data directory owned, walrus's tasks started
//!   in order and supervised, and stopped in order within a bound.
//! - [`cli`]: the `walrus` command: flags, printing and exit codes, calling in below.
//!
//! Errors: each layer has one type, and a layer's public functions return only it, never
//! `Result<_, String>` (`.ci/string_errors.py` checks it, `tests/it/layers.rs` runs it); private
//! helpers may build a message that the public function wraps. [`fault::FaultError`],
//! [`units::UnitsError`], [`resp::ParseError`] (with [`resp::ScanError`]), [`journal::JournalError`] (with the record
//! decoder's [`journal::format::HeaderError`] and [`journal::format::DecodeError`]),
//! [`config::ConfigError`], [`net::tls::TlsError`], [`upstream::client::UpstreamError`] (for
//! [`valkey`] and [`commands`] too: both speak to Valkey), [`durability::Refusal`] (what a
//! refused or failed reply says, rendered to RESP in one place), [`disk::DiskError`],
//! [`checkpoint::CheckpointError`] (with [`checkpoint::store::StoreError`]),
//! [`datadir::DataDirError`] (with [`datadir::chain::ChainError`] and
//! [`datadir::verify::VerifyError`]), [`restore::RestoreError`] (with
//! [`restore::primary::LoadError`]), [`archive::ArchiveError`],
//! [`replication::link::LinkError`]; the proxy's error is the RESP error reply itself (a
//! request no connection can take: [`proxy::pool::Unavailable`]); [`daemon::Fatal`] carries
//! any of them up, and [`cli`] (whose functions return it too) prints whatever reaches it and
//! exits non-zero.
//!
//! One `SET k v`, from client to reply (docs/data-flow.md walks it with file names):
//! 1. [`proxy::server`] accepts the client; its [`proxy::session`] parses the request
//!    ([`resp`]) and classifies it ([`commands`]): a write of key `k`.
//! 2. The session asks the gate for room and marks `k` dirty
//!    ([`durability::Durability::write_room`], `begin_write`), then hands the request to a
//!    pooled connection ([`proxy::pool`], [`proxy::pipeline`]), which sends `SET` and a
//!    `ROLE` behind it in one batch.
//! 3. Valkey runs the SET; the `ROLE` reply gives its replication offset right after it.
//!    The pipeline hands `+OK` to the gate with that offset (`settle_batch`): held.
//! 4. Valkey streams the SET to its replica, walrus's link ([`replication::link`]), which
//!    cuts the stream into entries ([`replication::stream`]) and appends them to the
//!    [`journal`]: one group-committed, synced write.
//! 5. The journal's durable position moves; the link's follower hands it to the gate
//!    (`set_durable`), which releases `+OK` and clears `k`'s mark. The session writes the
//!    reply to the client.

pub mod archive;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod datadir;
pub mod disk;
pub mod durability;
pub mod fault;
pub mod http;
pub mod journal;
pub mod metrics;
pub mod net;
pub mod proxy;
pub mod replication;
pub mod resp;
pub mod restore;
pub mod supervisor;
pub mod task;
pub mod units;
pub mod upstream;
pub mod valkey;
