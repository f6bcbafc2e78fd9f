//! The HTTP endpoint: `/metrics` (Prometheus text format), `/healthz` (200 while the
//! process and its runtime answer), `/readyz` (200 only when walrus serves data durably;
//! otherwise 503 with a one-line reason), `/status` (JSON, [`status`]: `walrus status`), and
//! the admin requests `POST /checkpoint` (`walrus checkpoint`), `POST /backup` (the body
//! is the directory: `walrus backup`) and `POST /rewind` (an in-place point-in-time restore:
//! `walrus restore --keep-present DIR --confirm`), from loopback callers only unless
//! `metrics.admin_allow_remote`, with the bearer token of `metrics.admin_token_file` when
//! one is set ([`token`]; remote callers always need it), and never from a web browser (a
//! request carrying `Origin`: a page open on walrus's host could otherwise post to it). Every
//! admin request is logged with its caller, accepted or refused. An admin request refused as
//! given gets a 4xx (`walrus` exits 2: a person must act), one that failed or cannot run now
//! a 5xx (exit 1: it may succeed later).

pub mod status;
pub mod token;

use prometheus::{Encoder, TextEncoder};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Readiness as reported on `/readyz`: `Err` says why not, in one line.
pub type Ready = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Admin requests the endpoint accepts: `POST /checkpoint` takes a checkpoint now,
/// `POST /backup` copies one and the journal after it, `POST /rewind` rewinds Valkey in
/// place.
#[derive(Clone)]
pub struct Admin {
    pub checkpoint: tokio::sync::mpsc::Sender<crate::checkpoint::Request>,
    pub backups: Arc<crate::datadir::backup::Backups>,
    /// In-place rewinds, run by the replica link.
    pub rewinds: tokio::sync::mpsc::Sender<crate::replication::link::Rewind>,
}

/// Who may make admin requests, known from the start.
#[derive(Debug, Clone, Default)]
pub struct AdminAccess {
    /// Accept them from hosts other than loopback (`metrics.admin_allow_remote`, which
    /// needs a token).
    pub allow_remote: bool,
    /// The bearer token they must carry (`metrics.admin_token_file`).
    pub token: Option<token::AdminToken>,
}

/// How long a caller may take to send its request: a request is a few hundred bytes.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// The largest request read (head and body: a backup's directory is one path).
const MAX_REQUEST_BYTES: usize = 8192;

/// Serves the endpoint until the process exits.
/// `admin` is set once the checkpointer runs.
pub async fn serve(
    listener: TcpListener,
    sources: Arc<status::Sources>,
    admin: Arc<std::sync::OnceLock<Admin>>,
    access: AdminAccess,
) {
    crate::metrics::register_all();
    loop {
        let Ok((mut sock, peer)) = listener.accept().await else {
            continue;
        };
        let sources = sources.clone();
        let admin = admin.get().cloned();
        let access = access.clone();
        tokio::spawn(async move {
            let Ok(Some((head, body))) =
                tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut sock)).await
            else {
                return;
            };
            let mut words = head.split_whitespace();
            let method = words.next().unwrap_or("GET");
            let path = words.next().unwrap_or("/");
            let (status, body) = match (method, path) {
                (_, "/metrics") => {
                    let mut out = Vec::new();
                    let _ = TextEncoder::new().encode(&crate::metrics::gather(), &mut out);
                    ("200 OK", out)
                }
                // Answering at all is the health signal: the process and its runtime are alive.
                (_, "/healthz") => ("200 OK", b"ok\n".to_vec()),
                (_, "/readyz") => match (sources.ready)() {
                    Ok(()) => ("200 OK", b"ready\n".to_vec()),
                    Err(why) => (
                        "503 Service Unavailable",
                        format!("not ready: {why}\n").into_bytes(),
                    ),
                },
                ("GET", "/status") => match serde_json::to_vec(&sources.read()) {
                    Ok(json) => ("200 OK", json),
                    Err(e) => ("500 Internal Server Error", format!("{e}\n").into_bytes()),
                },
                ("POST", "/checkpoint" | "/backup" | "/rewind") => {
                    let refused = access
                        .refusal(peer, &head)
                        .await
                        .or_else(|| not_running(admin.as_ref(), sources.durability));
                    match refused {
                        Some(refused) => {
                            let why = String::from_utf8_lossy(&refused.1);
                            tracing::warn!(%peer, path, "admin request refused: {}", why.trim_end());
                            refused
                        }
                        None => {
                            let admin = admin.as_ref().expect("checked by admin_refusal");
                            tracing::info!(%peer, path, "admin request");
                            match path {
                                "/checkpoint" => checkpoint(admin).await,
                                "/backup" => backup(admin, body).await,
                                _ => rewind(admin, body).await,
                            }
                        }
                    }
                }
                _ => ("404 Not Found", b"not found\n".to_vec()),
            };
            let kind = if path == "/status" {
                "application/json"
            } else {
                "text/plain; version=0.0.4"
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(&body).await;
        });
    }
}

