//! walrus as Valkey's primary, for the length of a restore.
//!
//! Valkey loads data fastest the way a replica does: walrus listens on a loopback port,
//! tells Valkey `REPLICAOF 127.0.0.1 <port>`, answers its handshake (PING, AUTH with a
//! one-time password that keeps every other local process out, REPLCONF, PSYNC:
//! [`super::listener`]) as a primary would, and sends `+FULLRESYNC <checkpoint id> <checkpoint offset>`, the
//! checkpoint's RDB as `$<len>` and then the journal's stream after it, byte for byte. A
//! `REPLCONF GETACK *` at the end makes Valkey report its offset; once it reaches the
//! journal's end, walrus sends `REPLICAOF NO ONE`. Valkey keeps the checkpoint's id as its
//! previous id (`replid2`), so the replica link continues with `PSYNC <id> <end+1>` and a
//! partial resynchronization: nothing is loaded twice.
//!
//! The load is timed in two phases, for the rates a checkpoint plans with
//! ([`crate::checkpoint::rates`]): Valkey acknowledges nothing while it loads the RDB (it
//! creates its primary client only once the load is done, and from Valkey 8.0 sends a
//! `REPLCONF ACK` of the checkpoint's offset at once; older servers at their next
//! once-a-second replication cron). So the first acknowledgement at or past the checkpoint's
//! offset ends the RDB phase (at most a second late, which makes that rate look slower,
//! never faster), and the journal phase is the stream after the offset it acknowledged.
//!
//! If anything fails before `REPLICAOF NO ONE`, Valkey stays a replica of a primary that is
//! gone: it refuses writes and the next attempt starts over (the decision table treats a
//! replica of walrus's history as one to restore).
//!
//! Nothing waits for a Valkey that is gone: the load is for one process (its `run_id`), and
//! ends at once when another one answers at Valkey's address (the managed child died and the
//! supervisor started the next, or an external Valkey restarted;
//! [`crate::valkey::process::replaced`]), before its connection to walrus is through as much
//! as after; the replica link then decides again, and restores the new one. A Valkey that
//! is there but stops (stopped, partitioned) ends it after `restore.timeout_ms` without a
//! sign of progress: a connection, an acknowledgement, a piece of the stream it takes.

use super::listener::{accept_replica, read_command, OneTimeAuth, Replica};
use super::Progress;
use crate::checkpoint::manifest::Checkpoint;
use crate::checkpoint::store::Store;
use crate::datadir::backup::copy::Read;
use crate::datadir::chain::{self, ChainEnd, ChainError};
use crate::datadir::messages;
use crate::datadir::pitr::{through, Point};
use crate::journal::Journal;
use crate::net::{ReadHalf, WriteHalf};
use crate::resp::{write, Limits};
use crate::task::AbortOnDrop;
use crate::upstream::client::{Conn, UpstreamError};
use crate::upstream::settings::replicates_with_tls;
use crate::upstream::{server, Upstream};
use crate::valkey::process;
use bytes::{Bytes, BytesMut};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_rustls::TlsAcceptor;

/// File and stream bytes are sent in pieces of this size.
const CHUNK_BYTES: usize = 1 << 20;
/// Journal slices read ahead of the socket.
const READ_AHEAD_SLICES: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Upstream(#[from] UpstreamError),
    #[error("{0}")]
    Chain(#[from] ChainError),
    #[error("restore I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("Valkey did not {0} within {1:?}")]
    Timeout(&'static str, Duration),
    #[error("Valkey's replication connection to walrus: {0}")]
    Protocol(String),
    /// Another Valkey process answers than the one being loaded.
    #[error("the Valkey being restored is gone (process {was}); {now} answers now: starting over with it")]
    Gone { was: String, now: String },
}

/// How long each phase of a load took.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    /// From the RDB's first byte sent until Valkey acknowledged the checkpoint's offset.
    pub rdb: Duration,
    /// Stream bytes Valkey applied after that acknowledgement, and how long they took.
    pub journal_bytes: u64,
    pub journal: Duration,
}

/// What Valkey does once it acknowledged the journal's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// `REPLICAOF NO ONE`: a primary again, keeping the checkpoint's id as `replid2`, where
    /// walrus's link continues.
    Promote,
    /// `SAVE` while still walrus's replica: its RDB records the checkpoint's id at the
    /// journal's end, which a primary started from it keeps as `replid2` (how a cluster
    /// node, which refuses REPLICAOF, is restored: [`super::in_place`]).
    Save,
}

