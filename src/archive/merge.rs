//! Merging small journal objects: the newest `archive.merge_objects` of one level and one
//! history, together smaller than `archive.object_bytes`, become one object of the next
//! level, read again from the local journal (not downloaded); the parts are deleted after.
//! A restore then reads few objects however small the uploads were.

use super::object::JournalObject;
use super::read::Read;
use super::upload::{uploaded, Position, Uploaded, Uploader};
use super::ArchiveError;
use crate::units::time::now_ms;

impl Uploader {
    /// Merges the newest `archive.merge_objects` objects while they are of one level and one
    /// history and together smaller than `archive.object_bytes`.
    pub(super) async fn merge(&self, p: &mut Position) -> Result<(), ArchiveError> {
        let n = self.settings.merge_objects as usize;
        while n >= 2 && p.objects.len() >= n {
            let tail = &p.objects[p.objects.len() - n..];
            let first = &tail[0].object;
            let last = &tail[n - 1].object;
            let mergeable = tail
                .iter()
                .all(|u| u.object.level == first.level && u.object.replid == first.replid)
                && last.end - first.start <= self.settings.object_bytes
                && first.level < u8::MAX;
            if !mergeable {
                return Ok(());
            }
            let batch = self
                .read(Read {
                    from: tail[0].from,
                    next_lsn: first.first_lsn,
                    upto_lsn: last.last_lsn,
                    pos: first.start,
                    ids: vec![first.replid],
                    max_bytes: u64::MAX,
                })
                .await?;
            let complete = batch.entries.first().map(|e| e.start()) == Some(first.start)
                && batch.entries.last().map(|e| e.end) == Some(last.end);
            let keep = p.objects.len() - n;
            if !complete {
                // Released from the local journal already: these stay as they are.
                p.objects.truncate(keep);
                return Ok(());
            }
            let merged =
                JournalObject::of(p.timeline, first.replid, &batch.entries, first.level + 1);
            let r = self
                .store
                .put(&merged.key(), merged.encode(&batch.entries, now_ms()))
                .await;
            uploaded("merge", &r);
            r?;
            crate::fault::fail_point!("archive::merged");
            let parts: Vec<_> = p.objects.drain(keep..).collect();
            p.objects.push(Uploaded {
                object: merged,
                from: parts[0].from,
            });
            for u in parts {
                self.store.delete(&u.object.key()).await?;
            }
        }
        Ok(())
    }
}
