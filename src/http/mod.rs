//! The HTTP endpoint: `/metrics` (Prometheus text format), `/healthz` (200 while the
//! process and its runtime answer), `/readyz` (200 only when walrus serves data durably;
//! otherwise 503 with a one-line reason), and `POST /checkpoint` (loopback callers only,
//! unless `metrics.admin_allow_remote`), which `walrus checkpoint` calls.

use prometheus::{Encoder, TextEncoder};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Readiness as reported on `/readyz`: `Err` says why not, in one line.
pub type Ready = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Admin requests the endpoint accepts: `POST /checkpoint` takes a checkpoint now.
#[derive(Clone)]
pub struct Admin {
    pub checkpoint: tokio::sync::mpsc::Sender<crate::checkpoint::Request>,
    /// Accept admin requests from hosts other than loopback.
    pub allow_remote: bool,
}

/// Serves the endpoint until the process exits.
/// `admin` is set once the checkpointer runs.
pub async fn serve(listener: TcpListener, ready: Ready, admin: Arc<std::sync::OnceLock<Admin>>) {
    crate::metrics::register_all();
    loop {
        let Ok((mut sock, peer)) = listener.accept().await else {
            continue;
        };
        let ready = ready.clone();
        let admin = admin.get().cloned();
        tokio::spawn(async move {
            // Requests are tiny; one bounded read is enough to see the request line.
            let mut buf = vec![0u8; 4096];
            let n =
                match tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut buf))
                    .await
                {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
            let line = String::from_utf8_lossy(&buf[..n]);
            let mut words = line.split_whitespace();
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
                (_, "/readyz") => match ready() {
                    Ok(()) => ("200 OK", b"ready\n".to_vec()),
                    Err(why) => (
                        "503 Service Unavailable",
                        format!("not ready: {why}\n").into_bytes(),
                    ),
                },
                ("POST", "/checkpoint") => checkpoint(admin.as_ref(), peer).await,
                _ => ("404 Not Found", b"not found\n".to_vec()),
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(&body).await;
        });
    }
}

async fn checkpoint(admin: Option<&Admin>, peer: std::net::SocketAddr) -> (&'static str, Vec<u8>) {
    let Some(admin) = admin else {
        return (
            "404 Not Found",
            b"durability is off: no checkpoints\n".to_vec(),
        );
    };
    if !admin.allow_remote && !peer.ip().is_loopback() {
        return (
            "403 Forbidden",
            b"admin requests are accepted from loopback only (metrics.admin_allow_remote)\n"
                .to_vec(),
        );
    }
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