/// Where the stream after the checkpoint is read.
#[derive(Clone)]
pub enum Source {
    /// walrus's own journal, open for writing: all of its durable entries.
    Open(Arc<Journal>),
    /// A data directory's journal that no one writes (an in-place rewind's copy,
    /// [`super::rewind`]), up to a point-in-time cut.
    Dir { dir: PathBuf, at: Point },
}

/// A load of Valkey: `cp` from `store` and the stream after it from `journal`, up to `end`
/// (verified beforehand), then `finish`. `timeout` bounds each wait for Valkey.
pub struct Load<'a> {
    pub up: &'a Upstream,
    pub store: &'a Store,
    pub cp: &'a Checkpoint,
    pub journal: Source,
    pub end: &'a ChainEnd,
    pub timeout: Duration,
    pub progress: &'a Progress,
    pub finish: Finish,
}

/// Loads Valkey as `l` says: Valkey connects to walrus as its replica and is sent the
/// checkpoint and the journal.
pub async fn load(l: Load<'_>) -> Result<Option<Phases>, LoadError> {
    let (up, timeout) = (l.up, l.timeout);
    let was = server::run_id(&mut Conn::control(up).await?).await?;
    let tls = replica_tls(up).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    // Only the Valkey told the password may connect: [`super::listener`].
    let auth = OneTimeAuth::set(up).await?;
    let loaded = async {
        crate::fault::fail_point!("restore::before_replicaof");
        control(up, &["REPLICAOF", "127.0.0.1", &port.to_string()]).await?;
        let replica = accept_replica(&listener, &auth, tls, timeout)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut => {
                    LoadError::Timeout("connect to walrus as a replica", timeout)
                }
                _ => LoadError::Io(e),
            })?;
        send(&l, replica).await
    };
    let loaded = tokio::select! {
        r = loaded => r,
        now = process::replaced(up, &was, std::future::pending) => {
            Err(LoadError::Gone { was: was.clone(), now })
        }
    };
    auth.restore(up).await;
    loaded
}

/// The rest of [`load`], once Valkey connected and asked for the stream.
async fn send(l: &Load<'_>, replica: Replica) -> Result<Option<Phases>, LoadError> {
    let Load {
        up,
        store,
        cp,
        ref journal,
        end,
        timeout,
        progress,
        finish,
    } = *l;
    let Replica { rd, mut wr, buf } = replica;
    // From here Valkey only sends REPLCONF ACK <offset> [FACK <offset>].
    let (ack_tx, mut acked) = watch::channel(0u64);
    let (loaded_tx, mut loaded) = oneshot::channel();
    let reader = tokio::spawn(read_acks(rd, buf, ack_tx, (cp.offset, loaded_tx)));
    let _stop_reader = AbortOnDrop(reader);

    let started = Instant::now();
    let header = format!(
        "+FULLRESYNC {} {}\r\n${}\r\n",
        cp.replid, cp.offset, cp.size
    );
    let mut out = Sender {
        wr: &mut wr,
        timeout,
        progress,
    };
    out.send(header.as_bytes()).await?;
    send_rdb(&mut out, &store.path_of(cp)).await?;
    crate::fault::fail_point!("restore::rdb_sent");
    let streamed = send_stream(&mut out, journal.clone(), cp).await?;
    crate::fault::fail_point!("restore::stream_sent");
    if streamed.offset != end.offset {
        return Err(LoadError::Protocol(format!(
            "the journal changed during the restore: it ended at offset {} instead of {}",
            streamed.offset, end.offset
        )));
    }
    // GETACK has Valkey report its offset now rather than at its next once-a-second ACK,
    // but it counts in that offset: a server saved for a reload ([`Finish::Save`]) would
    // then record an offset past the journal's end, where no PSYNC from the journal can
    // continue (a promoted one keeps the bytes in its backlog and sends them back).
    if finish == Finish::Promote {
        out.send(&write::command(["REPLCONF", "GETACK", "*"]))
            .await?;
    }
    // Loading a large RDB keeps Valkey from acknowledging for a while: the time limit runs
    // from the last sign of progress, not from the start.
    loop {
        let now = *acked.borrow_and_update();
        if now >= end.offset {
            break;
        }
        match tokio::time::timeout(timeout, acked.changed()).await {
            Err(_) => return Err(LoadError::Timeout("acknowledge the journal's end", timeout)),
            Ok(Err(_)) => {
                return Err(LoadError::Protocol(
                    "Valkey closed the connection before acknowledging the journal's end".into(),
                ))
            }
            Ok(Ok(())) => {}
        }
    }
    let done = Instant::now();
    crate::fault::fail_point!("restore::before_promote");
    match finish {
        Finish::Promote => control(up, &["REPLICAOF", "NO", "ONE"]).await?,
        Finish::Save => control(up, &["SAVE"]).await?,
    }
    // Sent before the acknowledgement that ended the wait, which is at or past it: always
    // there, but a timing is no reason to fail a restore.
    Ok(loaded.try_recv().ok().map(|(offset, at)| Phases {
        rdb: at - started,
        journal_bytes: end.offset.saturating_sub(offset),
        journal: done - at,
    }))
}

