//! `[tls]` (clients to walrus) and `[upstream.tls]` (walrus to an external Valkey): TLS with
//! rustls, in Valkey's own terms (`tls-port`, `tls-cert-file`, `tls-auth-clients`, ...), so
//! that a valkey.conf's values carry over.

use serde::Deserialize;

/// TLS for clients.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Address TLS clients connect to, host:port, beside `proxy.listen` (Valkey's
    /// `tls-port`); both share `proxy.max_clients`. Empty: no TLS listener. Set
    /// `proxy.listen` to "" to accept TLS clients only.
    pub listen: String,
    /// How long a client may take to finish the TLS handshake after it connects; past it
    /// the connection is closed (`walrus_clients_rejected_total{reason="tls_handshake_timeout"}`),
    /// so that a client that connects and sends nothing holds its slot only this long.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub handshake_timeout_ms: u64,
    /// walrus's certificate chain, PEM, leaf first (`tls-cert-file`).
    pub cert_file: String,
    /// Its private key, PEM, unencrypted (`tls-key-file`).
    pub key_file: String,
    /// CA certificates client certificates are checked against (`tls-ca-cert-file`).
    pub ca_cert_file: String,
    /// A directory of CA certificates, PEM, every file read (`tls-ca-cert-dir`).
    pub ca_cert_dir: String,
    /// Client certificates: `yes` required, `optional` checked when sent, `no` not asked
    /// for (`tls-auth-clients`).
    pub auth_clients: AuthClients,
    /// A client certificate's field that names the ACL user the client runs as, without
    /// AUTH: `CN` (its subject's common name), `URI` (its first URI subject alternative
    /// name that names an enabled user), or `off` (`tls-auth-clients-user`, Valkey 9). A
    /// certificate that names no enabled user leaves its client the default user. walrus
    /// cannot show Valkey the client's certificate, so it authenticates as the user itself,
    /// which only works for a user with no password: `nopass` (docs/security.md, "TLS"). With CN or
    /// URI, such users are certificate users: AUTH naming one is refused, as Valkey refuses
    /// AUTH for a user with no password.
    pub auth_clients_user: CertUser,
    /// Protocol versions, space-separated: `TLSv1.2`, `TLSv1.3` (`tls-protocols`).
    pub protocols: String,
    /// TLS 1.2 cipher suites, colon-separated, OpenSSL's or IANA's names; empty: rustls's
    /// defaults (`tls-ciphers`).
    pub ciphers: String,
    /// TLS 1.3 cipher suites, colon-separated, IANA's names; empty: rustls's defaults
    /// (`tls-ciphersuites`).
    pub ciphersuites: String,
    /// How often the certificate, key and CA files are read again; new ones take effect for
    /// new connections (SIGHUP reads them at once too). 0: on SIGHUP only.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub reload_interval_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            listen: String::new(),
            // Far more than a handshake takes (a few round trips), short enough that clients
            // that connect and stall cannot hold proxy.max_clients' slots for long.
            handshake_timeout_ms: 10_000,
            cert_file: String::new(),
            key_file: String::new(),
            ca_cert_file: String::new(),
            ca_cert_dir: String::new(),
            auth_clients: AuthClients::Yes,
            auth_clients_user: CertUser::Off,
            protocols: DEFAULT_PROTOCOLS.into(),
            ciphers: String::new(),
            ciphersuites: String::new(),
            // A renewed certificate (cert-manager renews a third of its life before expiry)
            // is in use within a minute; reading three small files a minute costs nothing.
            reload_interval_ms: 60_000,
        }
    }
}

/// Valkey's default `tls-protocols`.
pub const DEFAULT_PROTOCOLS: &str = "TLSv1.2 TLSv1.3";

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuthClients {
    Yes,
    Optional,
    No,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub enum CertUser {
    #[serde(rename = "off")]
    Off,
    CN,
    URI,
}

/// TLS to an external Valkey, on every connection walrus opens to it.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTlsConfig {
    /// Connect to Valkey with TLS (`upstream.address` is then Valkey's `tls-port`).
    pub enabled: bool,
    /// walrus's client certificate chain, PEM, for a Valkey with `tls-auth-clients`
    /// (Valkey's `tls-client-cert-file`). During a restore Valkey is walrus's replica: with
    /// `tls-replication yes` it connects to walrus with TLS, and walrus serves this
    /// certificate then (Valkey uses its `tls-cert-file` both ways, the same way).
    pub cert_file: String,
    /// Its private key, PEM, unencrypted.
    pub key_file: String,
    /// CA certificates Valkey's certificate is checked against (and, during a restore,
    /// Valkey's client certificate).
    pub ca_cert_file: String,
    /// A directory of CA certificates, PEM, every file read.
    pub ca_cert_dir: String,
    /// The name Valkey's certificate must carry. Empty: the host of `upstream.address`.
    pub server_name: String,
    /// As `[tls]`'s.
    pub protocols: String,
    pub ciphers: String,
    pub ciphersuites: String,
}

impl Default for UpstreamTlsConfig {
    fn default() -> Self {
        UpstreamTlsConfig {
            enabled: false,
            cert_file: String::new(),
            key_file: String::new(),
            ca_cert_file: String::new(),
            ca_cert_dir: String::new(),
            server_name: String::new(),
            protocols: DEFAULT_PROTOCOLS.into(),
            ciphers: String::new(),
            ciphersuites: String::new(),
        }
    }
}
