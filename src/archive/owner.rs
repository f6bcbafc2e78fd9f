//! Whose the archive is: the manifest names its writer, and is only ever replaced by a
//! conditional write against the version read, so two walruses never both write one archive.
//! Another walrus's archive is refused, naming it; a data directory restored from the
//! archive takes it over (its writer was lost), on a timeline of its own, and the walrus it
//! replaced, if it still runs, stops writing at its next check.

use super::identity::{self, Identity};
use super::manifest::{Manifest, Writer, FORMAT};
use super::object::MANIFEST_KEY;
use super::store::Store;
use super::{ArchiveError, Version};
use std::path::Path;
use std::time::Instant;

/// The manifest as this walrus last read or wrote it.
#[derive(Debug, Clone)]
pub struct Owned {
    pub manifest: Manifest,
    pub version: Version,
    /// When the archive was last seen to be this walrus's.
    pub checked: Instant,
}

fn writer(me: &Identity) -> Writer {
    Writer {
        identity: me.id.clone(),
        name: me.name.clone(),
        since: crate::units::time::now_secs(),
    }
}

/// Reads the archive's manifest (`None`: a new archive).
pub async fn read(store: &Store) -> Result<Option<(Manifest, Version)>, ArchiveError> {
    let Some((bytes, v)) = store.get_versioned(MANIFEST_KEY).await? else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&bytes).map_err(|e| corrupt(store, e.to_string()))?;
    let m = Manifest::parse(text).map_err(|why| corrupt(store, why.to_string()))?;
    Ok(Some((m, v)))
}

fn corrupt(store: &Store, why: String) -> ArchiveError {
    ArchiveError::Corrupt(format!("{}/{MANIFEST_KEY}: {why}", store.url()))
}

/// Makes sure the archive is this walrus's: a new archive is claimed, one restored from is
/// taken over (the manifest's timeline moves on, so that the stream after the restore never
/// meets the one of the walrus before), another walrus's is refused.
pub async fn claim(store: &Store, me: &Identity, data_dir: &Path) -> Result<Owned, ArchiveError> {
    loop {
        let (next, expect) = match read(store).await? {
            None => (
                Manifest {
                    format: FORMAT,
                    writer: writer(me),
                    timeline: 0,
                    restore_points: Vec::new(),
                },
                None,
            ),
            Some((m, v)) if m.writer.identity == me.id => {
                return Ok(Owned {
                    manifest: m,
                    version: v,
                    checked: Instant::now(),
                })
            }
            Some((m, v)) if me.restored_from.as_deref() == Some(m.writer.identity.as_str()) => {
                tracing::warn!(
                    url = %store.url(),
                    previous = %m.writer.name,
                    "taking the archive over: this data directory was restored from it"
                );
                let timeline = m.timeline + 1;
                (
                    Manifest {
                        writer: writer(me),
                        timeline,
                        ..m
                    },
                    Some(v),
                )
            }
            Some((m, _)) => return Err(ArchiveError::Owner(refusal(store, &m))),
        };
        if let Ok(version) = store
            .put_if(MANIFEST_KEY, next.render().into(), expect.as_ref())
            .await?
        {
            if me.restored_from.is_some() {
                let dir = data_dir.to_path_buf();
                tokio::task::spawn_blocking(move || identity::forget_restored(&dir))
                    .await
                    .map_err(|e| ArchiveError::Local(e.to_string()))??;
            }
            return Ok(Owned {
                manifest: next,
                version,
                checked: Instant::now(),
            });
        }
        // Someone wrote it first: read it again.
    }
}

fn refusal(store: &Store, m: &Manifest) -> String {
    format!(
        "the archive {} is written by another walrus: {} (identity {}, since {}); two walruses never write one archive. Give this one another archive.url, or, if that walrus is gone for good, restore this data directory from the archive (`walrus archive restore`, or archive.bootstrap on an empty one) so that it takes the archive over",
        store.url(),
        m.writer.name,
        m.writer.identity,
        m.writer.since
    )
}

/// Replaces the manifest with `next` if it is still the version `o` read; a manifest
/// another walrus replaced is that walrus's now.
pub async fn replace(
    store: &Store,
    me: &Identity,
    o: &mut Owned,
    next: Manifest,
) -> Result<(), ArchiveError> {
    let written = store
        .put_if(MANIFEST_KEY, next.render().into(), Some(&o.version))
        .await;
    let ok = matches!(written, Ok(Ok(_)));
    crate::metrics::ARCHIVE_UPLOADS
        .with_label_values(&["manifest", if ok { "ok" } else { "error" }])
        .inc();
    match written? {
        Ok(version) => {
            *o = Owned {
                manifest: next,
                version,
                checked: Instant::now(),
            };
            Ok(())
        }
        Err(()) => match read(store).await? {
            Some((m, _)) if m.writer.identity != me.id => {
                Err(ArchiveError::Owner(refusal(store, &m)))
            }
            _ => Err(ArchiveError::Store(format!(
                "{}/{MANIFEST_KEY} changed since walrus read it; reading it again",
                store.url()
            ))),
        },
    }
}
