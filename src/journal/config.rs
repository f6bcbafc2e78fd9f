//! `[journal]` configuration section and its validation.
//!
//! Every limit the engine enforces lives here, with a default and a minimum, so that nothing
//! is a hidden constant. Tests use small values (64 KiB segments, 3 segments); the minimums
//! allow exactly that.

use serde::{Deserialize, Serialize};

use super::format::{entry_span_bound, BLOCK_BYTES, HEADER_BYTES};
use super::JournalError;

/// Valkey's largest bulk (512 MiB, like walrus's `proxy.max_bulk_bytes`) plus room for the
/// rest of its command: any write a client may send fits one entry.
pub const DEFAULT_MAX_ENTRY_BYTES: u64 = 576 << 20;
/// Smallest segment accepted: small enough for fast tests, large enough to hold many blocks.
pub const MIN_SEGMENT_SIZE_BYTES: u64 = 64 * 1024;
/// One segment holds the checkpointed head, one is being written, one is free to move into.
pub const MIN_SEGMENTS: u32 = 3;

/// Which I/O backend writes the segments.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IoBackendChoice {
    /// io_uring when the kernel and seccomp allow it, else the sync fallback.
    Auto,
    /// io_uring or fail at startup.
    IoUring,
    /// O_DSYNC pwrite on `max_in_flight_writes` dedicated threads.
    Sync,
}

/// Whether segment files are opened with O_DIRECT.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DirectIo {
    /// O_DIRECT when a startup probe shows the file system supports it (tmpfs does not).
    Auto,
    /// O_DIRECT or fail at startup.
    On,
    /// Buffered I/O.
    Off,
}

/// `[journal]` section of the configuration file.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JournalConfig {
    /// Size of one segment file in bytes (a multiple of 4096).
    #[serde(alias = "segment_size")]
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub segment_size_bytes: u64,
    /// Number of segment files in the ring.
    pub segments: u32,
    /// io_uring, sync fallback, or automatic choice.
    pub io_backend: IoBackendChoice,
    /// O_DIRECT on, off, or probed.
    pub direct_io: DirectIo,
    /// Largest single write (one group commit) in bytes; also the size of each pooled buffer.
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub max_write_bytes: u64,
    /// Writes submitted concurrently at increasing offsets (io_uring depth, sync thread count).
    pub max_in_flight_writes: u32,
    /// Pooled aligned buffers (each `max_write_bytes`); bounds memory for queued writes.
    pub write_buffers: u32,
    /// Largest entry payload accepted; larger entries are rejected with `EntryTooLarge`.
    /// Entries larger than a write buffer or a segment are split into fragments. Unset:
    /// [`DEFAULT_MAX_ENTRY_BYTES`], or the largest entry the ring is sure to hold if that is
    /// less ([`JournalConfig::max_entry`]).
    #[serde(deserialize_with = "crate::units::size_opt")]
    #[schemars(with = "crate::units::Size")]
    pub max_entry_bytes: Option<u64>,
    /// How far past the first bad record recovery looks for proof (a later record whose
    /// durable hint covers the bad one) that the damage is mid-log corruption, not a torn tail.
    /// Unset: the whole ring. A shorter look-ahead opens faster, but damage whose first
    /// vouching record lies beyond it is cut like a torn tail.
    #[serde(deserialize_with = "crate::units::size_opt")]
    #[schemars(with = "crate::units::Size")]
    pub recovery_lookahead_bytes: Option<u64>,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            segment_size_bytes: 64 << 20,
            segments: 16,
            io_backend: IoBackendChoice::Auto,
            direct_io: DirectIo::Auto,
            max_write_bytes: 1 << 20,
            max_in_flight_writes: 8,
            write_buffers: 32,
            max_entry_bytes: None,
            recovery_lookahead_bytes: None,
        }
    }
}

impl JournalConfig {
    /// Defaults, with the limits that depend on the ring size clamped to fit it (CLI tools
    /// operating on a journal of any geometry).
    pub fn for_geometry(segment_size_bytes: u64, segments: u32) -> Self {
        let d = JournalConfig::default();
        JournalConfig {
            segment_size_bytes,
            segments,
            max_write_bytes: d.max_write_bytes.min(segment_size_bytes),
            ..d
        }
    }

