//! The archive's objects: their names, which say what each holds, and the journal objects'
//! format, which proves it.
//!
//! ```text
//! MANIFEST                                          the writer and the restore points
//! checkpoints/<timeline>/<offset>.<replid>.<crc64>.rdb
//!                                                   an RDB, byte for byte as Valkey sent it
//! journal/<timeline>/<start>-<end>.<replid>.<first LSN>-<last LSN>.L<level>[.T<first>-<last>].wal
//!                                                   journal entries: the stream <start>..<end>,
//!                                                   journaled from time <first> to <last>
//! ```
//!
//! Numbers are zero-padded decimal, so that keys sort as their offsets do. The times (ms
//! since the Unix epoch, of the entries that carry one) are in the name so that a listing
//! tells how far in time each restore point reaches without reading an object; an object
//! with no timed entry has no `T` part. A *timeline* is
//! one unbroken stream: every byte at an offset of a timeline is the same byte, whichever
//! object holds it, so objects of one timeline may overlap (a merged object and the ones it
//! replaces, an upload repeated after a crash) and never disagree. A new timeline starts
//! when the stream breaks (a new history whose offsets start over) or another walrus takes
//! the archive over. Each journal object holds entries of one replication id; its LSNs are
//! those of the writer's journal, for the record (the offsets are what a restore follows).
//!
//! A journal object: `WALRUSA2`, a header (timeline, first and last LSN, start and end
//! offset, entry count, level, when it was written, the replication id), the entries (LSN,
//! end offset, when walrus journaled it in ms since the Unix epoch or 0 if unrecorded,
//! length, payload), and a CRC-64 of everything before it. Objects of the first format,
//! `WALRUSA1`, are the same without the entries' times: they are read as untimed (a
//! point-in-time restore cannot place a time among them).

use super::ArchiveError;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use object_store::PutPayload;

pub const MANIFEST_KEY: &str = "MANIFEST";
const MAGIC: &[u8; 8] = b"WALRUSA2";
/// The first format: entries without their time.
const MAGIC_UNTIMED: &[u8; 8] = b"WALRUSA1";
const REPLID: usize = crate::journal::format::REPL_ID_BYTES;
const HEADER_BYTES: usize = 8 + 8 * 6 + 4 + 1 + REPLID;
const ENTRY_HEADER_BYTES: usize = 8 + 8 + 8 + 4;
const ENTRY_HEADER_BYTES_UNTIMED: usize = 8 + 8 + 4;
/// Payloads this large go into an encoded object as they are; smaller ones are copied into
/// its buffer, where a part each would cost more than the copy. Large payloads (180 KiB
/// SETs) are then neither copied nor allocated again between the journal and the store.
const SHARED_PAYLOAD_BYTES: usize = 4096;

/// A journal object, as its name says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalObject {
    pub timeline: u64,
    pub replid: [u8; REPLID],
    /// Stream offsets: the object holds `start..end`.
    pub start: u64,
    pub end: u64,
    pub first_lsn: u64,
    pub last_lsn: u64,
    /// 0 for an upload, one more than its parts' for a merge.
    pub level: u8,
    /// When the first and the last of its timed entries were journaled (ms since the Unix
    /// epoch); `None` when none is timed.
    pub times: Option<(u64, u64)>,
}

/// One entry of a journal object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedEntry {
    pub lsn: u64,
    /// The stream offset after the entry.
    pub end: u64,
    pub payload: Bytes,
    /// When walrus journaled it (ms since the Unix epoch), if recorded.
    pub time_ms: Option<u64>,
}

impl ArchivedEntry {
    pub fn start(&self) -> u64 {
        self.end - self.payload.len() as u64
    }
}

pub fn timeline_dir(kind: &str, timeline: u64) -> String {
    format!("{kind}/{timeline:08}/")
}

impl JournalObject {
    pub fn key(&self) -> String {
        format!(
            "{}{:020}-{:020}.{}.{}-{}.L{}{}.wal",
            timeline_dir("journal", self.timeline),
            self.start,
            self.end,
            String::from_utf8_lossy(&self.replid),
            self.first_lsn,
            self.last_lsn,
            self.level,
            self.times
                .map_or(String::new(), |(a, b)| format!(".T{a}-{b}"))
        )
    }

