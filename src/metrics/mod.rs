//! Prometheus metrics and the HTTP endpoint that serves them with health and readiness.
//!
//! `/metrics`: the registry in text format. `/healthz`: 200 while the process runs.
//! `/readyz`: 200 while walrus accepts clients, has a live upstream connection and (when
//! durable) its journal follows Valkey's stream; 503 before and during a restore.
//! `POST /checkpoint` (loopback callers only, unless `metrics.admin_allow_remote`): take a
//! checkpoint now; `walrus checkpoint` calls it.

use prometheus::{Encoder, Gauge, GaugeVec, IntCounter, IntGauge, Opts, Registry, TextEncoder};
use std::sync::{Arc, LazyLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub static REGISTRY: LazyLock<Registry> =
    LazyLock::new(|| Registry::new_custom(Some("walrus".into()), None).expect("registry"));

fn counter(name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("metric");
    REGISTRY
        .register(Box::new(c.clone()))
        .expect("register metric");
    c
}

fn gauge(name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("metric");
    REGISTRY
        .register(Box::new(g.clone()))
        .expect("register metric");
    g
}

pub static CLIENTS: LazyLock<IntGauge> =
    LazyLock::new(|| gauge("clients_connected", "Client connections open now."));
pub static CLIENTS_REJECTED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "clients_rejected_total",
        "Connections refused because max_clients was reached.",
    )
});
pub static COMMANDS: LazyLock<IntCounter> =
    LazyLock::new(|| counter("commands_total", "Client commands received."));
pub static PROTOCOL_ERRORS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "protocol_errors_total",
        "Client connections closed for a protocol error.",
    )
});
pub static UPSTREAM_ERRORS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "upstream_errors_total",
        "Requests answered with an error because Valkey was unreachable.",
    )
});
pub static UPSTREAM_RECONNECTS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "upstream_reconnects_total",
        "Pooled upstream connections re-established.",
    )
});
pub static PINNED_SESSIONS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pinned_sessions_total",
        "Client sessions moved to a dedicated upstream connection.",
    )
});

pub static RESTORE_IN_PROGRESS: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "restore_in_progress",
        "1 while walrus loads Valkey from its checkpoint and journal.",
    )
});
pub static RESTORE_TOTAL_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "restore_total_bytes",
        "Bytes the current (or last) restore sends: checkpoint RDB plus journal stream.",
    )
});
pub static RESTORE_SENT_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "restore_sent_bytes",
        "Bytes the current (or last) restore has sent to Valkey.",
    )
});
pub static RESTORES: LazyLock<IntCounter> =
    LazyLock::new(|| counter("restores_total", "Restores completed."));

fn register<M: prometheus::core::Collector + Clone + 'static>(m: M) -> M {
    REGISTRY
        .register(Box::new(m.clone()))
        .expect("register metric");
    m
}

pub static DISK_USED: LazyLock<GaugeVec> = LazyLock::new(|| {
    register(
        GaugeVec::new(
            Opts::new(
                "disk_used_ratio",
                "Fraction of the file system in use (as df counts it), by volume: journal, checkpoints.",
            ),
            &["volume"],
        )
        .expect("metric"),
    )
});
pub static RING_FILL: LazyLock<Gauge> = LazyLock::new(|| {
    register(
        Gauge::new(
            "journal_ring_fill_ratio",
            "Fraction of the journal ring's segments in use (not yet released by a checkpoint).",
        )
        .expect("metric"),
    )
});
pub static WATERMARK_REACHED: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "disk_watermark_reached",
        "1 while new writes are refused because a disk or ring figure passed disk.high_watermark.",
    )
});
pub static WRITES_REFUSED_DISK: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "writes_refused_disk_total",
        "Writes answered -MISCONF because a disk watermark was reached.",
    )
});
pub static JOURNAL_FAILED: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "journal_failed",
        "1 once the journal failed (an I/O error): writes are refused until walrus restarts.",
    )
});
pub static CHECKPOINTS: LazyLock<IntCounter> =
    LazyLock::new(|| counter("checkpoints_total", "Checkpoints taken."));
pub static CHECKPOINT_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "checkpoint_failures_total",
        "Checkpoints that failed or were not started (no room on disk, Valkey unreachable, ...).",
    )
});

/// Registers every family, so that a scrape shows each one (at zero) before its first event.
fn register_all() {
    LazyLock::force(&CLIENTS);
    LazyLock::force(&CLIENTS_REJECTED);
    LazyLock::force(&COMMANDS);
    LazyLock::force(&PROTOCOL_ERRORS);
    LazyLock::force(&UPSTREAM_ERRORS);
    LazyLock::force(&UPSTREAM_RECONNECTS);
    LazyLock::force(&PINNED_SESSIONS);
    LazyLock::force(&RESTORE_IN_PROGRESS);
    LazyLock::force(&RESTORE_TOTAL_BYTES);
    LazyLock::force(&RESTORE_SENT_BYTES);
    LazyLock::force(&RESTORES);
    LazyLock::force(&DISK_USED);
    LazyLock::force(&RING_FILL);
    LazyLock::force(&WATERMARK_REACHED);
    LazyLock::force(&WRITES_REFUSED_DISK);
    LazyLock::force(&JOURNAL_FAILED);
    LazyLock::force(&CHECKPOINTS);
    LazyLock::force(&CHECKPOINT_FAILURES);
}

/// Readiness as reported on `/readyz`.
pub type Ready = Arc<dyn Fn() -> bool + Send + Sync>;

/// Admin requests the endpoint accepts: `POST /checkpoint` takes a checkpoint now.
#[derive(Clone)]
pub struct Admin {
    pub checkpoint: tokio::sync::mpsc::Sender<crate::checkpoint::Request>,
    /// Accept admin requests from hosts other than loopback.
    pub allow_remote: bool,
}

/// Serves the endpoint until the process exits.
pub async fn serve(listener: TcpListener, ready: Ready, admin: Option<Admin>) {
    register_all();
    loop {
        let Ok((mut sock, peer)) = listener.accept().await else {
            continue;
        };
        let ready = ready.clone();
        let admin = admin.clone();
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
                    let _ = TextEncoder::new().encode(&REGISTRY.gather(), &mut out);
                    ("200 OK", out)
                }
                // Answering at all is the health signal: the process and its runtime are alive.
                (_, "/healthz") => ("200 OK", b"ok\n".to_vec()),
                (_, "/readyz") if ready() => ("200 OK", b"ready\n".to_vec()),
                (_, "/readyz") => ("503 Service Unavailable", b"not ready\n".to_vec()),
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
