//! The journal's manifest (`walrus::journal::manifest`): the sealed text read at every open.
//!
//! Input: the file's bytes. Checked: no panic; a manifest that parses gives its key and
//! checkpoint without panicking, and renders to a text that parses as the same manifest;
//! the input sealed as a manifest's body reads the same way, and with a bit of it flipped it
//! is refused.

use walrus::journal::manifest::{seal, Manifest};

pub fn run(data: &[u8]) {
    let Some(text) = super::text(data) else {
        return;
    };
    if let Ok(m) = Manifest::parse(text) {
        let _ = m.record_keys();
        let _ = m.checkpoint.prev_repl_id();
        let again = Manifest::parse(&m.render()).expect("a rendered manifest parses");
        assert_eq!(again, m);
    }
    // As the input were a manifest's body: sealed, it reads back; damaged, it does not.
    let sealed = seal(text);
    let m = Manifest::parse(&sealed);
    if let Ok(m) = &m {
        assert_eq!(Manifest::parse(&m.render()).as_ref().ok(), Some(m));
    }
    if let Some(at) = sealed.find(|c: char| c.is_ascii_alphanumeric()) {
        let mut damaged = sealed.clone().into_bytes();
        damaged[at] ^= 0x01;
        if let Ok(d) = std::str::from_utf8(&damaged) {
            assert!(
                Manifest::parse(d).is_err(),
                "a damaged manifest read: {d:?}"
            );
        }
    }
}