/// Reads a request's head and its body (as long as its Content-Length says, within
/// [`MAX_REQUEST_BYTES`]). `None`: the caller went away, or sent more than that.
async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<(String, String)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..at]).into_owned();
            let want = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            let body = &buf[at + 4..];
            if body.len() >= want || at + 4 + want > MAX_REQUEST_BYTES {
                let body = String::from_utf8_lossy(&body[..want.min(body.len())]).into_owned();
                return Some((head, body));
            }
        } else if buf.len() >= MAX_REQUEST_BYTES {
            // No blank line within the limit: answer by the request line alone, as before.
            return Some((String::from_utf8_lossy(&buf).into_owned(), String::new()));
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            // A caller that closed its side after a request without a blank line (a bare
            // `GET /metrics`) is still answered.
            return (!buf.is_empty())
                .then(|| (String::from_utf8_lossy(&buf).into_owned(), String::new()));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

impl AdminAccess {
    /// Why this caller's admin request is refused, if it is: from another host without
    /// `allow_remote`, from a web page, or without the token.
    async fn refusal(
        &self,
        peer: std::net::SocketAddr,
        head: &str,
    ) -> Option<(&'static str, Vec<u8>)> {
        if !self.allow_remote && !peer.ip().is_loopback() {
            return Some((
                "403 Forbidden",
                b"admin requests are accepted from loopback only (metrics.admin_allow_remote)\n"
                    .to_vec(),
            ));
        }
        let from_browser = head.lines().skip(1).any(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("origin"))
        });
        if from_browser {
            return Some((
                "403 Forbidden",
                b"admin requests from a web page are refused (the request carried Origin)\n"
                    .to_vec(),
            ));
        }
        let token = self.token.clone()?;
        // The file is read at each request, off the proxy's threads: on a volume that stopped
        // answering, the read waits with it, and only this request waits for the read.
        let head = head.to_string();
        let checked = tokio::task::spawn_blocking(move || token.check(&head))
            .await
            .unwrap_or_else(|e| Err(token::Refused::Unreadable(e.to_string())));
        match checked {
            Ok(()) => None,
            Err(token::Refused::Unauthorized(why)) => {
                Some(("401 Unauthorized", format!("{why}\n").into_bytes()))
            }
            Err(token::Refused::Unreadable(why)) => {
                tracing::error!("{why}");
                Some(("500 Internal Server Error", format!("{why}\n").into_bytes()))
            }
        }
    }
}

/// Why an admin request cannot run yet (the journal is not open) or at all (durability
/// off), if so.
fn not_running(admin: Option<&Admin>, durability: bool) -> Option<(&'static str, Vec<u8>)> {
    if admin.is_some() {
        return None;
    }
    Some(if durability {
        (
            "503 Service Unavailable",
            b"walrus is starting: its journal is not open yet; retry once it is ready\n".to_vec(),
        )
    } else {
        (
            "404 Not Found",
            b"durability is off: no checkpoints or backups\n".to_vec(),
        )
    })
}

