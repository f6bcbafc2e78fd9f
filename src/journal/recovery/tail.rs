//! The end of the log, decided: a torn tail or mid-log corruption.
//!
//! The scan stops at the first position that holds no next record. What follows decides
//! which it is (see the module doc of `recovery`): a valid record of the current lap further
//! on whose durable hint covers the missing entry proves that entry had been acknowledged,
//! so the gap is corruption; without such proof the tail is torn and is cut silently. And
//! a log that ends at its very first record may be another journal's key on this ring
//! ([`key_seals_the_ring`]).

use super::super::error::{Corruption, JournalError};
use super::super::format::{RecordHeader, HEADER_BYTES};
use super::super::ring::{Geometry, RingRead};
use super::candidate::{Candidates, Reject};
use super::report::Tail;
use super::start::ScanLimits;

/// Where a scan stopped: the first position that holds no next record.
pub(super) struct Stop {
    pub pos: u64,
    /// The LSN that belongs there (that of the entry in progress, if its fragments stop).
    pub expected_lsn: u64,
    /// Epoch of the log's last accepted record.
    pub last_epoch: u32,
    /// Why the position holds no next record.
    pub reason: String,
    /// Where the ring's writable bytes from the scan's start end.
    pub limit_pos: u64,
}

/// How the log ends at `stop`: corrupt when the look-ahead finds evidence, else a normal
/// end.
pub(super) fn classify<R: RingRead>(cand: &mut Candidates<R>, stop: Stop) -> std::io::Result<Tail> {
    let geo = cand.geo;
    Ok(match look_ahead(cand, &stop)? {
        Some((epos, eh)) => Tail::Corrupt(Corruption {
            pos: stop.pos,
            segment_index: geo.seg_index(stop.pos),
            segment_offset: geo.seg_off(stop.pos),
            expected_lsn: stop.expected_lsn,
            reason: stop.reason,
            evidence_pos: epos,
            evidence_lsn: eh.lsn,
            evidence_durable_hint: eh.durable_hint,
        }),
        None => Tail::End {
            pos: stop.pos,
            reason: stop.reason,
        },
    })
}

/// Searches the bytes from `stop.pos` on for a valid current-lap record, of an epoch not
/// older than the log's last record (nor than the newest run's, past where it began),
/// whose durable hint covers `stop.expected_lsn`. Every
/// position holding the magic is a candidate; only keyed records count (a client's
/// value may hold anything, but not the key). A valid record that is not evidence is
/// stepped over whole.
fn look_ahead<R: RingRead>(
    cand: &mut Candidates<R>,
    stop: &Stop,
) -> std::io::Result<Option<(u64, RecordHeader)>> {
    let (bad_pos, expected_lsn) = (stop.pos, stop.expected_lsn);
    let limits = cand.limits;
    // The log's own epochs never decrease; and where the log still ends where the
    // newest run's open said it ends, anything older past it was cut by that open.
    let cut_by_last_open = limits.resumed_at_pos.is_some_and(|r| bad_pos >= r);
    let min_epoch = if cut_by_last_open {
        stop.last_epoch.max(limits.max_epoch)
    } else {
        stop.last_epoch
    };
    let end = (bad_pos.saturating_add(limits.lookahead_bytes)).min(stop.limit_pos);
    let mut p = bad_pos;
    while let Some(c) = cand.find_magic(p, end)? {
        p = c + 1;
        let Ok(h) = cand.decode_at(c)? else {
            continue;
        };
        if h.seg_seq == cand.geo.seg_seq(c)
            && h.lsn > expected_lsn
            && h.durable_hint >= expected_lsn
            && (min_epoch..=limits.max_epoch).contains(&h.epoch)
        {
            return Ok(Some((c, h)));
        }
        p = c + HEADER_BYTES as u64 + u64::from(h.payload_len);
    }
    Ok(None)
}

/// Whether the manifest's key is its ring's. A manifest copied in from another journal has
/// another key: every record of this ring then fails its checksum, and a scan reads the log
/// as empty (a clean end at its first record), losing it. Asked when a scan accepted no
/// record although the manifest says entries were written: the ring then holds records of
/// this journal (the released ones, or older laps'), sealed with its key, unless the key is
/// not its own. `false`: the ring holds well-formed records and not one is sealed with the
/// key (a client's value may hold record-like bytes, never the key). Reads only until the
/// first record that is, which in a journal's own ring comes soon.
pub fn key_seals_the_ring<R: RingRead>(
    ring: R,
    geo: Geometry,
    limits: ScanLimits,
) -> Result<bool, JournalError> {
    let mut s = Candidates::new(ring, geo, limits);
    let io = |e| JournalError::io("reading journal segments", e);
    let (mut p, mut sealed_otherwise) = (0, false);
    while let Some(c) = s.find_magic(p, geo.ring_bytes()).map_err(io)? {
        p = c + 1;
        match s.decode_at(c).map_err(io)? {
            Ok(_) => return Ok(true),
            Err(Reject::Crc | Reject::Format(_)) => sealed_otherwise = true,
            Err(_) => {}
        }
    }
    Ok(!sealed_otherwise)
}
