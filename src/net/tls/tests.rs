//! Each check the TLS material passes at load and at a reload, on certificates made here.

use super::reload::{Reloaded, ServerTls};
use super::*;
use crate::config::{AuthClients, TlsConfig};
use std::sync::Arc;

use crate::net::test_certs::{write, Ca, Leaf};

/// A CA, walrus's certificate and key, in a directory of their own.
struct Files {
    dir: tempfile::TempDir,
    ca: Ca,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("test CA");
        write(dir.path(), "ca.crt", &ca.pem);
        let f = Files { dir, ca };
        f.serve(&Leaf::server(1));
        f
    }

    /// Writes a certificate the CA signs, and its key, as walrus's.
    fn serve(&self, leaf: &Leaf) {
        let p = self.ca.sign(leaf);
        write(self.dir.path(), "tls.crt", &p.cert);
        write(self.dir.path(), "tls.key", &p.key);
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    fn config(&self) -> TlsConfig {
        TlsConfig {
            listen: "127.0.0.1:0".into(),
            cert_file: self.path("tls.crt"),
            key_file: self.path("tls.key"),
            ca_cert_file: self.path("ca.crt"),
            ..TlsConfig::default()
        }
    }
}

fn error(c: &TlsConfig) -> String {
    match Material::from(c).served(c.auth_clients) {
        Ok(_) => panic!("accepted: {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_valid_certificate_serves_and_reports_its_expiry_and_serial() {
    let f = Files::new();
    f.serve(&Leaf {
        serial: 0x1234,
        ..Leaf::server(0)
    });
    let served = Material::from(&f.config())
        .served(AuthClients::Yes)
        .unwrap();
    // 2090-01-01T00:00:00Z
    assert_eq!(served.not_after, 3_786_912_000);
    assert!(served.serial.ends_with("12:34"), "{}", served.serial);
}

#[test]
fn an_expired_certificate_is_refused_naming_the_file() {
    let f = Files::new();
    f.serve(&Leaf::server(2).years(2020, 2021));
    let e = error(&f.config());
    assert!(
        e.starts_with(&format!("tls.cert_file = {}", f.path("tls.crt"))),
        "{e}"
    );
    assert!(e.contains("the certificate expired on"), "{e}");
}

#[test]
fn a_certificate_not_yet_valid_is_refused() {
    let f = Files::new();
    f.serve(&Leaf::server(2).years(2090, 2091));
    let e = error(&f.config());
    assert!(
        e.contains("tls.cert_file") && e.contains("not valid before"),
        "{e}"
    );
}

#[test]
fn a_key_of_another_certificate_is_refused_naming_both_files() {
    let f = Files::new();
    let other = f.ca.sign(&Leaf::server(3));
    write(f.dir.path(), "tls.key", &other.key);
    let e = error(&f.config());
    assert!(
        e.starts_with(&format!("tls.key_file = {}", f.path("tls.key"))),
        "{e}"
    );
    assert!(e.contains("is not the key of the certificate in"), "{e}");
    assert!(e.contains(&f.path("tls.crt")), "{e}");
}

#[test]
fn missing_and_unreadable_files_are_named_and_told_apart() {
    let f = Files::new();
    let mut c = f.config();
    c.cert_file = f.path("nope.crt");
    let e = Material::from(&c).served(c.auth_clients).err().unwrap();
    assert!(e.missing_file());
    assert!(e.to_string().starts_with("tls.cert_file = "), "{e}");
    let mut c = f.config();
    write(f.dir.path(), "garbage.key", "not a key\n");
    c.key_file = f.path("garbage.key");
    let e = Material::from(&c).served(c.auth_clients).err().unwrap();
    assert!(!e.missing_file());
    assert!(e.to_string().contains("no private key in PEM form"), "{e}");
    let mut c = f.config();
    c.key_file = String::new();
    assert!(error(&c).contains("tls.key_file: must be set with cert_file"));
}

#[test]
fn client_certificates_need_a_ca_unless_not_asked_for() {
    let f = Files::new();
    let mut c = f.config();
    c.ca_cert_file = String::new();
    for auth in [AuthClients::Yes, AuthClients::Optional] {
        c.auth_clients = auth;
        assert!(error(&c).starts_with("tls.ca_cert_file: must be set"));
    }
    c.auth_clients = AuthClients::No;
    assert!(Material::from(&c).served(c.auth_clients).is_ok());
}

#[test]
fn a_ca_directory_skips_what_is_not_a_certificate() {
    let f = Files::new();
    let cas = tempfile::tempdir().unwrap();
    write(cas.path(), "README", "the CAs walrus trusts\n");
    write(cas.path(), "a.pem", &f.ca.pem);
    let mut c = f.config();
    c.ca_cert_file = String::new();
    c.ca_cert_dir = cas.path().to_str().unwrap().into();
    assert!(Material::from(&c).served(c.auth_clients).is_ok());
    std::fs::remove_file(cas.path().join("a.pem")).unwrap();
    assert!(error(&c).contains("no CA certificate in"));
}

#[test]
fn protocols_and_cipher_suites_are_checked_by_name() {
    let f = Files::new();
    let mut c = f.config();
    c.protocols = "TLSv1.1".into();
    assert!(error(&c).contains("unsupported protocol \"TLSv1.1\""));
    c.protocols = "TLSv1.2".into();
    c.ciphers = "ECDHE-ECDSA-AES128-GCM-SHA256".into();
    assert!(Material::from(&c).served(c.auth_clients).is_ok());
    c.ciphers = "RC4-MD5".into();
    let e = error(&c);
    assert!(
        e.starts_with("tls.ciphers: unknown or unsupported cipher suite \"RC4-MD5\""),
        "{e}"
    );
    c.ciphers = String::new();
    c.ciphersuites = "TLS_AES_128_GCM_SHA256".into();
    c.protocols = "TLSv1.3".into();
    assert!(Material::from(&c).served(c.auth_clients).is_ok());
}

#[test]
fn a_client_certificate_names_its_cn_and_uris() {
    let ca = Ca::new("test CA");
    let (_, der) = ca.sign_der(
        &Leaf::client("alice").uris(&["urn:valkey:user:bob", "spiffe://example.org/carol"]),
    );
    let (cn, uris) = cert_names(&CertificateDer::from(der));
    assert_eq!(cn.as_deref(), Some("alice"));
    assert_eq!(uris, ["urn:valkey:user:bob", "spiffe://example.org/carol"]);
}

#[test]
fn a_reload_takes_new_files_keeps_the_old_on_an_error_and_skips_unchanged_ones() {
    let f = Files::new();
    let tls = ServerTls::load(&f.config()).unwrap();
    let first = tls.config();
    assert_eq!(tls.reload().unwrap(), Reloaded::Unchanged);
    assert!(
        Arc::ptr_eq(&first, &tls.config()),
        "rebuilt without a change"
    );

    f.serve(&Leaf::server(0x42).years(2020, 2021)); // expired
    let e = tls.reload().unwrap_err().to_string();
    assert!(e.contains("expired"), "{e}");
    assert!(
        Arc::ptr_eq(&first, &tls.config()),
        "a failed reload replaced the configuration"
    );

    let valid = f.ca.sign(&Leaf::server(0x43));
    let other = f.ca.sign(&Leaf::server(0x45));
    write(f.dir.path(), "tls.crt", &valid.cert);
    write(f.dir.path(), "tls.key", &other.key); // the key of another certificate
    assert!(tls
        .reload()
        .unwrap_err()
        .to_string()
        .contains("is not the key"));
    assert!(Arc::ptr_eq(&first, &tls.config()));

    f.serve(&Leaf::server(0x44));
    match tls.reload().unwrap() {
        Reloaded::Loaded { serial } => assert!(serial.ends_with("44"), "{serial}"),
        r => panic!("{r:?}"),
    }
    assert!(!Arc::ptr_eq(&first, &tls.config()));
    assert!(tls.serial().ends_with("44"));
}
