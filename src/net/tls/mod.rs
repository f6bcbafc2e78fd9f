//! rustls configurations built from Valkey-style settings: certificate, key and CA files,
//! protocol versions, cipher suites. Everything is checked when it is read (a certificate
//! expired or not yet valid, a key that is not the certificate's, an empty CA file), and
//! each error names the file and the problem: at start walrus refuses to run, at a reload
//! the files are kept out and the configuration in use stays ([`reload`]).

pub mod reload;
#[cfg(test)]
mod tests;

use crate::config::{AuthClients, TlsConfig, UpstreamTlsConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::rustls::{
    self, crypto::CryptoProvider, server::WebPkiClientVerifier, RootCertStore,
    SupportedCipherSuite, SupportedProtocolVersion,
};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key} = {}: {problem}", .path.display())]
    File {
        key: String,
        path: PathBuf,
        problem: String,
        /// The file does not exist (yet): worth a retry, as a secret an agent writes
        /// beside walrus may appear (see `cli::exit_code`).
        missing: bool,
    },
    #[error("{key}: {problem}")]
    Setting { key: String, problem: String },
}

fn file_error(key: &str, path: &Path, problem: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        key: key.to_string(),
        path: path.to_path_buf(),
        problem: problem.to_string(),
        missing: false,
    }
}

/// A file that cannot be read: the error says why, and whether it is only missing.
fn io_error(key: &str, path: &Path, e: std::io::Error) -> TlsError {
    TlsError::File {
        key: key.to_string(),
        path: path.to_path_buf(),
        missing: e.kind() == std::io::ErrorKind::NotFound,
        problem: e.to_string(),
    }
}

impl TlsError {
    /// A named file does not exist (yet).
    pub fn missing_file(&self) -> bool {
        matches!(self, TlsError::File { missing: true, .. })
    }
}

fn setting_error(key: &str, problem: impl std::fmt::Display) -> TlsError {
    TlsError::Setting {
        key: key.to_string(),
        problem: problem.to_string(),
    }
}

/// The settings both sides share, borrowed from `[tls]` or `[upstream.tls]`; `section`
/// prefixes the keys errors name.
pub struct Material<'a> {
    pub section: &'static str,
    pub cert_file: &'a str,
    pub key_file: &'a str,
    pub ca_cert_file: &'a str,
    pub ca_cert_dir: &'a str,
    pub protocols: &'a str,
    pub ciphers: &'a str,
    pub ciphersuites: &'a str,
}

impl<'a> From<&'a TlsConfig> for Material<'a> {
    fn from(c: &'a TlsConfig) -> Self {
        Material {
            section: "tls",
            cert_file: &c.cert_file,
            key_file: &c.key_file,
            ca_cert_file: &c.ca_cert_file,
            ca_cert_dir: &c.ca_cert_dir,
            protocols: &c.protocols,
            ciphers: &c.ciphers,
            ciphersuites: &c.ciphersuites,
        }
    }
}

impl<'a> From<&'a UpstreamTlsConfig> for Material<'a> {
    fn from(c: &'a UpstreamTlsConfig) -> Self {
        Material {
            section: "upstream.tls",
            cert_file: &c.cert_file,
            key_file: &c.key_file,
            ca_cert_file: &c.ca_cert_file,
            ca_cert_dir: &c.ca_cert_dir,
            protocols: &c.protocols,
            ciphers: &c.ciphers,
            ciphersuites: &c.ciphersuites,
        }
    }
}

/// A certificate chain with its key, checked to belong together and to be valid now.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The leaf's end of validity, seconds since the epoch (for the expiry metric).
    pub not_after: i64,
    /// The leaf's serial number, hex (logged at each reload: which certificate is served).
    pub serial: String,
}

/// A server configuration, with what the log and the metrics say about its certificate.
pub struct Served {
    pub config: rustls::ServerConfig,
    pub not_after: i64,
    pub serial: String,
}

