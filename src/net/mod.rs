//! How bytes travel: one [`Stream`] for TCP, a Unix socket and TLS over TCP, and the
//! address that says which of the first two to open.

mod peer_uid;
mod stream;
pub mod tls;
mod unix_connect;

/// Certificates made in tests (the integration tests' own helper, shared).
#[cfg(test)]
#[path = "../../tests/common/certs.rs"]
mod test_certs;

pub use peer_uid::tcp_peer_uid;
use std::path::PathBuf;
pub use stream::{ReadHalf, Stream, WriteHalf};

/// How much room a read buffer has before each read from a connection: at least a quarter
/// of the connection's chunk. A buffer with less grows by a chunk, or by what the message in
/// it is known to still need when that is more ([`room_to_read`]): no read is then a few
/// bytes, and a buffer grows in few steps. The chunk follows what the connection carries.
pub mod read_chunk {
    /// A client's own connection (its session, its pinned connection to Valkey): small, as
    /// there may be `proxy.max_clients` of them, each keeping its buffer.
    pub const CLIENT: usize = 16 << 10;
    /// A pooled connection to Valkey, carrying many clients' replies: few of them, busy.
    pub const SHARED: usize = 64 << 10;
    /// A bulk transfer (Valkey's replication stream, an RDB): one at a time, read as fast as
    /// the journal or the disk takes it, in few system calls.
    pub const BULK: usize = 256 << 10;
}

/// Makes room in `buf` for the next read by [`read_chunk`]'s rule: `chunk` is the
/// connection's, `wanted` the bytes `buf` must come to hold for the message in it (0: not
/// known).
pub fn room_to_read(buf: &mut bytes::BytesMut, chunk: usize, wanted: usize) {
    if buf.capacity() - buf.len() < chunk / 4 {
        buf.reserve(chunk.max(wanted.saturating_sub(buf.len())));
    }
}

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
    use super::{read_chunk, room_to_read, Address};
    use bytes::BytesMut;

    #[test]
    fn a_read_finds_a_quarter_chunk_spare_however_full_the_buffer() {
        let chunk = read_chunk::CLIENT;
        // Full but for a few bytes (a reply in progress): grows by a chunk, so the next
        // read is not those few bytes.
        let mut buf = BytesMut::with_capacity(chunk);
        buf.resize(chunk - 8, 0);
        room_to_read(&mut buf, chunk, 0);
        assert!(buf.capacity() - buf.len() >= chunk);
        // A message known to need more than a chunk gets room for all of it at once.
        let mut buf = BytesMut::new();
        room_to_read(&mut buf, chunk, 10 * chunk);
        assert!(buf.capacity() >= 10 * chunk);
        // Room enough already: nothing is allocated.
        let mut buf = BytesMut::with_capacity(chunk);
        buf.resize(chunk / 2, 0);
        let before = buf.capacity();
        room_to_read(&mut buf, chunk, 0);
        assert_eq!(buf.capacity(), before);
    }

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
