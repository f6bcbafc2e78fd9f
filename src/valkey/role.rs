//! What Valkey's `ROLE` says about replication, and the connection walrus asks it on.
//!
//! A write's reply is released once the journal covers Valkey's replication offset right
//! after the write ran: the proxy reads that offset from a `ROLE` it sends behind the write
//! on the client's own connection, or, when that `ROLE` is refused or the connection broke,
//! from the [`OffsetOracle`], walrus's own control connection.

use crate::resp::write;
use crate::upstream::client::Conn;
use crate::upstream::Upstream;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};

/// How walrus names one of its connections in `CLIENT KILL`, should it drop the connection
/// itself with commands of it still in Valkey ([`OffsetOracle::close`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientName {
    /// `CLIENT KILL ID`: exactly this connection, over any transport.
    Id(u64),
    /// `CLIENT KILL ADDR`: the connection's own TCP address, when Valkey refused `CLIENT ID`
    /// to its user. Never on a Unix socket, where every client has the same address (the
    /// socket's path) and a kill by it would close all of walrus's connections, the replica
    /// link too.
    Addr(std::net::SocketAddr),
}

impl ClientName {
    fn kill_command(&self) -> Bytes {
        match self {
            ClientName::Id(id) => write::command(["CLIENT", "KILL", "ID", &id.to_string()]),
            ClientName::Addr(a) => write::command(["CLIENT", "KILL", "ADDR", &a.to_string()]),
        }
    }
}

/// Set once the warning that a connection on a Unix socket cannot be named was logged.
static UNNAMED_WARNED: AtomicBool = AtomicBool::new(false);

/// How Valkey names a connection, from its reply to `CLIENT ID` (asked as walrus's user
/// when it opened: [`Conn::for_client`]), or `None` when there was none. When Valkey refused
/// `CLIENT ID`, the connection is named by its TCP address `local` instead; on a Unix socket
/// it cannot be named at all (`None`, warned once). An unauthenticated connection runs
/// nothing that would need closing: `None`, silently.
pub fn client_name(
    reply: Option<&[u8]>,
    local: Option<std::net::SocketAddr>,
) -> Option<ClientName> {
    let id = reply.and_then(|r| {
        std::str::from_utf8(r.strip_prefix(b":")?.strip_suffix(b"\r\n")?)
            .ok()?
            .parse()
            .ok()
    });
    if let Some(id) = id {
        return Some(ClientName::Id(id));
    }
    if reply.is_some_and(|r| r.starts_with(b"-NOAUTH")) {
        return None;
    }
    if let Some(addr) = local {
        return Some(ClientName::Addr(addr));
    }
    if let Some(r) = reply {
        if !UNNAMED_WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                reply = %String::from_utf8_lossy(r).trim_end(),
                "Valkey refused CLIENT ID to walrus's user on its Unix socket, where every connection has the same address: when walrus drops a client's connection itself (no reply within upstream.reply_timeout_ms), it cannot have Valkey close it first, and a write Valkey runs after may be acknowledged before the journal has it; allow walrus's user +client|id (logged once)"
            );
        }
    }
    None
}

/// Valkey's replication offset now, asked on walrus's own control connection.
///
/// Used when a batch's inline `ROLE` is refused (the client's ACL user lacks `+role`, or is
/// not authenticated) and when a connection breaks with writes in flight. Every reply of the
/// batch has arrived by then, so the batch ran before this ROLE does: the offset covers it.
///
/// The same connection tells which Valkey process answers ([`OffsetOracle::run_id`]): with
/// `INFO server`, or, while a script keeps Valkey busy (it refuses INFO with `-BUSY`, as it
/// refuses everything but what a person needs to recover), by being the connection that
/// found that process before and still hears from it: a connection does not outlive the
/// server process it reached.
pub struct OffsetOracle {
    conn: tokio::sync::Mutex<Option<Control>>,
}

/// walrus's control connection, and the Valkey process it found.
struct Control {
    conn: Conn,
    /// The `run_id` an `INFO server` on this connection named.
    process: Option<String>,
}

/// What became of a connection walrus asked Valkey to close ([`OffsetOracle::close`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Valkey answered the `CLIENT KILL`: it runs nothing more of that connection.
    Closed,
    /// Another process answers: the connection went with the one it reached.
    Gone,
    /// Valkey cannot say now: unreachable, or busy with a script (it closes no client
    /// until the script ends, and runs what that client sent before then). Ask again.
    Unknown,
}

impl OffsetOracle {
    pub fn new() -> OffsetOracle {
        OffsetOracle {
            conn: tokio::sync::Mutex::new(None),
        }
    }

