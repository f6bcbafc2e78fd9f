//! The durability rule, written once:
//!
//! > **A reply leaves walrus only when the journal covers everything it reveals.**
//!
//! - A *write*'s reply is held until the journal's durable replication offset reaches the
//!   offset Valkey reported right after the write's batch (the `ROLE` appended to every
//!   upstream batch that writes; see [`crate::proxy::pipeline`]).
//! - A *read*'s reply is held when, at the moment it arrives from Valkey, any key it read is
//!   *dirty*: written by a write whose batch is not durable yet. It is released once every
//!   write that was pending on those keys at that moment is durable ([`dirty`]). Reads that
//!   scan the keyspace (KEYS, SCAN, DBSIZE, RANDOMKEY, INFO keyspace, read-only scripts)
//!   wait for every pending write. Writes whose keys walrus cannot know (unknown commands,
//!   FLUSHALL, SWAPDB, every script and function, which may touch keys it does not declare)
//!   dirty every key ([`access`]).
//! - Until the replica link is attached and the journal follows Valkey's stream, writes are
//!   refused: before that, Valkey's offsets do not move (no replication backlog yet), and a
//!   write would look durable with nothing journaled.
//! - While walrus restores Valkey ([`crate::restore`]), every command that reads or writes
//!   data gets Valkey's own `-LOADING`: an empty Valkey would answer reads with data the
//!   journal contradicts.
//! - Every upstream connection belongs to one *history epoch*, the gate's count of Valkey
//!   processes and replication histories it has followed. A batch or a read reply from an
//!   older epoch is answered with an error, never released: offsets of two histories (both
//!   may start at 0) are not comparable.
//! - When the journal fails (an I/O error, an fsync error: never retried and trusted), every
//!   held reply gets an error, writes are refused with `-MISCONF`, and reads of clean keys go
//!   on. A write whose connection broke before its offset was known is never acknowledged.
//! - Executed-but-not-durable bytes are bounded (`durability.max_pending_bytes`), and so is
//!   the memory of held replies (`durability.max_held_bytes`): past either, new writes wait
//!   before they are sent to Valkey; reads keep flowing.
//!
//! Side effects are not gated: Pub/Sub messages, keyspace notifications and CLIENT TRACKING
//! invalidations are delivered as Valkey sends them, possibly before the write that caused
//! them is durable (a subscriber can see an event for a write a crash then loses). The data
//! itself, read with any command, never is.

pub mod access;
pub mod dirty;
mod gate;
mod hold;
pub mod marks;
mod queue;
mod status;
#[cfg(test)]
mod tests;

pub use access::{access, Access};
pub use gate::Durability;
pub use marks::{resolve_orphans, WriteMark};
pub use queue::Held;
pub use status::{loading, Status};
