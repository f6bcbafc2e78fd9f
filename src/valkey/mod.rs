//! Speaking to Valkey about replication and state, below everything that decides what to
//! do with it.
//!
//! - [`handshake`]: PING, AUTH, REPLCONF, PSYNC: full or partial resynchronization, as a
//!   replica of the running Valkey version does.
//! - [`process`]: which Valkey process answers, watched for another one.
//! - [`rdb`]: receiving the RDB of a full resynchronization, in both transfer forms.
//! - [`role`]: Valkey's replication offset from `ROLE`, on a client's connection or
//!   walrus's own ([`role::OffsetOracle`]).
//! - [`view`]: what `INFO` says about a Valkey ([`view::ValkeyView`]).
//!
//! Nothing here imports anything above `upstream`, `resp` and `config`.

pub mod handshake;
pub mod process;
pub mod rdb;
pub mod role;
pub mod view;