    /// Makes the Valkey process `run_id` close its client `name` (if it still has it): it
    /// runs none of that client's commands after this. Only that process: client ids start
    /// again at 1 in another, where the id names someone else (and the connection is gone
    /// with the process it reached). The kill goes on the connection that found the process,
    /// so no restart comes in between.
    pub async fn close(&self, up: &Upstream, name: ClientName, run_id: &str) -> Closing {
        let mut slot = self.conn.lock().await;
        match process(&mut slot, up).await {
            None => return Closing::Unknown,
            Some(p) if p != run_id => return Closing::Gone,
            Some(_) => {}
        }
        let control = slot.as_mut().expect("the connection that answered");
        // "-ERR No such client" when Valkey already closed it: fine. Not tried again on
        // another connection, which might reach another process.
        match control.conn.call_raw(&name.kill_command()).await {
            Ok(reply) if is_busy(&reply) => Closing::Unknown,
            Ok(_) => Closing::Closed,
            Err(_) => {
                *slot = None;
                Closing::Unknown
            }
        }
    }

    /// The replication offset of the Valkey process `run_id` now, asked on the connection
    /// that found it (no restart comes in between); `None` if another process answers (its
    /// offsets say nothing of what ran on this one), or Valkey is unreachable or busy.
    pub async fn offset_of(&self, up: &Upstream, run_id: &str) -> Option<u64> {
        let mut slot = self.conn.lock().await;
        if process(&mut slot, up).await? != run_id {
            return None;
        }
        let control = slot.as_mut().expect("the connection that answered");
        match control.conn.call_raw(&write::command(["ROLE"])).await {
            Ok(reply) => parse_role_offset(&reply),
            Err(_) => {
                *slot = None;
                None
            }
        }
    }

    /// Valkey's replication offset now; `None` if Valkey is unreachable (or busy).
    pub async fn offset(&self, up: &Upstream) -> Option<u64> {
        let mut slot = self.conn.lock().await;
        parse_role_offset(&call(&mut slot, up, &write::command(["ROLE"])).await?)
    }

    /// The Valkey process (`run_id`) answering now; `None` if Valkey is unreachable.
    pub async fn run_id(&self, up: &Upstream) -> Option<String> {
        process(&mut *self.conn.lock().await, up).await
    }
}

/// The Valkey process answering on the control connection: the `run_id` its `INFO server`
/// names, or, when Valkey answers `-BUSY`, the one this same connection found before.
async fn process(slot: &mut Option<Control>, up: &Upstream) -> Option<String> {
    let reply = call(slot, up, &write::command(["INFO", "server"])).await?;
    let control = slot.as_mut().expect("the connection that answered");
    // The bulk string's lines, its length line first (which names no field).
    match crate::upstream::server::run_id_of(&String::from_utf8_lossy(&reply)) {
        Ok(id) => {
            control.process = Some(id.clone());
            Some(id)
        }
        Err(_) if is_busy(&reply) => control.process.clone(),
        Err(_) => None,
    }
}

/// Valkey's refusal while a script or function runs past `busy-reply-threshold`.
fn is_busy(reply: &[u8]) -> bool {
    reply.starts_with(b"-BUSY ")
}

/// Sends `cmd` on the control connection `slot` (opened if there is none) and returns its
/// reply. A broken connection (Valkey restarted) is opened again and the command sent once
/// more; one that got no reply within `upstream.reply_timeout_ms` is dropped, and not tried
/// again: a Valkey that stopped answering does not answer a new connection either.
async fn call(slot: &mut Option<Control>, up: &Upstream, cmd: &[u8]) -> Option<Bytes> {
    for _ in 0..2 {
        if slot.is_none() {
            let conn = Conn::control(up).await.ok()?;
            *slot = Some(Control {
                conn,
                process: None,
            });
        }
        let control = slot.as_mut().expect("just connected");
        match control.conn.call_raw(cmd).await {
            Ok(reply) => return Some(reply),
            Err(e) => {
                *slot = None;
                if matches!(e, crate::upstream::client::UpstreamError::NoReply(_)) {
                    return None;
                }
            }
        }
    }
    None
}

impl Default for OffsetOracle {
    fn default() -> Self {
        OffsetOracle::new()
    }
}

/// Reads the offset from a primary's ROLE reply, `*3 $6 master :<offset> *<replicas> ...`.
/// An offset of 0 with no replica attached comes from a Valkey without a replication
/// backlog, one walrus does not journal (it restarted and the link has not noticed yet):
/// it proves nothing. (Once walrus's link has attached, the backlog exists and offsets
/// move; right after a full sync Valkey may not list the link as online yet.)
pub fn parse_role_offset(reply: &[u8]) -> Option<u64> {
    let (offset, replicas) = parse_role(reply)?;
    (replicas > 0 || offset > 0).then_some(offset)
}

