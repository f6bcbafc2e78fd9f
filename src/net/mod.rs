//! How bytes travel: one [`Stream`] for TCP, a Unix socket and TLS over TCP, and the
//! address that says which of the first two to open.

mod peer_uid;
mod stream;
pub mod tls;

/// Certificates made in tests (the integration tests' own helper, shared).
#[cfg(test)]
#[path = "../../tests/common/certs.rs"]
mod test_certs;

pub use peer_uid::tcp_peer_uid;
use std::path::PathBuf;
pub use stream::{ReadHalf, Stream, WriteHalf};

/// Where a server listens: `host:port`, or a Unix socket's path, written `unix:/path` (or
/// just an absolute path), as Valkey's own clients name one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Tcp(String),
    Unix(PathBuf),
}

impl Address {
    pub fn parse(s: &str) -> Address {
        match s.strip_prefix("unix:") {
            Some(path) => Address::Unix(PathBuf::from(path)),
            None if s.starts_with('/') => Address::Unix(PathBuf::from(s)),
            None => Address::Tcp(s.to_string()),
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(a) => f.write_str(a),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Address;

    #[test]
    fn unix_sockets_are_named_by_path() {
        assert_eq!(
            Address::parse("unix:/run/valkey/valkey.sock"),
            Address::Unix("/run/valkey/valkey.sock".into())
        );
        assert_eq!(
            Address::parse("/tmp/v.sock"),
            Address::Unix("/tmp/v.sock".into())
        );
        assert_eq!(
            Address::parse("127.0.0.1:6380"),
            Address::Tcp("127.0.0.1:6380".into())
        );
        assert_eq!(Address::parse("unix:/a").to_string(), "unix:/a");
    }
}