/// How Valkey will connect as walrus's replica: with TLS (walrus's `[upstream.tls]`
/// certificate served, Valkey's checked against its CA) when it has `tls-replication yes`.
/// Asked before `REPLICAOF`, so that a restore that cannot serve it leaves Valkey as it was.
async fn replica_tls(up: &Upstream) -> Result<Option<TlsAcceptor>, LoadError> {
    let mut conn = Conn::control(up).await?;
    let tls = match replicates_with_tls(&mut conn).await? {
        Some(on) => on,
        None => {
            // A user without CONFIG: a Valkey reached with TLS most likely replicates
            // with it too; a wrong guess fails the handshake and says so.
            let guess = up.tls.is_some();
            tracing::warn!(
                "restore: cannot read Valkey's tls-replication (CONFIG GET refused); assuming {}",
                if guess {
                    "yes, as walrus reaches it with TLS"
                } else {
                    "no"
                }
            );
            guess
        }
    };
    if !tls {
        return Ok(None);
    }
    match up.tls.as_ref().and_then(|t| t.replication()) {
        Some(acceptor) => Ok(Some(acceptor.clone())),
        None => Err(LoadError::Protocol(
            "Valkey has tls-replication yes: it connects to walrus's restore listener with TLS, and walrus needs a certificate to serve it (upstream.tls.enabled, cert_file and key_file, signed by a CA in Valkey's tls-ca-cert-file)".into(),
        )),
    }
}

/// Sends one command on a fresh control connection: none is held open across the restore,
/// where a `CLIENT KILL` could break it.
async fn control(up: &Upstream, cmd: &[&str]) -> Result<(), UpstreamError> {
    Conn::control(up)
        .await?
        .expect_ok(write::command(cmd.iter().copied()))
        .await
}

/// Passes Valkey's acknowledged offsets on to `acked`; the first one at or past
/// `loaded.0` (the checkpoint's offset: the RDB is loaded) also to `loaded.1`, with when it
/// arrived.
async fn read_acks(
    mut rd: ReadHalf,
    mut buf: BytesMut,
    acked: watch::Sender<u64>,
    loaded: (u64, oneshot::Sender<(u64, Instant)>),
) {
    let (rdb_end, loaded) = loaded;
    let mut loaded = Some(loaded);
    while let Ok(args) = read_command(&mut rd, &mut buf, Limits::default()).await {
        let is_ack = args.len() >= 3
            && args[0].eq_ignore_ascii_case(b"REPLCONF")
            && args[1].eq_ignore_ascii_case(b"ACK");
        if let Some(o) = is_ack
            .then(|| std::str::from_utf8(&args[2]).ok()?.parse::<u64>().ok())
            .flatten()
        {
            if o >= rdb_end {
                if let Some(tx) = loaded.take() {
                    let _ = tx.send((o, Instant::now()));
                }
            }
            acked.send_if_modified(|a| {
                let advanced = o > *a;
                *a = (*a).max(o);
                advanced
            });
        }
    }
}

/// Writes to the Valkey being loaded: each piece within `timeout` (`restore.timeout_ms`), a
/// bound on progress, however large the whole.
struct Sender<'a> {
    wr: &'a mut WriteHalf,
    timeout: Duration,
    progress: &'a Progress,
}

impl Sender<'_> {
    async fn send(&mut self, bytes: &[u8]) -> Result<(), LoadError> {
        tokio::time::timeout(self.timeout, self.wr.send_all(bytes))
            .await
            .map_err(|_| LoadError::Timeout("take what walrus sends", self.timeout))??;
        Ok(())
    }

    /// A piece of the RDB or the stream: counted as progress.
    async fn send_counted(&mut self, bytes: &[u8]) -> Result<(), LoadError> {
        self.send(bytes).await?;
        self.progress.add(bytes.len() as u64);
        Ok(())
    }
}

async fn send_rdb(out: &mut Sender<'_>, path: &std::path::Path) -> Result<(), LoadError> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut chunk = vec![0u8; CHUNK_BYTES];
    loop {
        let n = file.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        out.send_counted(&chunk[..n]).await?;
    }
}