    /// What a key names, if it is a journal object's.
    pub fn parse_key(key: &str) -> Option<JournalObject> {
        let rest = key.strip_prefix("journal/")?;
        let (timeline, name) = rest.split_once('/')?;
        let name = name.strip_suffix(".wal")?;
        let mut parts = name.split('.');
        let (range, replid, lsns, level) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let times = match parts.next() {
            None => None,
            Some(t) => {
                let (a, b) = t.strip_prefix('T')?.split_once('-')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            }
        };
        if parts.next().is_some() || times.is_some_and(|(a, b)| a > b) {
            return None;
        }
        let (start, end) = range.split_once('-')?;
        let (first_lsn, last_lsn) = lsns.split_once('-')?;
        let o = JournalObject {
            timeline: timeline.parse().ok()?,
            replid: replid.as_bytes().try_into().ok()?,
            start: start.parse().ok()?,
            end: end.parse().ok()?,
            first_lsn: first_lsn.parse().ok()?,
            last_lsn: last_lsn.parse().ok()?,
            level: level.strip_prefix('L')?.parse().ok()?,
            times,
        };
        (o.start < o.end && o.first_lsn <= o.last_lsn && o.key() == key).then_some(o)
    }

    /// The object holding `entries` (all of `replid`, consecutive, at least one).
    pub fn of(timeline: u64, replid: [u8; REPLID], entries: &[ArchivedEntry], level: u8) -> Self {
        let (first, last) = (&entries[0], &entries[entries.len() - 1]);
        JournalObject {
            timeline,
            replid,
            start: first.start(),
            end: last.end,
            first_lsn: first.lsn,
            last_lsn: last.lsn,
            level,
            times: times_of(entries),
        }
    }

    /// The object's bytes, in parts: payloads of [`SHARED_PAYLOAD_BYTES`] or more are the
    /// entries' own (shared, not copied), the rest is written into the object's buffer.
    pub fn encode(&self, entries: &[ArchivedEntry], written_ms: u64) -> PutPayload {
        let copied: usize = entries
            .iter()
            .map(|e| e.payload.len())
            .filter(|&n| n < SHARED_PAYLOAD_BYTES)
            .sum();
        let mut b =
            BytesMut::with_capacity(HEADER_BYTES + entries.len() * ENTRY_HEADER_BYTES + copied + 8);
        b.put_slice(MAGIC);
        for v in [
            self.timeline,
            self.first_lsn,
            self.last_lsn,
            self.start,
            self.end,
            written_ms,
        ] {
            b.put_u64_le(v);
        }
        b.put_u32_le(entries.len() as u32);
        b.put_u8(self.level);
        b.put_slice(&self.replid);
        let mut parts = Vec::new();
        let mut crc = crc64fast::Digest::new();
        for e in entries {
            b.put_u64_le(e.lsn);
            b.put_u64_le(e.end);
            b.put_u64_le(e.time_ms.unwrap_or(0));
            b.put_u32_le(e.payload.len() as u32);
            if e.payload.len() < SHARED_PAYLOAD_BYTES {
                b.put_slice(&e.payload);
            } else {
                for part in [b.split().freeze(), e.payload.clone()] {
                    crc.write(&part);
                    parts.push(part);
                }
            }
        }
        crc.write(&b);
        b.put_u64_le(crc.sum64());
        parts.push(b.freeze());
        PutPayload::from_iter(parts)
    }

