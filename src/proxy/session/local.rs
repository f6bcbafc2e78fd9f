//! The connection-state commands walrus answers itself, because its upstream connections are
//! shared: AUTH, HELLO, SELECT, CLIENT SETNAME / GETNAME / SETINFO, RESET and QUIT change the
//! session's [`Identity`](super::Identity) (and so which pool its commands run on), never a
//! shared connection. Replies are Valkey's own wherever Valkey can give them.

use super::*;
use crate::config::Credentials;

impl Session {
    /// Valkey refuses every command but AUTH, HELLO, QUIT and RESET before authentication;
    /// the connection-state commands walrus answers itself must be refused alike (and a
    /// SELECT accepted here would later fail on the shared connection, breaking it for every
    /// client on it). Whether this client needs to authenticate is asked once, with a PING
    /// on a pooled connection of its identity (never on its dedicated connection, where the
    /// PING would be the command after its last one, and take what CLIENT CACHING or ASKING
    /// set for the next): `Some` is Valkey's `-NOAUTH` reply.
    async fn noauth(&mut self) -> Option<Bytes> {
        if self.id.creds.is_some() || self.needs_no_auth || self.transaction.is_open() {
            return None;
        }
        let pool = self.shared.pools.get(self.id.pool_key(), None).await;
        let reply = self
            .ask_pool(&pool, pool.pick(), None, write::command(["PING"]))
            .await;
        if reply.starts_with(b"-NOAUTH") {
            return Some(reply);
        }
        self.needs_no_auth = !reply.starts_with(b"-");
        None
    }

