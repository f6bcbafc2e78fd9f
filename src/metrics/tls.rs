//! The families of client-facing TLS: connections refused before a session starts, the
//! certificate in use and its reloads, and the ACL users client certificates map to.
//!
//! Registered only when `tls.listen` is set ([`register_tls`]): an expiry gauge at 0 on a
//! walrus without TLS would fire every expiry alert.

use super::{counter_vec, gauge, CLIENTS_REJECTED_VEC};
use prometheus::{IntCounterVec, IntGauge};
use std::sync::LazyLock;

pub static TLS_CERT_EXPIRY: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "tls_certificate_expiry_timestamp_seconds",
        "When the certificate walrus serves to TLS clients expires, seconds since the epoch (the one in use: a failed reload leaves the old one).",
    )
});

static TLS_RELOADS_VEC: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "tls_reloads_total",
        "Reads of the TLS certificate, key and CA files (every tls.reload_interval_ms, and on SIGHUP), by result: loaded (changed, in use for new connections), unchanged, failed (kept out: the configuration in use stays; the log names the file and the problem).",
        &["result"],
    )
});

/// The outcome of one reading of the TLS files.
#[derive(Debug, Clone, Copy)]
pub enum TlsReload {
    Loaded,
    Unchanged,
    Failed,
}

impl TlsReload {
    const ALL: [TlsReload; 3] = [TlsReload::Loaded, TlsReload::Unchanged, TlsReload::Failed];

    fn label(self) -> &'static str {
        match self {
            TlsReload::Loaded => "loaded",
            TlsReload::Unchanged => "unchanged",
            TlsReload::Failed => "failed",
        }
    }

    pub fn count(self) {
        TLS_RELOADS_VEC.with_label_values(&[self.label()]).inc();
    }
}

/// Why a connection to the TLS port ended before its session started.
#[derive(Debug, Clone, Copy)]
pub enum TlsRejected {
    /// Its first bytes were not a TLS handshake (a plaintext client on the TLS port).
    Plaintext,
    /// It did not finish the handshake within `tls.handshake_timeout_ms`.
    HandshakeTimeout,
    /// The handshake failed: no or an untrusted client certificate, no common protocol or
    /// cipher suite, a client that does not trust walrus's certificate.
    HandshakeFailed,
}

impl TlsRejected {
    const ALL: [TlsRejected; 3] = [
        TlsRejected::Plaintext,
        TlsRejected::HandshakeTimeout,
        TlsRejected::HandshakeFailed,
    ];

    fn label(self) -> &'static str {
        match self {
            TlsRejected::Plaintext => "tls_plaintext",
            TlsRejected::HandshakeTimeout => "tls_handshake_timeout",
            TlsRejected::HandshakeFailed => "tls_handshake_failed",
        }
    }

    pub fn count(self) {
        CLIENTS_REJECTED_VEC
            .with_label_values(&[self.label()])
            .inc();
    }
}

static TLS_CERT_USERS_VEC: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "tls_cert_users_total",
        "TLS clients whose certificate was looked up as an ACL user (tls.auth_clients_user), by result: mapped (the client runs as that user), unmapped (no enabled user of that name: the default user), refused (the user has a password, or Valkey could not be asked: the connection is closed with an error), auth_refused (a client's AUTH or HELLO AUTH named a certificate user, which has no password to give).",
        &["result"],
    )
});

/// The outcome of mapping a client certificate to an ACL user.
#[derive(Debug, Clone, Copy)]
pub enum CertUserResult {
    Mapped,
    Unmapped,
    Refused,
    AuthRefused,
}

impl CertUserResult {
    const ALL: [CertUserResult; 4] = [
        CertUserResult::Mapped,
        CertUserResult::Unmapped,
        CertUserResult::Refused,
        CertUserResult::AuthRefused,
    ];

    fn label(self) -> &'static str {
        match self {
            CertUserResult::Mapped => "mapped",
            CertUserResult::Unmapped => "unmapped",
            CertUserResult::Refused => "refused",
            CertUserResult::AuthRefused => "auth_refused",
        }
    }

    pub fn count(self) {
        TLS_CERT_USERS_VEC.with_label_values(&[self.label()]).inc();
    }
}

/// Registers the TLS families, each label at 0, once a TLS listener is configured.
pub fn register_tls() {
    LazyLock::force(&TLS_CERT_EXPIRY);
    for r in TlsReload::ALL {
        let _ = TLS_RELOADS_VEC.with_label_values(&[r.label()]);
    }
    for r in TlsRejected::ALL {
        let _ = CLIENTS_REJECTED_VEC.with_label_values(&[r.label()]);
    }
    for r in CertUserResult::ALL {
        let _ = TLS_CERT_USERS_VEC.with_label_values(&[r.label()]);
    }
}
