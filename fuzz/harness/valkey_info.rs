//! What walrus reads from Valkey's control replies: `INFO` sections (`ServerVersion`,
//! `ValkeyView`, `run_id`), `ROLE` (`valkey::role::parse_role`), `FUNCTION DUMP`'s RDB
//! version, and the status lines of the replica handshake (`handshake::take_line`, with
//! the `\n` keepalives a primary sends, and `parse_psync_reply`).
//!
//! Input: one byte of reads ([`super::reads`]), then the text; `INFO`'s three sections are
//! the parts between NUL bytes. Checked: no panic; a version reads back as itself; status
//! lines come out the same however the bytes arrive, and a PSYNC answer that parses names
//! a 40-character replication id.

use bytes::BytesMut;
use walrus::upstream::info;
use walrus::upstream::server::{dump_rdb_version, run_id_of, ServerVersion};
use walrus::valkey::handshake::{parse_psync_reply, take_line, Position, SyncStart, REPLID_LEN};
use walrus::valkey::role::{parse_role, parse_role_offset};
use walrus::valkey::view::ValkeyView;

pub fn run(data: &[u8]) {
    let mut input = super::Input::new(data);
    let seed = input.byte();
    let bytes = input.rest();
    let _ = parse_role(bytes);
    let _ = parse_role_offset(bytes);
    let _ = dump_rdb_version(bytes);
    let text = String::from_utf8_lossy(bytes);
    let mut sections = text.split('\0');
    let (server, repl, keyspace) = (
        sections.next().unwrap_or_default(),
        sections.next().unwrap_or_default(),
        sections.next().unwrap_or_default(),
    );
    if let Ok(v) = ServerVersion::parse(server) {
        super::checkpoint_manifest::check_version(&v.to_string());
    }
    let _ = run_id_of(server);
    let _ = info::field(repl, "master_replid");
    let _ = info::keys(keyspace);
    if let Ok(view) = ValkeyView::parse(server, repl, keyspace) {
        let _ = view.describe();
    }
    let whole = lines(bytes, &super::at_once(bytes.len()));
    assert_eq!(whole, lines(bytes, &super::reads(bytes.len(), seed)));
    let from = Position {
        replid: "0123456789abcdef0123456789abcdef01234567".into(),
        offset: 9,
    };
    for line in whole.0 {
        for from in [None, Some(&from)] {
            match parse_psync_reply(&line, from) {
                Ok(SyncStart::Full { replid, .. } | SyncStart::Continue { replid }) => {
                    assert_eq!(replid.len(), REPLID_LEN, "{line:?}");
                }
                Err(_) => {}
            }
        }
    }
}

/// The status lines in `bytes` arriving in `reads`, and whether reading them failed.
fn lines(bytes: &[u8], reads: &[std::ops::Range<usize>]) -> (Vec<String>, bool) {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for read in reads {
        buf.extend_from_slice(&bytes[read.clone()]);
        loop {
            match take_line(&mut buf) {
                Ok(Some(line)) => out.push(line),
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}
