//! Retention: restore points kept by count (`archive.keep_restore_points`) and by age
//! (`archive.keep_for_ms`), the newest always; and the objects only the others needed,
//! deleted once the manifest no longer names them. A journal object is deleted only when
//! every restore point kept on its timeline starts after it.

use super::manifest::{Manifest, RestorePoint};
use super::store::Store;
use super::{timeline, ArchiveError};
use std::time::Duration;

/// Removes from `points` those past the count or older than `keep_for` (0: no such limit),
/// never the newest, nor the newest that was whole when recorded (the one a restore falls
/// back to while a newer one waits for its journal: [`RestorePoint::complete_at`]); returns
/// them.
pub fn retain(
    points: &mut Vec<RestorePoint>,
    keep: u32,
    keep_for: Duration,
    now: i64,
) -> Vec<RestorePoint> {
    points.sort_by_key(|r| (r.timeline, r.offset, r.created));
    let n = points.len();
    let whole = points.iter().rposition(|r| r.complete_at.is_none());
    let oldest_kept = now.saturating_sub(keep_for.as_secs() as i64);
    let (mut kept, mut removed) = (Vec::new(), Vec::new());
    for (i, r) in points.drain(..).enumerate() {
        let newest = i + 1 == n || Some(i) == whole;
        let by_count = keep == 0 || n - i <= keep as usize;
        let by_age = keep_for.is_zero() || r.created >= oldest_kept;
        if newest || (by_count && by_age) {
            kept.push(r);
        } else {
            removed.push(r);
        }
    }
    *points = kept;
    removed
}

/// Deletes what only the `removed` restore points needed (`m` is the manifest without them).
pub async fn delete(
    store: &Store,
    m: &Manifest,
    removed: &[RestorePoint],
) -> Result<(), ArchiveError> {
    for r in removed {
        if !m.restore_points.iter().any(|k| k.key == r.key) {
            store.delete(&r.key).await?;
        }
    }
    let mut timelines: Vec<u64> = removed.iter().map(|r| r.timeline).collect();
    timelines.sort_unstable();
    timelines.dedup();
    for t in timelines {
        let first_kept = m
            .restore_points
            .iter()
            .filter(|k| k.timeline == t)
            .map(|k| k.offset)
            .min();
        let upto = match first_kept {
            Some(offset) => offset,
            None if t == m.timeline => continue,
            None => u64::MAX,
        };
        for o in timeline::objects(store, t).await? {
            if o.end <= upto {
                store.delete(&o.key()).await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(timeline: u64, offset: u64, created: i64) -> RestorePoint {
        RestorePoint {
            timeline,
            key: format!("checkpoints/{timeline}/{offset}"),
            replid: "a".repeat(40),
            offset,
            size: 1,
            crc64: "0".into(),
            created,
            rdb_version: None,
            written_by: None,
            newest_server: None,
            time_ms: None,
            complete_at: None,
        }
    }

    #[test]
    fn retention_keeps_by_count_and_age_and_always_the_newest() {
        let day = 86_400;
        let all = || {
            (0..5)
                .map(|i| point(1, i * 10, i as i64 * day))
                .collect::<Vec<_>>()
        };
        let now = 4 * day;
        let mut p = all();
        let gone = retain(&mut p, 3, Duration::ZERO, now);
        assert_eq!((p.len(), gone.len()), (3, 2));
        assert_eq!(p[0].offset, 20);
        let mut p = all();
        let gone = retain(&mut p, 0, Duration::from_secs(2 * day as u64), now);
        assert_eq!(gone.iter().map(|r| r.offset).collect::<Vec<_>>(), [0, 10]);
        // However old, the newest stays.
        let mut p = all();
        retain(&mut p, 1, Duration::from_secs(1), 100 * day);
        assert_eq!(p.iter().map(|r| r.offset).collect::<Vec<_>>(), [40]);
    }

    /// A walrus restored from the archive took it over: its timeline's first restore point
    /// waits for its journal, so the one before it, whole, stays however few are kept.
    #[test]
    fn the_newest_whole_restore_point_stays_beside_one_waiting_for_its_journal() {
        let mut p = vec![point(1, 0, 1), point(1, 50, 2), point(2, 0, 3)];
        p[2].complete_at = Some(80);
        let gone = retain(&mut p, 1, Duration::ZERO, 10);
        assert_eq!(
            p.iter().map(|r| (r.timeline, r.offset)).collect::<Vec<_>>(),
            [(1, 50), (2, 0)]
        );
        assert_eq!(gone.len(), 1);
    }
}
