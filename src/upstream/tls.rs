//! TLS to an external Valkey (`[upstream.tls]`), on every connection walrus opens to it:
//! the pool's pipelines, pinned sessions, the replica link and its acknowledgements,
//! checkpoints, control connections. The rustls configurations are built once, at start,
//! from the files ([`crate::net::tls::Material`] checks them: expired, key mismatch, no CA),
//! and each [`super::client::Conn::connect`] does its handshake within
//! `upstream.connect_timeout_ms`.
//!
//! A restore reverses the roles: Valkey becomes walrus's replica and, with Valkey's
//! `tls-replication yes`, connects to walrus's restore listener with TLS. walrus then serves
//! the same certificate (Valkey uses its own `tls-cert-file` both ways too) and checks
//! Valkey's client certificate against the same CA: [`UpstreamTls::replication`]
//! (whether Valkey does: [`super::settings::replicates_with_tls`]).

use super::error::UpstreamError;
use crate::config::{AuthClients, UpstreamTlsConfig};
use crate::net::tls::{self, Material};
use crate::net::Stream;
use rustls_pki_types::ServerName;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::rustls::{self, AlertDescription, CertificateError};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The TLS side of [`super::Upstream`]: how walrus checks Valkey, and what it shows it.
pub struct UpstreamTls {
    connector: TlsConnector,
    /// The name Valkey's certificate must carry (`server_name`, or the address's host).
    name: ServerName<'static>,
    /// walrus's certificate as a server, for Valkey connecting as walrus's replica during a
    /// restore; `None` without `cert_file` (a restore of a Valkey with `tls-replication yes`
    /// then fails, saying so).
    replication: Option<TlsAcceptor>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("name", &self.name)
            .field("replication", &self.replication.is_some())
            .finish()
    }
}

impl UpstreamTls {
    /// Reads and checks `[upstream.tls]`'s files for a Valkey at `address`; `None` when TLS
    /// is off. Every error names the key and the file.
    pub fn from_config(
        c: &UpstreamTlsConfig,
        address: &str,
    ) -> Result<Option<Arc<UpstreamTls>>, UpstreamError> {
        if !c.enabled {
            return Ok(None);
        }
        let material = Material::from(c);
        let client = material.client_config()?;
        let name = tls::server_name(&c.server_name, address)?;
        // The restore listener checks Valkey's client certificate as Valkey's
        // `tls-auth-clients yes` checks walrus's: against the same CA.
        let replication = match material.identity()? {
            Some(_) => Some(TlsAcceptor::from(Arc::new(
                material.server_config(AuthClients::Yes)?,
            ))),
            None => None,
        };
        Ok(Some(Arc::new(UpstreamTls {
            connector: TlsConnector::from(Arc::new(client)),
            name,
            replication,
        })))
    }

    /// The TLS handshake on a connection to Valkey at `addr` (the caller bounds its time).
    pub async fn connect(&self, tcp: TcpStream, addr: &str) -> Result<Stream, UpstreamError> {
        match self.connector.connect(self.name.clone(), tcp).await {
            Ok(s) => Ok(Stream::Tls(Box::new(s.into()))),
            Err(e) => Err(UpstreamError::Tls {
                addr: addr.to_string(),
                problem: explain(&e, Side::Client(Some(&self.name))),
            }),
        }
    }

    /// The server side of a restore, for a Valkey that replicates with TLS.
    pub fn replication(&self) -> Option<&TlsAcceptor> {
        self.replication.as_ref()
    }
}

/// Whether rustls stands behind this I/O error (an alert, a certificate problem).
pub fn is_tls_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some())
}

/// Which end of a TLS connection walrus is, for [`explain`].
pub enum Side<'a> {
    /// walrus connected to Valkey; the name it checked Valkey's certificate for, if known.
    Client(Option<&'a ServerName<'a>>),
    /// Valkey connected to walrus's restore listener as its replica.
    Server,
}

/// What a failed handshake means, in the operator's terms: the rustls error under the I/O
/// error names the certificate problem or the peer's alert.
pub fn explain(e: &std::io::Error, side: Side<'_>) -> String {
    let name = match side {
        Side::Client(name) => name,
        Side::Server => None,
    };
    let serving = matches!(side, Side::Server);
    let Some(r) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return format!("{e} (is TLS served at this address?)");
    };
    let ca = "upstream.tls.ca_cert_file / ca_cert_dir";
    match r {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                format!("the peer's certificate is not trusted: no CA in {ca} signed it ({r})")
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "the peer's certificate is not valid for the name {} (upstream.tls.server_name; empty: the host of upstream.address): {r}",
                    name.map(|n| n.to_str().into_owned()).unwrap_or_default()
                )
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                format!("the peer's certificate has expired: {r}")
            }
            _ => format!("the peer's certificate was refused: {r}"),
        },
        rustls::Error::NoCertificatesPresented => {
            format!("the peer sent no certificate, and one signed by a CA in {ca} is required: {r}")
        }
        rustls::Error::AlertReceived(
            a @ (AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateRequired
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown),
        ) => {
            if serving {
                format!("Valkey refused walrus's certificate ({a:?}): upstream.tls.cert_file must be signed by a CA in Valkey's tls-ca-cert-file and valid as a server certificate")
            } else {
                format!("the peer refused walrus's client certificate, or its absence ({a:?}): upstream.tls.cert_file and key_file must name one signed by a CA the peer trusts (Valkey's tls-ca-cert-file)")
            }
        }
        rustls::Error::InvalidMessage(_) => {
            format!("{r} (is TLS served at this address, Valkey's tls-port?)")
        }
        _ => r.to_string(),
    }
}
