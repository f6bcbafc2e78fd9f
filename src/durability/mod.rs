//! The durability rule, written once (docs/design.md and docs/data-flow.md point here):
//!
//! > **A reply leaves walrus only when the journal covers everything it reveals.**
//!
//! - Every upstream batch that writes ends with `ROLE`, whose reply (Valkey's replication
//!   offset after the batch) walrus strips; the batch's write replies are released once the
//!   journal's durable offset reaches it. `ROLE` never goes inside MULTI/EXEC (the transaction's
//!   replies wait for the `ROLE` after EXEC), nor between a command whose effect Valkey keeps
//!   for the next command only (ASKING, CLIENT CACHING) and that command: it goes before it
//!   (`compat::client_caching_yes_after_a_write_has_the_next_read_tracked`). For users whose
//!   ACL forbids `ROLE`, walrus asks on its own control connection instead. A command walrus refuses while a transaction queues
//!   (too large for the journal, `-MISCONF`, `-LOADING`) aborts it as Valkey's own queue-time
//!   errors do: EXEC answers `-EXECABORT` and nothing runs.
//! - Reads are held while any key they read is *dirty* (written, not yet durable) when their
//!   reply arrives, until those writes are durable; keyspace-wide reads (KEYS, SCAN, DBSIZE,
//!   RANDOMKEY, INFO with its keyspace section, SLOWLOG GET, COMMANDLOG GET, MEMORY STATS,
//!   FUNCTION DUMP/LIST/STATS, DEBUG, read-only scripts) wait for every pending write, and so
//!   do the commands that count or size the writes Valkey ran (INFO's sections but server,
//!   clients, cpu, modules and cluster; ROLE's replication offset; CLIENT LIST and CLIENT
//!   INFO; MEMORY MALLOC-STATS and DOCTOR; LATENCY HISTOGRAM): a crash can still lose what
//!   they count. So does every other command without key arguments, unless it is known to
//!   show nothing of the data (connection and transaction control, CONFIG, the rest of CLIENT,
//!   COMMAND, ACL, the rest of LATENCY, SCRIPT KILL and FUNCTION KILL, Pub/Sub, the cluster's
//!   topology: the list in `src/durability/access.rs`): a command a newer Valkey adds waits
//!   rather than leaks. Reads of clean keys are never delayed.
//! - A blocking write (BLPOP, BLMOVE, XREADGROUP ... BLOCK) has written nothing while it waits:
//!   it holds up no other client's read. A read that may see what one wrote once served (its
//!   keys, or the whole keyspace) is held until the journal covers Valkey's offset after the
//!   read ran: the `ROLE` after it in its own batch (or, for a blocking write sent after the
//!   read, one asked on walrus's own connection when the reply arrives). The served command's
//!   own reply waits for the offset after it, as every write's does.
//! - Scripts and functions (EVAL, EVALSHA, FCALL and their `_RO` forms) may touch keys they do
//!   not declare, in any database, so they count as touching every key: a script's write makes
//!   every read wait for it, and a read-only script waits for every pending write.
//! - A write's dirty mark is cleared only once the journal covers Valkey's offset after it, or
//!   when the write provably never ran. When a connection breaks, the replies that had arrived
//!   are real outcomes: they settle at Valkey's offset asked afterwards of the same Valkey
//!   process, as do the marks of writes still owed. When that offset cannot be learned (at
//!   once: Valkey busy or unreachable), the replies get an error, the keys stay dirty and
//!   walrus keeps asking, with backoff; reads held behind such a write get an error. A
//!   connection walrus gives up itself (none within `upstream.reply_timeout_ms`, a push over
//!   its limit) may still hold commands Valkey has yet to run: the offset that settles its
//!   writes is learned only once Valkey has closed it (`CLIENT KILL`, asked again while Valkey
//!   cannot answer; a busy Valkey closes it once its script ends).
//! - A write request larger than the journal takes in one entry (`journal.max_entry_bytes`:
//!   576 MiB, so that the largest value a client may send fits, or on a smaller ring the largest
//!   entry it holds) is refused before it reaches
//!   Valkey; a transaction or script whose effects are larger makes the replica link take a full
//!   resync, whose RDB covers them. No single client can stop the journal.
//! - With `durability.ack = "archive"`, "the journal" above means the journal and the
//!   archive ([`crate::archive`]): a reply waits until the archive holds what it reveals too,
//!   so the loss of the node loses nothing acknowledged
//!   (`archive::with_ack_archive_every_acknowledged_write_survives_the_loss_of_the_node`). With
//!   `archive.enforce_max_lag`, writes are refused with `-MISCONF` while the archive is more
//!   than `archive.max_lag_ms` behind the journal
//!   (`archive::a_store_that_hangs_is_reported_and_with_enforce_max_lag_refuses_writes`).
//! - Until the replica link is attached, writes are refused with `-MISCONF` (before that,
//!   Valkey's offsets do not move and a write would look durable with nothing journaled). If the
//!   journal fails (an I/O or fsync error, never retried), held replies get an error, writes get
//!   `-MISCONF`, and reads of clean keys go on.
//! - While walrus restores Valkey ([`crate::restore`]), every command that reads or writes
//!   data gets Valkey's own `-LOADING`: an empty Valkey would answer reads with data the
//!   journal contradicts.
//! - Every upstream connection belongs to one *history epoch*, the gate's count of Valkey
//!   processes and replication histories it has followed. A batch or a read reply from an
//!   older epoch is answered with an error, never released: offsets of two histories (both
//!   may start at 0) are not comparable. A write whose connection broke before its offset
//!   was known is never acknowledged.
//! - Backpressure: `durability.max_pending_bytes` bounds what Valkey has executed beyond the
//!   journal, `durability.max_held_bytes` the memory of held replies (reads included); past
//!   either, new writes wait before they reach Valkey.
//! - Every wait is bounded (`durability.max_hold_ms`, 30 s): a reply the journal has not
//!   covered by then (a journal device that stopped answering, a Valkey unreachable after it
//!   answered) gets `-ERR walrus: this write was not journaled within 30000 ms
//!   (durability.max_hold_ms); it may or may not have taken effect`, a read held that long a
//!   similar error, and a write that found no room `-MISCONF`. The write's keys stay dirty:
//!   what it wrote shows only once it is durable
//!   (`durability_rules::a_reply_held_past_max_hold_gets_an_error_and_the_key_waits_for_the_journal`).
//! - Keyspace notifications and CLIENT TRACKING invalidations report writes, so they are held
//!   like data ([`notices`]): each reaches its client only once the journal covers the write
//!   it reports, as a read of its keys would, in RESP2 and RESP3, on keyspace and keyevent
//!   channels, through patterns, for tracking by key or by prefix and redirected
//!   (`side_channels`). A tracking invalidation names keys but not their database: it waits
//!   for those keys in every database. One that names no key walrus can map (a flush's, a
//!   notification it cannot read) waits for every pending write. A client's other messages
//!   keep Valkey's order behind a held one, within `proxy.max_push_bytes`. One that cannot be
//!   released within `durability.max_hold_ms`, or whose write Valkey may have lost (it
//!   restarted before the journal covered it, or the journal failed), is never delivered: its
//!   client gets the reason and is closed, since a subscriber or a client-side cache that
//!   silently missed it would go on with stale data
//!   (`side_channels::a_notification_held_past_max_hold_closes_its_subscriber_with_the_reason`).
//!   What no client of walrus marked dirty is not held: Valkey's own expirations (their
//!   PEXPIREAT is journaled, so a restore expires the key again) and, in external mode, writes
//!   of clients that go around walrus, whose replies walrus never held either.
//! - Messages sent with PUBLISH are not data (what clients tell each other, not what they
//!   read) and pass as they come, behind any held notice. A restore replays data, never
//!   messages: the journal holds every PUBLISH (Valkey propagates them to its replicas), and a
//!   restore turns each into newlines of the same length (a primary may send those; the
//!   offsets keep their meaning), so no subscriber gets a message published before a crash
//!   (`restore::a_restore_replays_no_published_message`). `export-aof` leaves them out.
//!   Keyspace notifications are another matter: replaying data fires them, for whoever
//!   subscribed to the Valkey being restored. No client of walrus can be subscribed then (its
//!   connections wait for the restore); a client connected to Valkey around walrus can.
//! - MONITOR shows every command with its arguments as Valkey runs it, before the journal
//!   holds it: it is refused, naming `proxy.allow_monitor`, which relays it unheld.
//! - What Valkey does not replicate is not journaled, so a restore does not bring it back:
//!   CONFIG SET, ACL SETUSER, SCRIPT LOAD, CLIENT state. It is configuration, not data: give a
//!   managed Valkey its settings in `upstream.extra_args` (an `aclfile` among them), and load
//!   scripts with FUNCTION LOAD, which is replicated and journaled (or retry on `-NOSCRIPT`, as
//!   clients of any Valkey must). Data a script writes after `server.set_repl` turned its
//!   replication off would be unreplicated too: walrus refuses every script and function
//!   library that may call it, whatever the spelling (EVAL, EVAL_RO, SCRIPT LOAD, FUNCTION
//!   LOAD, alone or in a transaction; the rule is in `src/proxy/admin/script.rs`), and SCRIPT
//!   DEBUG YES/SYNC, whose debugger runs code typed into it
//!   (`admin::no_script_keeps_a_write_from_the_journal`); a script for an engine other than
//!   Lua (a module's) is refused, being unreadable to walrus. Not covered: scripts and
//!   libraries put into Valkey around walrus, or with `proxy.allow_admin_commands` on, which
//!   EVALSHA and FCALL run as they are.
//! - SYNC, PSYNC and REPLCONF from clients are refused: the replication stream shows every write
//!   before it is durable. Attach replicas to Valkey itself.
//! - `WAIT` counts walrus once it has received a write and `WAITAOF 0 1` once the write is on
//!   walrus's disk: the replica link reports `REPLCONF ACK <received> FACK <durable>`.
//! - CLIENT REPLY OFF/SKIP is refused (walrus must pair every reply with its request).

pub mod access;
pub mod dirty;
mod gate;
mod hold;
pub mod marks;
pub mod notices;
mod orphans;
mod output;
mod queue;
mod state;
mod status;
#[cfg(test)]
mod tests;

pub use access::{access, Access};
pub use gate::Durability;
pub use marks::WriteMark;
pub use orphans::resolve_orphans;
pub use output::{reply_channel, ClientOutput, ReplyTx};
pub use queue::Held;
pub use status::{LinkState, Refusal};
