//! walrus as a replica of its Valkey.
//!
//! walrus does not re-derive what a write did: it attaches to Valkey as a replica and
//! receives Valkey's own replication stream, the deterministic effects Valkey also writes to
//! its AOF (PEXPIREAT for EXPIRE, SREM for SPOP, script effects wrapped in MULTI/EXEC,
//! SELECT). Offsets in that stream are Valkey's replication offsets, byte for byte, which is
//! what lets a client's reply be matched to the journal entry that covers it.
//!
//! - [`handshake`]: PING, AUTH, REPLCONF, PSYNC: full or partial resynchronization.
//! - [`rdb`]: receiving the RDB of a full resynchronization, in both transfer forms.
//! - [`stream`]: cutting the command stream into journal entries on command boundaries.

pub mod handshake;
pub mod link;
pub mod rdb;
pub mod stream;
