//! Certificates made in the test: a CA, and server or client certificates it signs, valid,
//! expired or not yet valid, with a CN, host names and URIs, and a chosen serial number.
//! Used by tests/it/tls.rs and by `net::tls`'s unit tests (which include this file).
#![allow(dead_code)]

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use std::path::{Path, PathBuf};

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// A certificate to make: who it names and when it is valid.
#[derive(Clone)]
pub struct Leaf {
    pub cn: String,
    /// Host names and IP addresses it is valid for (a server's).
    pub hosts: Vec<String>,
    /// URI subject alternative names (a client's, for `tls.auth_clients_user = "URI"`).
    pub uris: Vec<String>,
    pub serial: u64,
    /// Valid from and to these years (January 1st).
    pub years: (i32, i32),
}

impl Leaf {
    /// A server certificate for localhost and 127.0.0.1, valid from 2020 to 2090.
    pub fn server(serial: u64) -> Leaf {
        Leaf {
            cn: "walrus".into(),
            hosts: vec!["localhost".into(), "127.0.0.1".into()],
            uris: Vec::new(),
            serial,
            years: (2020, 2090),
        }
    }

    /// A client certificate whose subject's CN is `cn`.
    pub fn client(cn: &str) -> Leaf {
        Leaf {
            cn: cn.into(),
            hosts: Vec::new(),
            uris: Vec::new(),
            serial: 7,
            years: (2020, 2090),
        }
    }

    pub fn uris(mut self, uris: &[&str]) -> Leaf {
        self.uris = uris.iter().map(|u| u.to_string()).collect();
        self
    }

    pub fn years(mut self, from: i32, to: i32) -> Leaf {
        self.years = (from, to);
        self
    }
}

/// A certificate and its private key, PEM.
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2095, 1, 1);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A certificate this CA signs.
    pub fn sign(&self, leaf: &Leaf) -> Pair {
        self.sign_der(leaf).0
    }

    /// [`Ca::sign`], with the certificate's DER (what a TLS peer receives).
    pub fn sign_der(&self, leaf: &Leaf) -> (Pair, Vec<u8>) {
        let mut params = CertificateParams::new(leaf.hosts.clone()).unwrap();
        params.distinguished_name.push(DnType::CommonName, &leaf.cn);
        for u in &leaf.uris {
            params
                .subject_alt_names
                .push(SanType::URI(u.as_str().try_into().unwrap()));
        }
        params.serial_number = Some(SerialNumber::from(leaf.serial));
        params.not_before = rcgen::date_time_ymd(leaf.years.0, 1, 1);
        params.not_after = rcgen::date_time_ymd(leaf.years.1, 1, 1);
        params.extended_key_usages = if leaf.hosts.is_empty() {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (
            Pair {
                cert: cert.pem(),
                key: key.serialize_pem(),
            },
            cert.der().to_vec(),
        )
    }
}

/// Writes `text` to `dir/name`, replacing it whole (a rename, as Kubernetes and
/// cert-manager do: a reader never sees half a file).
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}
