//! Which user opened a loopback TCP connection: the kernel lists every TCP socket of the
//! network namespace in `/proc/net/tcp`, with its owner's uid, and the peer's end of a
//! loopback connection is one of them. (A Unix socket tells this directly, `SO_PEERCRED`;
//! TCP has no such option, and Valkey replicates over TCP only.)

use std::net::{SocketAddr, SocketAddrV4};

/// The uid owning the socket at `peer` connected to `local`, both ends on this host: `None`
/// when no such socket is listed (the peer closed it already, or it is IPv6).
pub fn tcp_peer_uid(local: SocketAddr, peer: SocketAddr) -> std::io::Result<Option<u32>> {
    let (SocketAddr::V4(local), SocketAddr::V4(peer)) = (local, peer) else {
        return Ok(None);
    };
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    Ok(find_uid(&table, peer, local))
}

/// The uid of the row whose own address is `own` and whose remote one is `remote`.
fn find_uid(table: &str, own: SocketAddrV4, remote: SocketAddrV4) -> Option<u32> {
    let (own, remote) = (hex(own), hex(remote));
    table.lines().skip(1).find_map(|row| {
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
        let cols: Vec<&str> = row.split_whitespace().collect();
        (cols.get(1) == Some(&own.as_str()) && cols.get(2) == Some(&remote.as_str()))
            .then(|| cols.get(7)?.parse().ok())
            .flatten()
    })
}

/// An address as the kernel writes it there: the IPv4 address's four bytes in memory order
/// read as one native integer, then the port, both in upper-case hex.
fn hex(addr: SocketAddrV4) -> String {
    format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(addr.ip().octets()),
        addr.port()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection this process opened is found, owned by this process's user.
    #[test]
    fn a_loopback_connection_is_owned_by_the_user_who_opened_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(local).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        assert_eq!(tcp_peer_uid(local, peer).unwrap(), Some(me));
        // The listener's own end is not the peer's.
        let stranger = SocketAddr::from(([127, 0, 0, 1], 1));
        assert_eq!(tcp_peer_uid(local, stranger).unwrap(), None);
    }

    #[test]
    fn rows_are_read_as_the_kernel_writes_them() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
           0: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 12345 1\n";
        let own: SocketAddrV4 = "127.0.0.1:8080".parse().unwrap();
        let remote: SocketAddrV4 = "127.0.0.1:40000".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(find_uid(table, own, remote), Some(1000));
        }
        assert_eq!(find_uid(table, remote, own), None);
    }
}
