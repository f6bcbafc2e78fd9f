//! Prometheus metrics and the HTTP endpoint that serves them with health and readiness.
//!
//! `/metrics`: the registry in text format. `/healthz`: 200 while the process runs.
//! `/readyz`: 200 once walrus accepts clients and has a live upstream connection, 503 before.

use prometheus::{Encoder, IntCounter, IntGauge, Registry, TextEncoder};
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

/// Readiness as reported on `/readyz`.
pub type Ready = Arc<dyn Fn() -> bool + Send + Sync>;

/// Serves the endpoint until the process exits.
pub async fn serve(listener: TcpListener, ready: Ready) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let ready = ready.clone();
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
            let path = line.split_whitespace().nth(1).unwrap_or("/");
            let (status, body) = match path {
                "/metrics" => {
                    let mut out = Vec::new();
                    let _ = TextEncoder::new().encode(&REGISTRY.gather(), &mut out);
                    ("200 OK", out)
                }
                // Answering at all is the health signal: the process and its runtime are alive.
                "/healthz" => ("200 OK", b"ok\n".to_vec()),
                "/readyz" if ready() => ("200 OK", b"ready\n".to_vec()),
                "/readyz" => ("503 Service Unavailable", b"not ready\n".to_vec()),
                _ => ("404 Not Found", b"not found\n".to_vec()),
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(&body).await;
        });
    }
}