/// A primary's ROLE reply: its offset and how many replicas it lists (the online ones).
pub fn parse_role(reply: &[u8]) -> Option<(u64, u64)> {
    const HEAD: &[u8] = b"*3\r\n$6\r\nmaster\r\n:";
    let rest = reply.strip_prefix(HEAD)?;
    let end = rest.iter().position(|&b| b == b'\r')?;
    let offset = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    let replicas = rest[end..].strip_prefix(b"\r\n*")?;
    let n_end = replicas.iter().position(|&b| b == b'\r')?;
    let n = std::str::from_utf8(&replicas[..n_end]).ok()?.parse().ok()?;
    Some((offset, n))
}

#[cfg(test)]
mod tests {
    use super::{client_name, parse_role_offset, ClientName};

    #[test]
    fn a_connection_is_named_by_its_id_else_its_tcp_address() {
        let addr: std::net::SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let tcp = Some(addr);
        assert_eq!(
            client_name(Some(b":42\r\n"), None),
            Some(ClientName::Id(42))
        );
        assert_eq!(client_name(Some(b":42\r\n"), tcp), Some(ClientName::Id(42)));
        let refused: &[u8] =
            b"-NOPERM User u has no permissions to run the 'client|id' command\r\n";
        assert_eq!(
            client_name(Some(refused), tcp),
            Some(ClientName::Addr(addr))
        );
        // A Unix socket: every client has the socket's address, which names none of them.
        assert_eq!(client_name(Some(refused), None), None);
        assert_eq!(client_name(None, tcp), Some(ClientName::Addr(addr)));
        assert_eq!(
            client_name(Some(b"-NOAUTH Authentication required.\r\n"), tcp),
            None
        );
    }

    /// `CLIENT KILL ID` goes only to the Valkey process the connection reached: ids start
    /// again at 1 in a restarted one, where the same id names another client.
    #[tokio::test]
    async fn a_kill_by_id_goes_only_to_the_process_the_connection_reached() {
        use crate::upstream::{managed::ManagedValkey, Upstream};
        use std::io::{Read, Write};
        let Ok(binary) = crate::upstream::binary::find("") else {
            return; // no valkey-server here: deploy/setup.sh installs it
        };
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("run/valkey.sock");
        let valkey =
            ManagedValkey::start(binary, &tmp.path().join("v"), socket.clone(), vec![], None)
                .await
                .unwrap();
        let up = Upstream {
            address: valkey.address.clone(),
            credentials: None,
            connect_timeout: std::time::Duration::from_secs(5),
            reply_timeout: std::time::Duration::from_secs(5),
            limits: crate::resp::Limits::default(),
            process: None,
            tls: None,
        };
        let mut victim = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        let mut reply = [0u8; 64];
        victim.write_all(b"CLIENT ID\r\n").unwrap();
        let n = victim.read(&mut reply).unwrap();
        let id = client_name(Some(&reply[..n]), None).expect("an id");
        let oracle = super::OffsetOracle::new();
        let run_id = oracle.run_id(&up).await.expect("Valkey's run_id");
        assert_eq!(
            oracle.close(&up, id, "another process's run_id").await,
            super::Closing::Gone
        );
        victim.write_all(b"PING\r\n").unwrap();
        let n = victim.read(&mut reply).unwrap();
        assert_eq!(
            &reply[..n],
            b"+PONG\r\n",
            "killed by a kill meant for another process"
        );
        assert_eq!(oracle.close(&up, id, &run_id).await, super::Closing::Closed);
        victim.write_all(b"PING\r\n").ok();
        assert_eq!(victim.read(&mut reply).unwrap_or(0), 0, "not killed");
        valkey.stop().await;
    }

    #[test]
    fn role_offsets() {
        assert_eq!(
            parse_role_offset(
                b"*3\r\n$6\r\nmaster\r\n:1234\r\n*1\r\n*3\r\n$9\r\n127.0.0.1\r\n$1\r\n0\r\n$4\r\n1234\r\n"
            ),
            Some(1234)
        );
        assert_eq!(
            parse_role_offset(b"*3\r\n$6\r\nmaster\r\n:1234\r\n*0\r\n"),
            Some(1234)
        );
        // No backlog, no replica: a Valkey walrus does not journal.
        assert_eq!(
            parse_role_offset(b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"),
            None
        );
        assert_eq!(parse_role_offset(b"*5\r\n$5\r\nslave\r\n"), None);
        assert_eq!(parse_role_offset(b"-NOPERM no\r\n"), None);
    }
}