    /// The entries of an object read back, checked against its CRC, its header and this
    /// name: consecutive LSNs and offsets from `start` to `end`.
    pub fn decode(&self, bytes: Bytes) -> Result<Vec<ArchivedEntry>, ArchiveError> {
        let timed = match bytes.get(..8) {
            Some(m) if m == MAGIC => true,
            Some(m) if m == MAGIC_UNTIMED => false,
            _ => {
                return Err(ArchiveError::Malformed(
                    "not a walrus journal object (no WALRUSA2 or WALRUSA1 header)".into(),
                ))
            }
        };
        if bytes.len() < HEADER_BYTES + 8 {
            return Err(ArchiveError::Malformed("cut short".into()));
        }
        let entry_header = if timed {
            ENTRY_HEADER_BYTES
        } else {
            ENTRY_HEADER_BYTES_UNTIMED
        };
        let body = bytes.len() - 8;
        let stored = u64::from_le_bytes(bytes[body..].try_into().expect("8 bytes"));
        let crc = super::crc64(&bytes[..body]);
        if stored != crc {
            return Err(ArchiveError::Malformed(format!(
                "CRC-64 {crc:016x}, the object records {stored:016x}"
            )));
        }
        let mut h = bytes.slice(8..body);
        let header = [(); 6].map(|_| h.get_u64_le());
        let [timeline, first_lsn, last_lsn, start, end, _written_ms] = header;
        let count = h.get_u32_le() as usize;
        let level = h.get_u8();
        let replid = h.copy_to_bytes(REPLID);
        let named = JournalObject {
            timeline,
            replid: replid[..].try_into().expect("40 bytes"),
            start,
            end,
            first_lsn,
            last_lsn,
            level,
            times: self.times,
        };
        if &named != self {
            return Err(ArchiveError::Malformed(format!(
                "its header says {named:?}"
            )));
        }
        let mut out = Vec::with_capacity(count);
        let (mut at, mut lsn) = (start, first_lsn);
        for _ in 0..count {
            if h.remaining() < entry_header {
                return Err(ArchiveError::Malformed("cut short".into()));
            }
            let (e_lsn, e_end) = (h.get_u64_le(), h.get_u64_le());
            let time_ms = if timed { h.get_u64_le() } else { 0 };
            let len = h.get_u32_le() as usize;
            if h.remaining() < len || e_lsn != lsn || e_end != at + len as u64 {
                return Err(ArchiveError::Malformed(format!(
                    "entry {e_lsn} does not follow LSN {} at offset {at}",
                    lsn - 1
                )));
            }
            out.push(ArchivedEntry {
                lsn: e_lsn,
                end: e_end,
                payload: h.copy_to_bytes(len),
                time_ms: (time_ms > 0).then_some(time_ms),
            });
            at = e_end;
            lsn += 1;
        }
        if h.has_remaining() || at != end || lsn != last_lsn + 1 {
            return Err(ArchiveError::Malformed(format!(
                "its entries end at offset {at}, LSN {}",
                lsn - 1
            )));
        }
        if times_of(&out) != self.times {
            return Err(ArchiveError::Malformed(format!(
                "its entries were journaled {:?}, its name says {:?}",
                times_of(&out),
                self.times
            )));
        }
        Ok(out)
    }
}

/// When the first and the last timed entry were journaled.
fn times_of(entries: &[ArchivedEntry]) -> Option<(u64, u64)> {
    let mut times = entries.iter().filter_map(|e| e.time_ms);
    let first = times.next()?;
    Some((first, times.last().unwrap_or(first)))
}

/// A checkpoint's RDB, as its name says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointObject {
    pub timeline: u64,
    pub offset: u64,
    pub replid: String,
    pub crc64: u64,
}

impl CheckpointObject {
    pub fn key(&self) -> String {
        format!(
            "{}{:020}.{}.{:016x}.rdb",
            timeline_dir("checkpoints", self.timeline),
            self.offset,
            self.replid,
            self.crc64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(from_lsn: u64, at: u64, sizes: &[usize]) -> Vec<ArchivedEntry> {
        let mut at = at;
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                at += n as u64;
                ArchivedEntry {
                    lsn: from_lsn + i as u64,
                    end: at,
                    payload: Bytes::from(vec![b'a' + i as u8; n]),
                    time_ms: (i > 0).then_some(1000 + i as u64),
                }
            })
            .collect()
    }

