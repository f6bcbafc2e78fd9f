//! The configuration file (`walrus::config::Config`): parsed, validated, and then every
//! figure walrus derives from a valid configuration.
//!
//! Input: the file's bytes. Checked: no panic; a configuration that validates has a valid
//! `[journal]`, and the figures derived from it make sense: the ring's own watermarks
//! within 0 < low < high < 1 and no higher than the disk's, a checkpoint trigger below the
//! low mark, room above the high mark, a bound on pending bytes, a largest entry that the ring holds with its record headers,
//! and a number of worker threads.

use walrus::config::Config;
use walrus::journal::format::entry_span_bound;

pub fn run(data: &[u8]) {
    let Some(text) = super::text(data) else {
        return;
    };
    if let Ok(c) = Config::parse(text) {
        check(&c);
    }
}

/// Validates `c` and, when it is valid, checks what walrus derives from it.
pub fn check(c: &Config) {
    let journal_valid = c.journal.validate().is_ok();
    if c.validate().is_err() {
        return;
    }
    assert!(
        journal_valid,
        "a configuration validates with an invalid [journal]"
    );
    let (high, low) = c.ring_watermarks();
    assert!(
        0.0 < low && low < high && high < 1.0,
        "ring watermarks ({high}, {low}) for {:?} and {} segments",
        c.disk,
        c.journal.segments
    );
    assert!(high <= c.disk.high_watermark && low <= c.disk.low_watermark);
    let trigger = c.ring_fill_trigger();
    let (at, refuse) = (c.ring_segments_at(trigger), c.ring_segments_at(high));
    assert!(
        0.0 < trigger
            && trigger < high
            && (c.journal.segments <= 3 || (2..refuse).contains(&at)),
        "checkpoint trigger {trigger} (at {at} segments, refused at {refuse}) for {:?} and {} segments",
        c.disk,
        c.journal.segments
    );
    assert!(
        c.ring_headroom_bytes() > 0,
        "no room above the ring's high mark"
    );
    let pending = c.max_pending_bytes();
    assert!(pending >= 1);
    let j = &c.journal;
    let max_entry = j.max_entry();
    let ring = j.segment_size_bytes * u64::from(j.segments);
    assert!(max_entry >= 1 && max_entry <= ring, "max_entry {max_entry}");
    let span = entry_span_bound(max_entry, j.max_write_bytes, j.segment_size_bytes);
    assert!(
        span <= j.segment_size_bytes * u64::from(j.segments - 1),
        "span {span}"
    );
    assert!(j.largest_entry_fitting() <= ring);
    let threads = c.proxy.worker_threads();
    assert!((1..=1024).contains(&threads), "{threads} worker threads");
    let limits = c.proxy.limits();
    assert!(limits.max_inline_bytes >= 16 && limits.max_reply_depth >= 8);
}
