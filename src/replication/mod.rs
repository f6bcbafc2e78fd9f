//! walrus as a replica of its Valkey.
//!
//! walrus does not re-derive what a write did: it attaches to Valkey as a replica and
//! receives Valkey's own replication stream, the deterministic effects Valkey also writes to
//! its AOF (PEXPIREAT for EXPIRE, SREM for SPOP, script effects wrapped in MULTI/EXEC,
//! SELECT). Offsets in that stream are Valkey's replication offsets, byte for byte, which is
//! what lets a client's reply be matched to the journal entry that covers it.
//!
//! - [`link`]: the replica link: attach (handshake and full or partial resync, through
//!   [`crate::valkey`]), pump the stream into the journal, acknowledge the durable offset.
//! - [`ack`]: `REPLCONF ACK` and `FACK`: what walrus tells Valkey it received and made durable;
//!   the received offset, checked to continue the stream at every entry.
//! - [`follow`]: the journal's durable position, followed into the durability gate.
//! - [`stream`]: cutting the command stream into journal entries on command boundaries.
//! - [`error`]: [`LinkError`](error::LinkError), why an attachment ended.

pub mod ack;
pub mod error;
pub mod follow;
pub mod link;
pub mod stream;