impl Material<'_> {
    fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.section)
    }

    /// The certificate and key, if configured (both or neither).
    pub fn identity(&self) -> Result<Option<Identity>, TlsError> {
        match (self.cert_file.is_empty(), self.key_file.is_empty()) {
            (true, true) => return Ok(None),
            (false, true) => {
                return Err(setting_error(
                    &self.key("key_file"),
                    "must be set with cert_file",
                ))
            }
            (true, false) => {
                return Err(setting_error(
                    &self.key("cert_file"),
                    "must be set with key_file",
                ))
            }
            (false, false) => {}
        }
        let cert_key = self.key("cert_file");
        let cert_path = Path::new(self.cert_file);
        let chain = read_certs(&cert_key, cert_path)?;
        let key_key = self.key("key_file");
        let key_path = Path::new(self.key_file);
        let pem = std::fs::read(key_path).map_err(|e| io_error(&key_key, key_path, e))?;
        if pem.windows(9).any(|w| w == b"ENCRYPTED") {
            return Err(file_error(&key_key, key_path, "an encrypted private key; walrus reads unencrypted keys only (decrypt it: openssl pkey -in KEY -out KEY.plain)"));
        }
        let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
            file_error(
                &key_key,
                key_path,
                format!("no private key in PEM form ({e})"),
            )
        })?;
        let (not_after, serial) = check_validity(&cert_key, cert_path, &chain[0])?;
        let provider = self.provider()?;
        let signing = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| file_error(&key_key, key_path, e))?;
        let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
        if certified.keys_match().is_err() {
            return Err(file_error(
                &key_key,
                key_path,
                format!(
                    "is not the key of the certificate in {}",
                    cert_path.display()
                ),
            ));
        }
        Ok(Some(Identity {
            chain,
            key,
            not_after,
            serial,
        }))
    }

    /// The CA certificates from the file and the directory; `None` when neither is set.
    pub fn roots(&self) -> Result<Option<RootCertStore>, TlsError> {
        let mut files = Vec::new();
        if !self.ca_cert_file.is_empty() {
            files.push((self.key("ca_cert_file"), PathBuf::from(self.ca_cert_file)));
        }
        if !self.ca_cert_dir.is_empty() {
            let key = self.key("ca_cert_dir");
            let dir = Path::new(self.ca_cert_dir);
            let entries = std::fs::read_dir(dir).map_err(|e| io_error(&key, dir, e))?;
            let mut paths: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            paths.sort();
            files.extend(paths.into_iter().map(|p| (key.clone(), p)));
        }
        if files.is_empty() {
            return Ok(None);
        }
        let mut roots = RootCertStore::empty();
        for (key, path) in &files {
            // A directory may hold other files (OpenSSL's hash links point to the same
            // certificates; a README): only what parses as certificates counts.
            let certs = match read_certs(key, path) {
                Ok(c) => c,
                Err(_) if key.ends_with("ca_cert_dir") => continue,
                Err(e) => return Err(e),
            };
            for c in certs {
                roots.add(c).map_err(|e| {
                    file_error(key, path, format!("not a usable CA certificate: {e}"))
                })?;
            }
        }
        if roots.is_empty() {
            return Err(setting_error(
                &self.key("ca_cert_dir"),
                format!("no CA certificate in {}", self.ca_cert_dir),
            ));
        }
        Ok(Some(roots))
    }

    /// rustls's ring provider, cut down to the configured cipher suites.
    pub fn provider(&self) -> Result<Arc<CryptoProvider>, TlsError> {
        let mut p = rustls::crypto::ring::default_provider();
        let all = p.cipher_suites.clone();
        let mut chosen: Vec<SupportedCipherSuite> = Vec::new();
        for (key, list, tls13) in [
            ("ciphers", self.ciphers, false),
            ("ciphersuites", self.ciphersuites, true),
        ] {
            let of_version = all.iter().filter(|s| s.tls13().is_some() == tls13);
            if list.trim().is_empty() {
                chosen.extend(of_version);
                continue;
            }
            for name in list.split(':').map(str::trim).filter(|n| !n.is_empty()) {
                let found = all.iter().find(|s| {
                    s.tls13().is_some() == tls13
                        && suite_names(s).iter().any(|n| n.eq_ignore_ascii_case(name))
                });
                match found {
                    Some(s) => chosen.push(*s),
                    None => {
                        let known: Vec<String> = all
                            .iter()
                            .filter(|s| s.tls13().is_some() == tls13)
                            .map(|s| suite_names(s).join(" or "))
                            .collect();
                        return Err(setting_error(
                            &self.key(key),
                            format!(
                                "unknown or unsupported cipher suite {name:?} (supported: {})",
                                known.join(", ")
                            ),
                        ));
                    }
                }
            }
        }
        p.cipher_suites = chosen;
        Ok(Arc::new(p))
    }

    pub fn versions(&self) -> Result<Vec<&'static SupportedProtocolVersion>, TlsError> {
        let mut v = Vec::new();
        for name in self.protocols.split_whitespace() {
            match name {
                "TLSv1.2" => v.push(&rustls::version::TLS12),
                "TLSv1.3" => v.push(&rustls::version::TLS13),
                _ => {
                    return Err(setting_error(
                        &self.key("protocols"),
                        format!("unsupported protocol {name:?}: TLSv1.2 and TLSv1.3 only (older ones are broken)"),
                    ))
                }
            }
        }
        if v.is_empty() {
            return Err(setting_error(&self.key("protocols"), "names no protocol"));
        }
        Ok(v)
    }

    /// The provider and versions, checked to leave a suite to negotiate.
    fn suites(
        &self,
    ) -> Result<(Arc<CryptoProvider>, Vec<&'static SupportedProtocolVersion>), TlsError> {
        let versions = self.versions()?;
        let provider = self.provider()?;
        if !versions
            .iter()
            .any(|v| provider.cipher_suites.iter().any(|s| s.version() == *v))
        {
            return Err(setting_error(
                &self.key("ciphers"),
                "no cipher suite left for the configured protocols",
            ));
        }
        Ok((provider, versions))
    }

    /// A server's configuration: walrus's certificate, and client certificates checked as
    /// `auth` says.
    pub fn server_config(&self, auth: AuthClients) -> Result<rustls::ServerConfig, TlsError> {
        self.served(auth).map(|s| s.config)
    }

    /// [`Material::server_config`], with the certificate's expiry and serial.
    pub fn served(&self, auth: AuthClients) -> Result<Served, TlsError> {
        let id = self.identity()?.ok_or_else(|| {
            setting_error(
                &self.key("cert_file"),
                "must be set (and key_file) to serve TLS",
            )
        })?;
        let (provider, versions) = self.suites()?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| setting_error(&self.key("protocols"), e))?;
        let builder = match (auth, self.roots()?) {
            (AuthClients::No, _) => builder.with_no_client_auth(),
            (_, None) => {
                return Err(setting_error(
                    &self.key("ca_cert_file"),
                    "must be set (or ca_cert_dir) to check client certificates; or set auth_clients = \"no\"",
                ))
            }
            (auth, Some(roots)) => {
                let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let v = if auth == AuthClients::Optional {
                    v.allow_unauthenticated()
                } else {
                    v
                };
                builder.with_client_cert_verifier(v.build().map_err(|e| setting_error(&self.key("ca_cert_file"), e))?)
            }
        };
        let config = builder
            .with_single_cert(id.chain, id.key)
            .map_err(|e| setting_error(&self.key("cert_file"), e))?;
        Ok(Served {
            config,
            not_after: id.not_after,
            serial: id.serial,
        })
    }

    /// A client's configuration: the server checked against the CA, walrus's certificate
    /// presented if it has one.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let roots = self.roots()?.ok_or_else(|| {
            setting_error(
                &self.key("ca_cert_file"),
                "must be set (or ca_cert_dir) to check Valkey's certificate",
            )
        })?;
        let (provider, versions) = self.suites()?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)
            .map_err(|e| setting_error(&self.key("protocols"), e))?
            .with_root_certificates(roots);
        match self.identity()? {
            Some(id) => builder
                .with_client_auth_cert(id.chain, id.key)
                .map_err(|e| setting_error(&self.key("cert_file"), e)),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// The names a suite goes by: IANA's (rustls's, with `TLS13_` for `TLS_`), and OpenSSL's
/// for the TLS 1.2 ones that valkey.conf files use.
fn suite_names(s: &SupportedCipherSuite) -> Vec<String> {
    let rustls_name = format!("{:?}", s.suite());
    let iana = rustls_name.replacen("TLS13_", "TLS_", 1);
    let openssl = match iana.as_str() {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => "ECDHE-ECDSA-AES128-GCM-SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => "ECDHE-ECDSA-AES256-GCM-SHA384",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => "ECDHE-ECDSA-CHACHA20-POLY1305",
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => "ECDHE-RSA-AES128-GCM-SHA256",
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => "ECDHE-RSA-AES256-GCM-SHA384",
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => "ECDHE-RSA-CHACHA20-POLY1305",
        _ => "",
    };
    let mut names = vec![iana];
    if !openssl.is_empty() {
        names.push(openssl.to_string());
    }
    names
}

fn read_certs(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|e| io_error(key, path, e))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(key, path, format!("not PEM certificates ({e})")))?;
    if certs.is_empty() {
        return Err(file_error(
            key,
            path,
            "holds no certificate (PEM, BEGIN CERTIFICATE)",
        ));
    }
    Ok(certs)
}

