//! The command table learned from Valkey (`walrus::commands`): a `COMMAND` reply decoded
//! into flags and key specs, then client requests classified with it (which keys each one
//! touches, found by the specs: `commands::keys::extract`).
//!
//! Input: a `COMMAND` (or `COMMAND INFO`) reply, RESP2, then requests as a client sends
//! them. Checked: no panic, whatever the table says and whatever the request holds; every
//! key index found is an argument of the request (not the command name); a command the
//! table lacks is a write of unknown keys.

use bytes::BytesMut;
use walrus::commands::{Class, CommandTable, Keys};
use walrus::resp::{Limits, ReplyScanner, RequestParser};
use walrus::upstream::client::decode_reply;

pub fn run(data: &[u8]) {
    let mut scanner = ReplyScanner::new(Limits::default());
    let Ok(Some(n)) = scanner.scan(data) else {
        return;
    };
    let Ok(frame) = decode_reply(&data[..n]) else {
        return;
    };
    let Ok(table) = CommandTable::from_frame(&frame) else {
        return;
    };
    classify(&table, &data[n..]);
}

/// Classifies every request in `requests` with `table`.
pub fn classify(table: &CommandTable, requests: &[u8]) {
    let mut parser = RequestParser::new(Limits::default());
    let mut buf = BytesMut::from(requests);
    while let Ok(Some(req)) = parser.next(&mut buf) {
        let info = table.lookup(&req.args);
        let class = Class::of(info, &req.args);
        match &class.keys {
            Keys::Args(keys) => {
                for &k in keys {
                    assert!(
                        k >= 1 && k < req.args.len(),
                        "key index {k} of {:?}",
                        req.args
                    );
                }
            }
            Keys::Unknown => {}
        }
        if info.is_none() {
            assert!(class.may_write && class.keys == Keys::Unknown);
        }
    }
}
