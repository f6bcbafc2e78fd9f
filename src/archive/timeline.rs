//! A timeline's journal objects, read back: the fewest that carry its stream from an offset
//! on without a gap, and those left over (merged into a larger one, or uploaded twice across
//! a crash) that nothing needs.

use super::object::{timeline_dir, JournalObject};
use super::store::Store;
use super::ArchiveError;

/// The stream of a timeline from an offset on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cover {
    /// The objects to read, in stream order.
    pub objects: Vec<JournalObject>,
    /// Where they end (the start offset, when there are none).
    pub end: u64,
    /// Objects inside the covered range that no cover needs.
    pub redundant: Vec<JournalObject>,
}

impl Cover {
    /// When the last timed entry it holds was journaled: how far in time a restore from it
    /// can reach (`None`: no timed entry).
    pub fn journaled_until(&self) -> Option<u64> {
        self.objects
            .iter()
            .filter_map(|o| o.times)
            .map(|t| t.1)
            .max()
    }
}

/// Every journal object of `timeline`, in key (offset) order; names that are not a journal
/// object's are left out.
pub async fn objects(store: &Store, timeline: u64) -> Result<Vec<JournalObject>, ArchiveError> {
    let listed = store.list(&timeline_dir("journal", timeline), None).await?;
    Ok(listed
        .iter()
        .filter_map(|l| JournalObject::parse_key(&l.key))
        .collect())
}

/// The objects that carry the stream from `from` on: at each point, the one reaching
/// furthest.
pub fn cover(objects: &[JournalObject], from: u64) -> Cover {
    let mut out = Cover {
        end: from,
        ..Cover::default()
    };
    loop {
        let next = objects
            .iter()
            .filter(|o| o.start <= out.end && o.end > out.end)
            .max_by_key(|o| (o.end, o.level));
        match next {
            Some(o) => {
                out.end = o.end;
                out.objects.push(o.clone());
            }
            None => break,
        }
    }
    out.redundant = objects
        .iter()
        .filter(|o| o.start >= from && o.end <= out.end && !out.objects.contains(o))
        .cloned()
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(start: u64, end: u64, level: u8) -> JournalObject {
        JournalObject {
            timeline: 1,
            replid: [b'a'; 40],
            start,
            end,
            first_lsn: start + 1,
            last_lsn: end,
            level,
            times: None,
        }
    }

    #[test]
    fn the_cover_takes_the_furthest_object_and_stops_at_a_gap() {
        let objs = [
            o(0, 10, 0),
            o(10, 20, 0),
            o(20, 30, 0),
            o(10, 30, 1),
            o(30, 35, 0),
            o(40, 50, 0),
        ];
        let c = cover(&objs, 0);
        assert_eq!(c.objects, [o(0, 10, 0), o(10, 30, 1), o(30, 35, 0)]);
        assert_eq!(c.end, 35);
        assert_eq!(c.redundant, [o(10, 20, 0), o(20, 30, 0)]);
        // From inside an object (a checkpoint cut the stream there).
        let c = cover(&objs, 25);
        assert_eq!((c.objects.len(), c.end), (2, 35));
        // Nothing after the point: the cover is empty and ends where it starts.
        let c = cover(&objs, 36);
        assert_eq!((c.objects.len(), c.end), (0, 36));
    }
}