    /// A configuration sized for tests: 64 KiB segments, small buffers.
    pub fn small_for_tests(segment_size_bytes: u64, segments: u32) -> Self {
        JournalConfig {
            segment_size_bytes,
            segments,
            max_write_bytes: 16 * 1024,
            max_in_flight_writes: 4,
            write_buffers: 8,
            max_entry_bytes: Some(
                segment_size_bytes * u64::from(segments.saturating_sub(2).max(1)),
            ),
            ..JournalConfig::default()
        }
    }

    /// The largest entry accepted: as set, or unset the default capped by what the ring
    /// holds, so that a small ring needs no other setting.
    pub fn max_entry(&self) -> u64 {
        self.max_entry_bytes
            .unwrap_or_else(|| DEFAULT_MAX_ENTRY_BYTES.min(self.largest_entry_fitting()))
    }

    /// The largest entry that fits, with its record headers, in the `segments - 1`
    /// segments the ring is sure to have once everything before it is released, and in
    /// `segments - 2` whole segments (see [`JournalConfig::validate`]).
    pub fn largest_entry_fitting(&self) -> u64 {
        let (s, n) = (self.segment_size_bytes, u64::from(self.segments));
        let room = s.saturating_mul(n.saturating_sub(1));
        let fits = |len| entry_span_bound(len, self.max_write_bytes, s) <= room;
        // The span grows with the length: the largest that fits, by bisection.
        let (mut lo, mut hi) = (0, s.saturating_mul(n.saturating_sub(2)));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// How far recovery looks past a bad record for a later one that vouches for it: unset,
    /// as far as the ring goes (docs/journal.md, "How far to look").
    pub fn lookahead_bytes(&self) -> u64 {
        self.recovery_lookahead_bytes.unwrap_or(u64::MAX)
    }

    /// Checks every limit; the error names the key and the offending value.
    pub fn validate(&self) -> Result<(), JournalError> {
        self.check().map_err(JournalError::Config)
    }

    fn check(&self) -> Result<(), String> {
        let block = BLOCK_BYTES as u64;
        if self.segment_size_bytes < MIN_SEGMENT_SIZE_BYTES {
            return Err(format!(
                "journal.segment_size_bytes = {} is below the minimum {MIN_SEGMENT_SIZE_BYTES}",
                self.segment_size_bytes
            ));
        }
        if self.segment_size_bytes % block != 0 {
            return Err(format!(
                "journal.segment_size_bytes = {} is not a multiple of {block}",
                self.segment_size_bytes
            ));
        }
        // Logical positions are u64 and segment offsets fit u32 headers comfortably below this.
        if self.segment_size_bytes > (1 << 40) {
            return Err(format!(
                "journal.segment_size_bytes = {} exceeds the maximum {}",
                self.segment_size_bytes,
                1u64 << 40
            ));
        }
        if self.segments < MIN_SEGMENTS {
            return Err(format!(
                "journal.segments = {} is below the minimum {MIN_SEGMENTS}",
                self.segments
            ));
        }
        if self.segments > 1 << 20 {
            return Err(format!(
                "journal.segments = {} exceeds the maximum {}",
                self.segments,
                1 << 20
            ));
        }
        // Two blocks at least: a write that continues the previous write's last block
        // always has room for a record after it.
        if self.max_write_bytes < 2 * block || self.max_write_bytes % block != 0 {
            return Err(format!(
                "journal.max_write_bytes = {} must be a multiple of {block}, at least {}",
                self.max_write_bytes,
                2 * block
            ));
        }
        if self.max_write_bytes > self.segment_size_bytes {
            return Err(format!(
                "journal.max_write_bytes = {} exceeds journal.segment_size_bytes = {} (a write never crosses a segment)",
                self.max_write_bytes, self.segment_size_bytes
            ));
        }
        if self.max_write_bytes > (1 << 30) {
            return Err(format!(
                "journal.max_write_bytes = {} exceeds the maximum 1 GiB",
                self.max_write_bytes
            ));
        }
        if self.max_in_flight_writes == 0 || self.max_in_flight_writes > 256 {
            return Err(format!(
                "journal.max_in_flight_writes = {} must be between 1 and 256",
                self.max_in_flight_writes
            ));
        }
        if self.write_buffers <= self.max_in_flight_writes || self.write_buffers > 4096 {
            return Err(format!(
                "journal.write_buffers = {} must be greater than journal.max_in_flight_writes = {} and at most 4096 (one buffer keeps filling while the others are in flight)",
                self.write_buffers, self.max_in_flight_writes
            ));
        }
        let ring_bytes = self.segment_size_bytes * u64::from(self.segments);
        let max_entry_limit = self.segment_size_bytes * u64::from(self.segments - 2);
        let max_entry = self.max_entry();
        if max_entry == 0 || max_entry > max_entry_limit {
            return Err(format!(
                "journal.max_entry_bytes = {max_entry} must be between 1 and {max_entry_limit} (segments - 2 full segments of a {ring_bytes}-byte ring)"
            ));
        }
        // Once everything before it is released, the head is the end of the log (it may sit
        // anywhere in its segment), so the ring holds more than segments - 1 segments for
        // the next entry: a maximum entry must fit there with its record headers, or two of
        // them back to back could stall the ring for good.
        let room = self.segment_size_bytes * u64::from(self.segments - 1);
        let span = entry_span_bound(max_entry, self.max_write_bytes, self.segment_size_bytes);
        if span > room {
            return Err(format!(
                "journal.max_entry_bytes = {max_entry} may take {span} bytes of ring with its record headers (one per journal.max_write_bytes = {}), more than the {room} bytes (segments - 1 segments) the ring is sure to have for it; leave it unset for the largest that fits ({})",
                self.max_write_bytes,
                self.largest_entry_fitting()
            ));
        }
        if max_entry > u64::from(u32::MAX) * 1024 {
            return Err(format!(
                "journal.max_entry_bytes = {max_entry} is too large"
            ));
        }
        if let Some(lookahead) = self.recovery_lookahead_bytes.filter(|&b| b < block) {
            return Err(format!(
                "journal.recovery_lookahead_bytes = {lookahead} is below the minimum {block}"
            ));
        }
        const { assert!(HEADER_BYTES < BLOCK_BYTES) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        JournalConfig::default().validate().unwrap();
        JournalConfig::small_for_tests(64 * 1024, 3)
            .validate()
            .unwrap();
    }

    #[test]
    fn errors_name_key_and_value() {
        let cfg = JournalConfig {
            segments: 2,
            ..JournalConfig::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("journal.segments = 2"), "{err}");
        let cfg = JournalConfig {
            segment_size_bytes: 65537,
            ..JournalConfig::default()
        };
        assert!(cfg
            .validate()
            .unwrap_err()
            .to_string()
            .contains("journal.segment_size_bytes = 65537"));
        let cfg = JournalConfig {
            write_buffers: 8,
            ..JournalConfig::default()
        };
        assert!(cfg
            .validate()
            .unwrap_err()
            .to_string()
            .contains("journal.write_buffers = 8"));
        // Many small segments and small writes: segments - 2 segments of payload would not
        // fit segments - 1 segments of ring once each 8 KiB write carries a header.
        let cfg = JournalConfig {
            segment_size_bytes: 64 << 10,
            segments: 1000,
            max_write_bytes: 8 << 10,
            max_in_flight_writes: 4,
            write_buffers: 8,
            max_entry_bytes: Some(998 * (64 << 10)),
            ..JournalConfig::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(
            err.contains("journal.max_entry_bytes = 65404928 may take"),
            "{err}"
        );
    }

    #[test]
    fn parses_issue_key_names() {
        let cfg: JournalConfig = toml::from_str(
            "segment_size = 131072\nsegments = 4\nio_backend = \"sync\"\ndirect_io = \"off\"\n",
        )
        .unwrap();
        assert_eq!(cfg.segment_size_bytes, 131072);
        assert_eq!(cfg.io_backend, IoBackendChoice::Sync);
        assert_eq!(cfg.direct_io, DirectIo::Off);
        assert!(toml::from_str::<JournalConfig>("bogus = 1").is_err());
    }
}
