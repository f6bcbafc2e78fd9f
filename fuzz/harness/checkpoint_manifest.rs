//! The checkpoint manifest (`walrus::checkpoint::manifest::Recorded`, the `CHECKPOINT` file):
//! the data directory's identity, and the record a restore trusts to name its RDB, with the
//! server versions in it.
//!
//! Input: the file's bytes. Checked: no panic; a manifest that parses holds an identity, a
//! record or both, and renders to a text that parses as the same; a record in it names a
//! file inside the checkpoint directory, an RDB, and its server versions read back as
//! themselves.

use std::path::{Component, Path};
use walrus::checkpoint::manifest::{Checkpoint, Recorded};
use walrus::journal::manifest::seal;
use walrus::upstream::server::ServerVersion;

pub fn run(data: &[u8]) {
    let Some(text) = super::text(data) else {
        return;
    };
    for text in [text.to_string(), seal(text)] {
        if let Ok(m) = Recorded::parse(&text) {
            assert!(m.data_dir_id.is_some() || m.checkpoint.is_some(), "{m:?}");
            assert_eq!(
                Recorded::parse(&m.render())
                    .map_err(|e| e.to_string())
                    .as_ref(),
                Ok(&m)
            );
            if let Some(c) = &m.checkpoint {
                check_record(c);
            }
        }
    }
    for line in text.lines() {
        check_version(line);
    }
}

fn check_record(c: &Checkpoint) {
    let components: Vec<_> = Path::new(&c.file).components().collect();
    assert!(
        matches!(components[..], [Component::Normal(_)]) && c.file.ends_with(".rdb"),
        "the manifest names {:?}, not an RDB in the checkpoint directory",
        c.file
    );
    assert_eq!(
        Checkpoint::parse(&c.render())
            .map_err(|e| e.to_string())
            .as_ref(),
        Ok(c)
    );
    for v in c.servers() {
        check_version(&v.to_string());
    }
}

/// A server version as manifests record it (`Valkey 9.1.2`): it displays as it parses, and
/// a server runs every command it wrote itself.
pub fn check_version(text: &str) {
    if let Ok(v) = text.parse::<ServerVersion>() {
        assert_eq!(v.to_string().parse::<ServerVersion>().as_ref(), Ok(&v));
        assert!(v.runs_all_of(&v), "{v} does not run its own commands");
        let _ = v.check_supported();
    }
}