    fn joined(p: &PutPayload) -> Bytes {
        p.iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn large_payloads_are_shared_with_the_object_and_still_covered_by_its_crc() {
        let replid = *b"0123456789abcdef0123456789abcdef01234567";
        let n = SHARED_PAYLOAD_BYTES;
        let es = entries(1, 0, &[10, n, n - 1, 2 * n, 3]);
        let o = JournalObject::of(1, replid, &es, 0);
        let payload = o.encode(&es, 1);
        let shared: Vec<_> = payload
            .iter()
            .filter(|part| es.iter().any(|e| e.payload.as_ptr() == part.as_ptr()))
            .map(|part| part.len())
            .collect();
        assert_eq!(shared, [n, 2 * n], "the large payloads, not copies of them");
        let bytes = joined(&payload);
        assert_eq!(o.decode(bytes.clone()).unwrap(), es);
        let mut bad = bytes.to_vec();
        bad[bytes.len() / 2] ^= 1;
        assert!(o.decode(Bytes::from(bad)).is_err());
    }

    #[test]
    fn a_journal_object_names_and_proves_what_it_holds() {
        let replid = *b"0123456789abcdef0123456789abcdef01234567";
        let es = entries(7, 100, &[3, 5, 1]);
        let o = JournalObject::of(2, replid, &es, 0);
        assert_eq!((o.start, o.end, o.first_lsn, o.last_lsn), (100, 109, 7, 9));
        let key = o.key();
        assert_eq!(
            key,
            "journal/00000002/00000000000000000100-00000000000000000109.0123456789abcdef0123456789abcdef01234567.7-9.L0.T1001-1002.wal"
        );
        assert_eq!(JournalObject::parse_key(&key), Some(o.clone()));
        let bytes = joined(&o.encode(&es, 1));
        assert_eq!(o.decode(bytes.clone()).unwrap(), es);
        // Any flipped bit is caught; so is a name that does not match the contents.
        for i in [0, 20, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.to_vec();
            bad[i] ^= 1;
            assert!(o.decode(Bytes::from(bad)).is_err(), "bit at {i}");
        }
        let other = JournalObject {
            end: 110,
            ..o.clone()
        };
        assert!(other
            .decode(bytes.clone())
            .unwrap_err()
            .to_string()
            .contains("header says"));
        // So is a name whose times are not its entries'.
        let other = JournalObject {
            times: Some((1001, 1003)),
            ..o.clone()
        };
        assert!(other
            .decode(bytes)
            .unwrap_err()
            .to_string()
            .contains("name says"));
        // An object of the first format, without the entries' times, reads as untimed.
        let mut old = BytesMut::new();
        old.put_slice(MAGIC_UNTIMED);
        for v in [2, 7, 9, 100, 109, 1] {
            old.put_u64_le(v);
        }
        old.put_u32_le(3);
        old.put_u8(0);
        old.put_slice(&replid);
        for e in &es {
            old.put_u64_le(e.lsn);
            old.put_u64_le(e.end);
            old.put_u32_le(e.payload.len() as u32);
            old.put_slice(&e.payload);
        }
        let crc = super::super::crc64(&old);
        old.put_u64_le(crc);
        let untimed: Vec<_> = es
            .iter()
            .map(|e| ArchivedEntry {
                time_ms: None,
                ..e.clone()
            })
            .collect();
        // Its name has no times (none of its entries has one).
        let o = JournalObject { times: None, ..o };
        assert_eq!(JournalObject::parse_key(&o.key()), Some(o.clone()));
        assert!(!o.key().contains(".T"));
        assert_eq!(o.decode(old.freeze()).unwrap(), untimed);
        for bad in [
            "journal/2/x.wal",
            "journal/00000002/00000000000000000109-00000000000000000100.0123456789abcdef0123456789abcdef01234567.7-9.L0.wal",
            "checkpoints/00000002/x.rdb",
            "journal/00000002/00000000000000000100-00000000000000000109.0123456789abcdef0123456789abcdef01234567.7-9.L0.T1002-1001.wal",
            "journal/00000002/00000000000000000100-00000000000000000109.0123456789abcdef0123456789abcdef01234567.7-9.L0.X1-2.wal",
        ] {
            assert_eq!(JournalObject::parse_key(bad), None, "{bad}");
        }
    }
}
