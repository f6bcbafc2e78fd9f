//! Restore points: a local checkpoint uploaded and recorded in the archive's manifest (with
//! retention applied in the same write), and the manifest kept up to date with the newest
//! Valkey that fed the journal since.

use super::manifest::RestorePoint;
use super::object::CheckpointObject;
use super::owner::Owned;
use super::upload::{created, uploaded, Uploader};
use super::ArchiveError;
use crate::checkpoint::manifest::Checkpoint;
use crate::units::time::now_secs;

impl Uploader {
    /// Valkey was upgraded under walrus after the checkpoint (its record names a newer
    /// server, [`crate::checkpoint::store::Store::note_server`]): the restore points of that
    /// checkpoint say so too, so that a restore from the archive refuses an older Valkey as
    /// one from the local disk does.
    pub(super) async fn note_server(
        &self,
        o: &mut Owned,
        lc: &Checkpoint,
    ) -> Result<(), ArchiveError> {
        let same = |r: &RestorePoint| r.of_checkpoint(lc);
        if !o
            .manifest
            .restore_points
            .iter()
            .any(|r| same(r) && r.newest_server != lc.newest_server)
        {
            return Ok(());
        }
        let mut next = o.manifest.clone();
        for r in next.restore_points.iter_mut().filter(|r| same(r)) {
            r.newest_server = lc.newest_server.clone();
        }
        super::owner::replace(&self.store, &self.identity, o, next).await
    }

    /// Uploads the local checkpoint `lc` (unless the archive has its RDB already) and records
    /// it as a restore point on `timeline` (whole once the timeline's journal objects reach
    /// `complete_at`: [`RestorePoint::complete_at`]), applying retention in the same manifest
    /// write. `false`: the checkpoint was replaced (its file deleted, or its name given to a newer
    /// RDB) before it could be read.
    pub(super) async fn add_point(
        &self,
        o: &mut Owned,
        lc: &Checkpoint,
        timeline: u64,
        complete_at: Option<u64>,
    ) -> Result<bool, ArchiveError> {
        let crc = format!("{:016x}", lc.crc64);
        let existing = o
            .manifest
            .restore_points
            .iter()
            .find(|r| r.of_checkpoint(lc))
            .map(|r| r.key.clone());
        let key = match existing {
            Some(k) => k,
            None => {
                let key = CheckpointObject {
                    timeline,
                    offset: lc.offset,
                    replid: lc.replid.clone(),
                    crc64: lc.crc64,
                }
                .key();
                // Opened before anything else: a newer checkpoint deletes the file's name,
                // and the open file stays readable.
                let file = match std::fs::File::open(self.local.path_of(lc)) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        if self.local.recorded().is_some_and(|now| now.file != lc.file) {
                            return Ok(false);
                        }
                        // Still the recorded one: someone deleted it. Going round again at
                        // once would spin on it; the next checkpoint carries the archive on,
                        // so one is asked for, and retries with backoff say why meanwhile.
                        self.request_checkpoint("the recorded checkpoint's file is gone");
                        let gone = Err(ArchiveError::Local(format!(
                            "the recorded checkpoint {} is gone from the data directory; \
                             a checkpoint is asked for, and the archive goes on from it",
                            self.local.path_of(lc).display()
                        )));
                        uploaded("checkpoint", &gone);
                        return gone;
                    }
                    Err(e) => {
                        return Err(ArchiveError::Local(format!(
                            "opening {}: {e}",
                            self.local.path_of(lc).display()
                        )))
                    }
                };
                // Names are given again once no record names them: the file is `lc`'s only
                // if `lc` is still the recorded checkpoint now that it is open.
                if self.local.recorded().as_ref() != Some(lc) {
                    return Ok(false);
                }
                let r = self.store.put_file(&key, file, lc.size).await;
                uploaded("checkpoint", &r);
                r?;
                crate::fault::fail_point!("archive::checkpoint_uploaded");
                key
            }
        };
        let now = now_secs();
        let mut next = o.manifest.clone();
        next.timeline = next.timeline.max(timeline);
        next.restore_points.push(RestorePoint {
            timeline,
            key,
            replid: lc.replid.clone(),
            offset: lc.offset,
            size: lc.size,
            crc64: crc,
            created: now,
            rdb_version: lc.rdb_version,
            written_by: lc.written_by.clone(),
            newest_server: lc.newest_server.clone(),
            time_ms: lc.time_ms,
            complete_at,
        });
        let removed = super::retention::retain(
            &mut next.restore_points,
            self.settings.keep_restore_points,
            self.settings.keep_for,
            now,
        );
        super::owner::replace(&self.store, &self.identity, o, next).await?;
        self.status
            .restore_points(o.manifest.timeline, &created(&o.manifest));
        tracing::info!(
            url = %self.status.url,
            timeline,
            offset = lc.offset,
            size = lc.size,
            "archive: restore point recorded"
        );
        if !removed.is_empty() {
            super::retention::delete(&self.store, &o.manifest, &removed).await?;
        }
        Ok(true)
    }
}