/// Sends the journal's stream after the checkpoint; the chain is walked (and checked) again
/// on a blocking thread while the socket takes what it has read.
async fn send_stream(
    out: &mut Sender<'_>,
    journal: Source,
    cp: &Checkpoint,
) -> Result<ChainEnd, LoadError> {
    let (tx, mut rx) = mpsc::channel::<Bytes>(READ_AHEAD_SLICES);
    let cp = cp.clone();
    let walker = tokio::task::spawn_blocking(move || {
        let mut replayed = Replayed::after(&cp);
        let mut each = |slice: chain::Slice| {
            // The receiver is gone only if the socket failed; that error is reported.
            let _ = tx.blocking_send(replayed.next(slice));
            Ok(())
        };
        let end = match journal {
            Source::Open(journal) => chain::walk(&journal, &cp, each),
            Source::Dir { dir, at } => Read::Dir(&dir)
                .entries(cp.from_lsn)
                .map_err(ChainError::from)
                .and_then(|e| chain::walk_entries(through(e, at), &cp, &mut each)),
        };
        if replayed.messages > 0 {
            tracing::info!(
                messages = replayed.messages,
                "restore: published messages left out of the replay"
            );
        }
        end
    });
    while let Some(bytes) = rx.recv().await {
        for piece in bytes.chunks(CHUNK_BYTES) {
            out.send_counted(piece).await?;
        }
    }
    walker
        .await
        .map_err(|e| LoadError::Protocol(format!("journal reader: {e}")))?
        .map_err(LoadError::from)
}

/// The stream after the checkpoint as it is sent, slice by slice: it starts at the
/// checkpoint's offset, each slice continues the last, and blanking messages keeps every
/// byte in its place. Paired with the chain's walk ([`chain::walk_entries`]), which cuts the
/// slices so: Valkey counts every byte sent in its offset, and the replica link continues
/// at the journal's end, so a byte missing or added would put Valkey's history out of step
/// with the journal's.
struct Replayed {
    /// Replication offset after the last byte sent.
    offset: u64,
    /// Published messages blanked out.
    messages: u64,
}

impl Replayed {
    fn after(cp: &Checkpoint) -> Replayed {
        Replayed {
            offset: cp.offset,
            messages: 0,
        }
    }

    /// The bytes to send for `slice`: data, not messages ([`messages`]).
    fn next(&mut self, slice: chain::Slice) -> Bytes {
        let len = slice.bytes.len() as u64;
        assert!(
            slice.end.checked_sub(len) == Some(self.offset),
            "a journal slice of {len} bytes ending at offset {} does not continue the replay at offset {}",
            slice.end,
            self.offset
        );
        let (bytes, blanked) = messages::blank(slice.bytes);
        assert!(
            bytes.len() as u64 == len,
            "blanking messages made a slice of {len} bytes {} bytes long",
            bytes.len()
        );
        self.messages += blanked;
        self.offset = slice.end;
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(end: u64, bytes: &'static [u8]) -> chain::Slice {
        chain::Slice {
            lsn: 1,
            repl_id: [b'a'; 40],
            bytes: Bytes::from_static(bytes),
            end,
            time_ms: None,
        }
    }

    fn checkpoint_at(offset: u64) -> Checkpoint {
        Checkpoint {
            file: "c.rdb".into(),
            replid: "a".repeat(40),
            offset,
            size: 1,
            crc64: 0,
            from_lsn: 1,
            rdb_version: None,
            written_by: None,
            newest_server: None,
            time_ms: None,
        }
    }

    #[test]
    fn the_replay_continues_the_checkpoint_and_keeps_every_byte_in_place() {
        let mut r = Replayed::after(&checkpoint_at(100));
        let publish = crate::resp::write::command(["PUBLISH", "c", "m"]);
        let end = 100 + publish.len() as u64;
        let mut s = slice(end, b"");
        s.bytes = publish.clone();
        let sent = r.next(s);
        assert_eq!((sent.len(), r.messages, r.offset), (publish.len(), 1, end));
        assert!(sent.iter().all(|&b| b == b'\n'));
        assert_eq!(r.next(slice(end + 5, b"\n\n\n\n\n")).len(), 5);
    }

    #[test]
    #[should_panic(
        expected = "a journal slice of 5 bytes ending at offset 110 does not continue the replay at offset 100"
    )]
    fn a_slice_that_leaves_a_hole_is_never_sent() {
        Replayed::after(&checkpoint_at(100)).next(slice(110, b"\n\n\n\n\n"));
    }

    #[test]
    #[should_panic(
        expected = "a journal slice of 5 bytes ending at offset 3 does not continue the replay at offset 0"
    )]
    fn a_slice_longer_than_its_offsets_is_never_sent() {
        Replayed::after(&checkpoint_at(0)).next(slice(3, b"\n\n\n\n\n"));
    }
}