/// Refuses a certificate that is expired or not yet valid; returns its end of validity and
/// its serial number.
fn check_validity(
    key: &str,
    path: &Path,
    cert: &CertificateDer<'_>,
) -> Result<(i64, String), TlsError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| file_error(key, path, format!("cannot parse the certificate: {e}")))?;
    let v = parsed.validity();
    let now = x509_parser::time::ASN1Time::now();
    if v.not_after < now {
        return Err(file_error(
            key,
            path,
            format!("the certificate expired on {}", v.not_after),
        ));
    }
    if v.not_before > now {
        return Err(file_error(
            key,
            path,
            format!("the certificate is not valid before {}", v.not_before),
        ));
    }
    Ok((v.not_after.timestamp(), parsed.raw_serial_as_string()))
}

/// The name walrus checks Valkey's certificate for: `server_name`, or `address`'s host.
pub fn server_name(configured: &str, address: &str) -> Result<ServerName<'static>, TlsError> {
    let name = if configured.is_empty() {
        // host:port, [v6]:port
        let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string()
    } else {
        configured.to_string()
    };
    ServerName::try_from(name.clone())
        .map_err(|e| setting_error("upstream.tls.server_name", format!("{name:?}: {e}")))
}

/// The identities a client certificate carries for the ACL user mapping: its subject's
/// common name and its URI subject alternative names.
pub fn cert_names(cert: &CertificateDer<'_>) -> (Option<String>, Vec<String>) {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert) else {
        return (None, Vec::new());
    };
    let cn = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .map(str::to_string);
    let uris = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    (cn, uris)
}