    pub(super) async fn local(&mut self, cmd: Local, req: Request) -> Flow {
        // With a wrong number of arguments these go to Valkey, whose arity error comes first.
        let answered_here = match cmd {
            Local::Select | Local::ClientGetName => req.args.len() == 2,
            Local::ClientSetName => req.args.len() == 3,
            Local::ClientSetInfo => req.args.len() == 4,
            _ => false,
        };
        if answered_here {
            if let Some(noauth) = self.noauth().await {
                return self.ready(noauth);
            }
        }
        match cmd {
            Local::Select if self.transaction.is_open() => {
                // Queued with the transaction: Valkey answers it.
                self.forward(req).await;
                Flow::Continue
            }
            Local::Select => {
                if req.args.len() != 2 {
                    self.forward(req).await; // Valkey's own arity error
                    return Flow::Continue;
                }
                let reply = match crate::resp::parse_i64(&req.args[1]) {
                    None => write::error("ERR value is not an integer or out of range"),
                    Some(db) if db < 0 || db >= self.shared.databases as i64 => {
                        write::error("ERR DB index is out of range")
                    }
                    Some(db) => {
                        self.id.db = db as u32;
                        Bytes::from_static(write::OK)
                    }
                };
                self.ready(reply)
            }
            Local::Quit => {
                self.ready(Bytes::from_static(write::OK));
                Flow::Close
            }
            Local::Reset if req.args.len() != 1 => {
                self.forward(req).await; // Valkey's own arity error
                Flow::Continue
            }
            Local::Reset => {
                if self.drain().await.is_err() {
                    return Flow::Close;
                }
                // A dedicated connection is dropped with its state; the session is pooled again.
                self.id = Identity::default();
                self.needs_no_auth = false;
                self.pool_again().await;
                self.ready(write::simple("RESET"))
            }
            Local::Auth => {
                let creds = match req.args.len() {
                    2 => Credentials {
                        username: None,
                        password: String::from_utf8_lossy(&req.args[1]).into_owned(),
                    },
                    3 => Credentials {
                        username: Some(String::from_utf8_lossy(&req.args[1]).into_owned()),
                        password: String::from_utf8_lossy(&req.args[2]).into_owned(),
                    },
                    _ => {
                        self.forward(req).await; // Valkey's own syntax error
                        return Flow::Continue;
                    }
                };
                if self.drain().await.is_err() {
                    return Flow::Close;
                }
                match authenticate(&self.shared, &creds).await {
                    Ok(()) => {
                        self.id.creds = Some(creds);
                        if self.dedicated() {
                            // The dedicated connection switches user too; its +OK is the reply.
                            self.forward(req).await;
                            return Flow::Continue;
                        }
                        self.pool_again().await;
                        self.ready(Bytes::from_static(write::OK))
                    }
                    Err(reply) => self.ready(reply),
                }
            }
            Local::Hello if self.dedicated() => {
                // The connection is the client's own: Valkey answers HELLO on it, once
                // walrus has checked its AUTH as for any other (a certificate user's
                // refused).
                let (mut id, auth) = match self.hello_args(&req) {
                    Ok(parsed) => parsed,
                    Err(reply) => return self.ready(reply),
                };
                if let Some(c) = auth {
                    if self.drain().await.is_err() {
                        return Flow::Close;
                    }
                    if let Err(reply) = authenticate(&self.shared, &c).await {
                        return self.ready(reply);
                    }
                    id.creds = Some(c);
                }
                self.id = id;
                self.forward(req).await;
                Flow::Continue
            }
            Local::Hello => self.hello(req).await,
            Local::ClientSetName => {
                if req.args.len() != 3 {
                    self.forward(req).await;
                    return Flow::Continue;
                }
                match valid_name(&req.args[2]) {
                    Ok(()) => {
                        self.id.name = (!req.args[2].is_empty()).then(|| req.args[2].clone());
                        self.ready(Bytes::from_static(write::OK))
                    }
                    Err(e) => self.ready(e),
                }
            }
            Local::ClientGetName => {
                if req.args.len() != 2 {
                    self.forward(req).await;
                    return Flow::Continue;
                }
                let reply = write::bulk_or_null(self.id.name.as_deref(), self.id.resp3);
                self.ready(reply)
            }
            Local::ClientSetInfo => {
                // Library name and version are per connection; pooled connections are shared,
                // so walrus validates and accepts them without passing them on.
                if req.args.len() != 4 {
                    self.forward(req).await;
                    return Flow::Continue;
                }
                if !(req.arg_is(2, "lib-name") || req.arg_is(2, "lib-ver")) {
                    let attr = String::from_utf8_lossy(&req.args[2]).into_owned();
                    return self.ready(write::error(&format!(
                        "ERR Unrecognized option '{}'",
                        attr.replace(['\r', '\n'], "")
                    )));
                }
                match valid_name(&req.args[3]) {
                    Ok(()) => self.ready(Bytes::from_static(write::OK)),
                    Err(_) => self.ready(write::error(&format!(
                        "ERR {} cannot contain spaces, newlines or special characters.",
                        // Valkey names the attribute as the client spelled it.
                        String::from_utf8_lossy(&req.args[2]).replace(['\r', '\n'], "")
                    ))),
                }
            }
            Local::CrossProtocol => {
                cross_protocol_warning();
                Flow::Abort
            }
            Local::Admin(_) if self.shared.allow_admin_commands => {
                self.forward(req).await;
                Flow::Continue
            }
            Local::Admin(refusal) => self.ready(write::error(&refusal.error())),
            Local::Replication => self.ready(write::error(
                "ERR walrus: SYNC, PSYNC and REPLCONF are refused: the replication stream shows writes before they are durable; attach replicas to Valkey itself",
            )),
            Local::ClientReply => {
                if req.args.len() == 3 && req.arg_is(2, "ON") {
                    return self.ready(Bytes::from_static(write::OK));
                }
                if req.args.len() == 3 && (req.arg_is(2, "OFF") || req.arg_is(2, "SKIP")) {
                    return self.ready(write::error(
                        "ERR walrus: CLIENT REPLY OFF and SKIP are not supported: walrus holds each reply until it is durable",
                    ));
                }
                self.forward(req).await; // Valkey's own syntax error
                Flow::Continue
            }
        }
    }

    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`: authentication is verified with
    /// Valkey, the name is kept by walrus, and the reply is Valkey's own, from a connection
    /// of the identity the client switches to.
    async fn hello(&mut self, req: Request) -> Flow {
        let (mut id, auth) = match self.hello_args(&req) {
            Ok(parsed) => parsed,
            Err(reply) => return self.ready(reply),
        };
        if self.drain().await.is_err() {
            return Flow::Close;
        }
        if let Some(c) = auth {
            if let Err(reply) = authenticate(&self.shared, &c).await {
                return self.ready(reply);
            }
            id.creds = Some(c);
        }
        // Valkey's own HELLO reply, from a connection that already is what the client asked for.
        let pool = self
            .shared
            .pools
            .get(id.pool_key(), id.creds.as_ref())
            .await;
        let slot = pool.pick();
        let hello = match req.args.get(1) {
            Some(v) => write::command([b"HELLO".as_slice(), v]),
            None => write::command(["HELLO"]),
        };
        let reply = self.ask_pool(&pool, slot, Some(id.db), hello).await;
        if !reply.starts_with(b"-") {
            self.id = id;
            self.tx = pool.sender(slot).await.ok();
            self.upstream = Runs::Pooled { pool, slot };
        }
        self.ready(reply)
    }

    /// Sends `cmd` (one of walrus's own, which reads and writes nothing) on `slot` of `pool`
    /// and returns its reply.
    async fn ask_pool(
        &self,
        pool: &crate::proxy::pool::Pool,
        slot: usize,
        db: Option<u32>,
        cmd: Bytes,
    ) -> Bytes {
        let (reply, rx) = self.reply_channel();
        let request = PipelinedRequest {
            db,
            cmd,
            reply,
            release: Release::Free,
            tx: TxCmd::Other,
            in_multi: false,
            answered_by_push: false,
            may_block: false,
            one_shot: false,
        };
        match pool.sender(slot).await {
            Err(reason) => pipeline::unavailable(&reason.0),
            Ok(sender) => match sender.send(request).await {
                Err(_) => pipeline::unavailable("connection lost"),
                Ok(()) => replies::received(&self.output, rx.await),
            },
        }
    }

    /// Reads `HELLO [protover [AUTH user pass] [SETNAME name]]` as Valkey does: the identity
    /// it asks for (protocol, name) and the credentials to check, or Valkey's error.
    fn hello_args(&self, req: &Request) -> Result<(Identity, Option<Credentials>), Bytes> {
        let mut id = self.id.clone();
        let mut auth = None;
        if let Some(v) = req.args.get(1) {
            match crate::resp::parse_i64(v) {
                None => {
                    return Err(write::error(
                        "ERR Protocol version is not an integer or out of range",
                    ))
                }
                Some(v) if !(2..=3).contains(&v) => {
                    return Err(write::error("NOPROTO unsupported protocol version"))
                }
                Some(v) => id.resp3 = v == 3,
            }
        }
        let mut i = 2;
        while i < req.args.len() {
            let more = req.args.len() - i - 1;
            if req.arg_is(i, "AUTH") && more >= 2 {
                auth = Some(Credentials {
                    username: Some(String::from_utf8_lossy(&req.args[i + 1]).into_owned()),
                    password: String::from_utf8_lossy(&req.args[i + 2]).into_owned(),
                });
                i += 3;
            } else if req.arg_is(i, "SETNAME") && more >= 1 {
                valid_name(&req.args[i + 1])?;
                id.name = (!req.args[i + 1].is_empty()).then(|| req.args[i + 1].clone());
                i += 2;
            } else {
                let opt = String::from_utf8_lossy(&req.args[i]).replace(['\r', '\n'], "");
                return Err(write::error(&format!(
                    "ERR Syntax error in HELLO option '{opt}'"
                )));
            }
        }
        Ok((id, auth))
    }
}

/// Checks a client's credentials before walrus acts as that user: a certificate user's are
/// refused ([`not_cert_user`]), others must pass Valkey's own `AUTH` ([`verify`]).
async fn authenticate(shared: &Shared, c: &Credentials) -> Result<(), Bytes> {
    not_cert_user(shared, c.username.as_deref()).await?;
    verify(shared, &crate::upstream::client::auth_command(c)).await
}

/// Checks credentials with Valkey on a fresh connection; `Err` carries Valkey's own reply
/// (`-WRONGPASS ...`) or walrus's error.
async fn verify(shared: &Shared, auth_cmd: &[u8]) -> Result<(), Bytes> {
    let mut conn = Conn::connect(shared.pools.upstream())
        .await
        .map_err(|e| pipeline::unavailable(&e.to_string()))?;
    let reply = conn
        .call_raw(auth_cmd)
        .await
        .map_err(|e| pipeline::unavailable(&e.to_string()))?;
    if reply.starts_with(b"-") {
        return Err(reply);
    }
    Ok(())
}

/// While client certificates map to ACL users, AUTH naming a certificate user gets
/// Valkey's answer for a user with no password ([`crate::proxy::cert_user`]).
async fn not_cert_user(shared: &Shared, user: Option<&str>) -> Result<(), Bytes> {
    let Some(user) = user else { return Ok(()) };
    if shared.cert_user == crate::config::CertUser::Off {
        return Ok(());
    }
    match crate::proxy::cert_user::is_cert_user(shared.pools.upstream(), user).await {
        Ok(false) => Ok(()),
        Ok(true) => {
            crate::metrics::CertUserResult::AuthRefused.count();
            Err(write::error(
                "WRONGPASS invalid username-password pair or user is disabled.",
            ))
        }
        Err(e) => Err(pipeline::unavailable(&e.to_string())),
    }
}

/// Valkey's rule for client names: printable ASCII without spaces.
fn valid_name(name: &[u8]) -> Result<(), Bytes> {
    if name.iter().all(|&c| (b'!'..=b'~').contains(&c)) {
        Ok(())
    } else {
        Err(write::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ))
    }
}

/// Logs Valkey's own warning for an HTTP request, at most once a minute (as Valkey does).
fn cross_protocol_warning() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if now >= last + 60
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            "Possible SECURITY ATTACK detected. It looks like somebody is sending POST or Host: \
             commands to walrus. This is likely due to an attacker attempting to use Cross \
             Protocol Scripting to compromise your Valkey instance. Connection aborted."
        );
    }
}
