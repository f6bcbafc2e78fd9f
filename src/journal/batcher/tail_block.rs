//! The open tail block: where writing resumes after a log ending at a position, the bytes of
//! that block a continuation rewrites unchanged, and the fresh durable hint it carries.

use super::super::buf::IoBuf;
use super::super::format::{
    align_down, record_fits_at, seal_crc, RecordHeader, RecordKey, HEADER_BYTES,
};
use super::super::ring::{Geometry, RingRead};

/// Whether the next record goes right after a log ending at `end` (mid-block: the next
/// write rewrites that block's bytes before `end`, returned as (block start, length)), or
/// at the next block boundary (None). It continues whenever a record fits there, the one
/// placement rule recovery also uses, so that no run, whatever its buffer size, leaves a
/// record at `end` that a later run would skip: after a crash, a stale fragment there
/// could otherwise be taken for the continuation of the log.
pub fn resume_tail(geo: Geometry, end: u64) -> Option<(u64, usize)> {
    let start = align_down(end);
    (start != end && record_fits_at(geo.seg_off(end), geo.segment_size_bytes))
        .then_some((start, (end - start) as usize))
}

/// The bytes a writer resuming at `end` rewrites (see [`resume_tail`]), read back from the
/// ring: empty when it resumes at the next block boundary.
pub fn read_tail(ring: &mut impl RingRead, geo: Geometry, end: u64) -> std::io::Result<Vec<u8>> {
    let Some((start, len)) = resume_tail(geo, end) else {
        return Ok(Vec::new());
    };
    let mut tail = vec![0; len];
    ring.read_exact_at(geo.seg_index(start), geo.seg_off(start), &mut tail)?;
    Ok(tail)
}

/// Raises the durable hint of a continuation's first new record (at `rewritten`) to the
/// durable LSN at its submission, and reseals it. A continuation rewrites the block holding
/// the previous write's last records, which are durable by the time it is submitted (it
/// waits for that write); its own records were encoded earlier, with an older hint. With
/// the fresh hint, a device that garbles those rewritten sectors (outside the torn-write
/// model: a sector is old or new) leaves evidence that acknowledged entries were damaged,
/// and recovery refuses to start instead of cutting them silently, as long as the new
/// record itself reached the disk.
pub(super) fn vouch_for_rewritten(
    key: RecordKey,
    buf: &mut IoBuf,
    rewritten: usize,
    durable_lsn: u64,
) {
    let len = buf.len();
    if rewritten == 0 || len < rewritten + HEADER_BYTES {
        return;
    }
    let rec = &mut buf.as_full_mut()[rewritten..len];
    // A buffer is opened for a record, so one follows the rewritten bytes.
    let Ok(h) = RecordHeader::parse(rec) else {
        return;
    };
    if h.durable_hint >= durable_lsn {
        return;
    }
    RecordHeader {
        durable_hint: durable_lsn,
        ..h
    }
    .write_fields(rec);
    let (hdr, payload) = rec.split_at_mut(HEADER_BYTES);
    seal_crc(key, hdr, &payload[..h.payload_len as usize]);
}