async fn backup(admin: &Admin, body: String) -> (&'static str, Vec<u8>) {
    use crate::datadir::DataDirError;
    let to = body.trim();
    if to.is_empty() {
        return (
            "400 Bad Request",
            b"the request's body must be the backup's directory (an absolute path)\n".to_vec(),
        );
    }
    match admin.backups.take(to.into()).await {
        Ok(summary) => {
            tracing::info!("{}", summary.to_string().trim_end().replace('\n', "; "));
            ("200 OK", summary.to_string().into_bytes())
        }
        Err(why) => {
            tracing::warn!("backup to {to} failed: {why}");
            let status = match why {
                DataDirError::Refused(_) => "409 Conflict",
                _ => "500 Internal Server Error",
            };
            (status, format!("{why}\n").into_bytes())
        }
    }
}

/// `POST /rewind`: the body's first line is where the present is kept (an absolute path), its
/// second the cut ([`crate::datadir::pitr::Until::parse`]).
async fn rewind(admin: &Admin, body: String) -> (&'static str, Vec<u8>) {
    use crate::restore::RestoreError;
    let mut lines = body.lines();
    let way_back = lines.next().unwrap_or("").trim();
    let until = crate::datadir::pitr::Until::parse(lines.next().unwrap_or(""));
    let until = match until {
        Ok(u) if !way_back.is_empty() => u,
        Ok(_) => return bad("the body's first line must be the directory where the present is kept (an absolute path)".into()),
        Err(why) => return bad(format!("the body's second line must say where to cut: {why}")),
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    let request = crate::replication::link::Rewind {
        until,
        way_back: way_back.into(),
        backups: admin.backups.clone(),
        reply,
    };
    if admin.rewinds.send(request).await.is_err() {
        return (
            "503 Service Unavailable",
            b"the replica link is not running\n".to_vec(),
        );
    }
    match answer.await {
        Ok(Ok(text)) => ("200 OK", text.into_bytes()),
        Ok(Err(why)) => {
            let status = match why {
                RestoreError::Refused(_) => "409 Conflict",
                _ => "500 Internal Server Error",
            };
            (status, format!("{why}\n").into_bytes())
        }
        Err(_) => (
            "503 Service Unavailable",
            b"the replica link stopped\n".to_vec(),
        ),
    }
}

fn bad(why: String) -> (&'static str, Vec<u8>) {
    ("400 Bad Request", format!("{why}\n").into_bytes())
}

async fn checkpoint(admin: &Admin) -> (&'static str, Vec<u8>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if admin.checkpoint.send(tx).await.is_err() {
        return (
            "503 Service Unavailable",
            b"the checkpointer is not running\n".to_vec(),
        );
    }
    match rx.await {
        Ok(Ok(summary)) => ("200 OK", format!("{summary}\n").into_bytes()),
        Ok(Err(why)) => ("500 Internal Server Error", format!("{why}\n").into_bytes()),
        Err(_) => (
            "503 Service Unavailable",
            b"the checkpointer stopped\n".to_vec(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Remote callers: refused without `allow_remote`; with it (which needs a token), only
    /// with the token.
    #[test]
    fn a_remote_admin_request_needs_allow_remote_and_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "t").unwrap();
        let remote: std::net::SocketAddr = "10.0.0.7:40000".parse().unwrap();
        let head = |auth: &str| format!("POST /checkpoint HTTP/1.1\r\n{auth}Host: x");
        let closed = AdminAccess {
            allow_remote: false,
            token: Some(token::AdminToken::load(&file).unwrap()),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let code = |a: &AdminAccess, h: &str| rt.block_on(a.refusal(remote, h)).map(|r| r.0);
        assert_eq!(
            code(&closed, &head("Authorization: Bearer t\r\n")),
            Some("403 Forbidden")
        );
        let open = AdminAccess {
            allow_remote: true,
            ..closed
        };
        assert_eq!(code(&open, &head("")), Some("401 Unauthorized"));
        assert_eq!(code(&open, &head("Authorization: Bearer t\r\n")), None);
        let page = "Origin: http://evil.example\r\nAuthorization: Bearer t\r\n";
        assert_eq!(code(&open, &head(page)), Some("403 Forbidden"));
    }
}
