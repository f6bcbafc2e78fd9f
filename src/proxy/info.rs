//! `INFO` through walrus: Valkey's reply, with walrus's own Persistence section in it.
//!
//! Valkey runs with persistence off behind walrus, so its own section says the data is not
//! persisted (`aof_enabled:0`, no save since it started), and a person or a tool checking it
//! (`INFO persistence`, or the section within `INFO`, `INFO all`, `INFO everything`) would be
//! misled. What persists the data is walrus's journal, which holds every acknowledged write,
//! and its checkpoints, which let the journal's ring recycle. So the section's fields say
//! that, in Valkey's field names where one fits, and walrus's own `walrus_*` fields follow
//! (the mapping: docs/operations.md, "INFO persistence"). Valkey's other fields (its forks'
//! copy-on-write figures, its last load's keys) describe the Valkey process and stay its
//! own, as does every other section. With durability off there is nothing of walrus's to
//! show, and the reply passes unchanged.
//!
//! Read at reply time from what walrus keeps in memory anyway, as `/status` is: the gate's
//! offsets, the journal's positions, the checkpoint store's record and when it was taken, the
//! checkpointer's flags and the checkpoint metrics. No round trip and no file is read.

use crate::checkpoint::{store::Store, InProgress};
use crate::durability::Durability;
use crate::journal::Journal;
use crate::metrics;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

const HEADER: &str = "# Persistence\r\n";

/// Where the section is read from.
pub struct Persistence {
    pub gate: Arc<Durability>,
    /// Weak: the journal must close at shutdown while sessions still answer.
    pub journal: Weak<Journal>,
    pub store: Store,
    /// Set from a failed checkpoint until one succeeds.
    pub checkpoint_failing: Arc<AtomicBool>,
    pub checkpoint_in_progress: Arc<InProgress>,
}

impl Persistence {
    /// `reply` with its Persistence section walrus's ([`rewrite`]).
    pub fn rewrite(&self, reply: Bytes) -> Bytes {
        // Not a section's worth of work for a reply that has none.
        if info_text(&reply).is_none() {
            return reply;
        }
        rewrite(reply, &self.fields())
    }

    /// walrus's fields: those with Valkey's names take the place of Valkey's; the rest are
    /// shown in this order.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let journal = self.journal.upgrade();
        let (durable_offset, executed_offset, _, _) = self.gate.snapshot();
        let refusal = self.gate.write_refusal().map(|r| r.to_string());
        let checkpoint = self.store.recorded();
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        let written = self.store.written_at().map_or(0, unix);
        let running = self.checkpoint_in_progress.since();
        let saves = metrics::CHECKPOINTS.get();
        let flag = |b: bool| u8::from(b).to_string();
        let status = |ok: bool| if ok { "ok" } else { "err" }.to_string();
        let mut f = Vec::with_capacity(24);
        // Valkey's own while it loads (a full sync's RDB); walrus's restore loads it too.
        if metrics::RESTORE_IN_PROGRESS.get() != 0 {
            f.push(("loading", "1".to_string()));
        }
        if let Some(j) = &journal {
            // The entries a restore would replay after the checkpoint's RDB.
            let first = self
                .store
                .recorded_from_lsn()
                .unwrap_or(j.released_through() + 1);
            let lsn = j.status().durable.lsn;
            f.push((
                "rdb_changes_since_last_save",
                (lsn + 1).saturating_sub(first).to_string(),
            ));
        }
        f.extend([
            ("rdb_bgsave_in_progress", flag(running.is_some())),
            ("rdb_last_save_time", written.to_string()),
            (
                "rdb_last_bgsave_status",
                status(!self.checkpoint_failing.load(Ordering::Relaxed)),
            ),
            (
                "rdb_last_bgsave_time_sec",
                if saves > 0 {
                    (metrics::CHECKPOINT_LAST_DURATION.get().round() as i64).to_string()
                } else {
                    "-1".into()
                },
            ),
            (
                "rdb_current_bgsave_time_sec",
                running.map_or("-1".into(), |t| {
                    unix(std::time::SystemTime::now())
                        .saturating_sub(t)
                        .to_string()
                }),
            ),
            ("rdb_saves", saves.to_string()),
            ("aof_enabled", "1".into()),
            // A write the journal cannot take (it failed, a disk is full, ...) is refused.
            ("aof_last_write_status", status(refusal.is_none())),
        ]);
        let ring = journal
            .as_ref()
            .map(|j| (j.status(), j.backend().to_string()));
        if let Some((j, _)) = &ring {
            f.push(("aof_current_size", (j.write_pos - j.head_pos).to_string()));
        }
        f.push((
            "aof_buffer_length",
            executed_offset.saturating_sub(durable_offset).to_string(),
        ));
        f.push(("walrus_durable_offset", durable_offset.to_string()));
        f.push(("walrus_valkey_offset", executed_offset.to_string()));
        if let Some((j, backend)) = ring {
            f.extend([
                ("walrus_journal_backend", backend),
                ("walrus_ring_segments_used", j.used_segments.to_string()),
                ("walrus_ring_segments_total", j.segments.to_string()),
                (
                    "walrus_ring_bytes_used",
                    (j.write_pos - j.head_pos).to_string(),
                ),
                (
                    "walrus_ring_bytes_total",
                    (u64::from(j.segments) * j.segment_bytes).to_string(),
                ),
            ]);
        }
        f.push((
            "walrus_checkpoint_offset",
            checkpoint.map_or("-1".into(), |c| c.offset.to_string()),
        ));
        f.push(("walrus_writes_refused", flag(refusal.is_some())));
        // One line: a reason's line breaks would start fields of their own.
        f.push((
            "walrus_writes_refused_reason",
            refusal.unwrap_or_default().replace(['\r', '\n'], " "),
        ));
        f
    }
}

/// `reply` with its Persistence section's fields replaced by `ours` ([`replace_fields`]):
/// an `INFO` reply as Valkey sends it (a RESP2 bulk string, or a RESP3 verbatim string of
/// format `txt`), its other sections, the header and the CRLF layout kept. Anything else
/// (an error, a reply without that section, an empty reply) is returned unchanged.
fn rewrite(reply: Bytes, ours: &[(&'static str, String)]) -> Bytes {
    let Some((prefix, text)) = info_text(&reply) else {
        return reply;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return reply;
    };
    let Some(start) = section_start(text) else {
        return reply;
    };
    let body_start = start + HEADER.len();
    // Up to the blank line before the next section, or the end of the text.
    let body_end = text[body_start..]
        .find("\r\n\r\n")
        .map_or(text.len(), |i| body_start + i + 2);
    let section = replace_fields(&text[body_start..body_end], ours);
    let new_text = [prefix, &text[..body_start], &section, &text[body_end..]].concat();
    let mut out = format!("{}{}\r\n", char::from(reply[0]), new_text.len()).into_bytes();
    out.extend_from_slice(new_text.as_bytes());
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// The text of an `INFO` reply, and what precedes it inside the string (`txt:` in a RESP3
/// verbatim string): `None` for anything else.
fn info_text(reply: &[u8]) -> Option<(&'static str, &[u8])> {
    let (kind, rest) = reply.split_first()?;
    let prefix = match kind {
        b'$' => "",
        b'=' => "txt:",
        _ => return None,
    };
    let eol = rest.windows(2).position(|w| w == b"\r\n")?;
    let len: usize = std::str::from_utf8(&rest[..eol]).ok()?.parse().ok()?;
    let payload = rest.get(eol + 2..eol + 2 + len)?;
    if rest.len() != eol + 2 + len + 2 || !rest.ends_with(b"\r\n") {
        return None;
    }
    Some((prefix, payload.strip_prefix(prefix.as_bytes())?))
}

/// Where the Persistence section's header starts: at the start of the text, or of a line.
fn section_start(text: &str) -> Option<usize> {
    if text.starts_with(HEADER) {
        return Some(0);
    }
    text.find(&format!("\r\n{HEADER}")).map(|i| i + 2)
}

/// Valkey's section body (`key:value\r\n` lines) with `ours`' values in place of its own,
/// and those of `ours` it does not have inserted after the fields Valkey always shows
/// (before its `loading_*` details, shown while it loads) or at the end for `walrus_*`.
fn replace_fields(valkey: &str, ours: &[(&'static str, String)]) -> String {
    let mut out = String::with_capacity(valkey.len() + 512);
    let mut shown = vec![false; ours.len()];
    let mut rest_at = None;
    let put = |out: &mut String, k: &str, v: &str| {
        out.push_str(k);
        out.push(':');
        out.push_str(v);
        out.push_str("\r\n");
    };
    for line in valkey.split_terminator("\r\n") {
        let key = line.split_once(':').map_or(line, |(k, _)| k);
        if key.starts_with("loading_") && rest_at.is_none() {
            rest_at = Some(out.len());
        }
        match ours.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                shown[i] = true;
                put(&mut out, key, &ours[i].1);
            }
            None => {
                out.push_str(line);
                out.push_str("\r\n");
            }
        }
    }
    let mut valkeys = String::new();
    let mut walrus = String::new();
    for ((k, v), shown) in ours.iter().zip(shown) {
        if !shown {
            put(
                if k.starts_with("walrus_") {
                    &mut walrus
                } else {
                    &mut valkeys
                },
                k,
                v,
            );
        }
    }
    out.insert_str(rest_at.unwrap_or(out.len()), &valkeys);
    out.push_str(&walrus);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALKEY: &str = "loading:0\r\nrdb_changes_since_last_save:7\r\nrdb_last_save_time:100\r\naof_enabled:0\r\nmodule_fork_last_cow_size:0\r\n";

    fn ours() -> Vec<(&'static str, String)> {
        vec![
            ("rdb_changes_since_last_save", "3".into()),
            ("aof_enabled", "1".into()),
            ("aof_current_size", "42".into()),
            ("walrus_durable_offset", "9".into()),
        ]
    }

    #[test]
    fn fields_are_replaced_in_place_and_the_rest_follow_valkeys() {
        assert_eq!(
            replace_fields(VALKEY, &ours()),
            "loading:0\r\nrdb_changes_since_last_save:3\r\nrdb_last_save_time:100\r\naof_enabled:1\r\nmodule_fork_last_cow_size:0\r\naof_current_size:42\r\nwalrus_durable_offset:9\r\n"
        );
        // While Valkey loads, its loading details stay after the fields it always shows.
        let loading = format!("{VALKEY}loading_start_time:5\r\n");
        assert_eq!(
            replace_fields(&loading, &ours()),
            "loading:0\r\nrdb_changes_since_last_save:3\r\nrdb_last_save_time:100\r\naof_enabled:1\r\nmodule_fork_last_cow_size:0\r\naof_current_size:42\r\nloading_start_time:5\r\nwalrus_durable_offset:9\r\n"
        );
    }

    #[test]
    fn only_the_persistence_section_changes_in_a_multi_section_reply() {
        let text = format!("# Memory\r\nused_memory:1\r\n\r\n# Persistence\r\n{VALKEY}\r\n# Stats\r\nrdb_saves:1\r\n");
        let want = "# Memory\r\nused_memory:1\r\n\r\n# Persistence\r\nloading:0\r\nrdb_changes_since_last_save:3\r\nrdb_last_save_time:100\r\naof_enabled:1\r\nmodule_fork_last_cow_size:0\r\naof_current_size:42\r\nwalrus_durable_offset:9\r\n\r\n# Stats\r\nrdb_saves:1\r\n";
        let bulk = format!("${}\r\n{text}\r\n", text.len());
        assert_eq!(
            rewrite(Bytes::from(bulk), &ours()),
            format!("${}\r\n{want}\r\n", want.len()).as_bytes()
        );
        let verbatim = format!("={}\r\ntxt:{text}\r\n", text.len() + 4);
        assert_eq!(
            rewrite(Bytes::from(verbatim), &ours()),
            format!("={}\r\ntxt:{want}\r\n", want.len() + 4).as_bytes()
        );
        // The section last, as `INFO persistence` sends it alone.
        let alone = format!("# Persistence\r\n{VALKEY}");
        let want = &want[27..want.find("\r\n\r\n# Stats").unwrap() + 2];
        assert_eq!(
            rewrite(
                Bytes::from(format!("${}\r\n{alone}\r\n", alone.len())),
                &ours()
            ),
            format!("${}\r\n{want}\r\n", want.len()).as_bytes()
        );
        let without = Bytes::from("$14\r\n# Stats\r\nx:1\r\n\r\n");
        assert_eq!(rewrite(without.clone(), &ours()), without);
    }

    #[test]
    fn only_an_info_string_is_read() {
        let text = "# Server\r\nx:1\r\n";
        let bulk = format!("${}\r\n{text}\r\n", text.len());
        assert_eq!(info_text(bulk.as_bytes()), Some(("", text.as_bytes())));
        let verbatim = format!("={}\r\ntxt:{text}\r\n", text.len() + 4);
        assert_eq!(
            info_text(verbatim.as_bytes()),
            Some(("txt:", text.as_bytes()))
        );
        for other in [
            "-ERR no\r\n".to_string(),
            String::new(),
            format!("${}\r\n{text}\r\n", text.len() + 1),
            format!("${}\r\n{text}\r\n+OK\r\n", text.len()),
        ] {
            assert_eq!(info_text(other.as_bytes()), None, "{other:?}");
        }
    }

    #[test]
    fn the_section_is_found_at_the_start_or_after_a_line() {
        assert_eq!(section_start("# Persistence\r\nloading:0\r\n"), Some(0));
        assert_eq!(
            section_start("# Memory\r\na:1\r\n\r\n# Persistence\r\nloading:0\r\n"),
            Some(17)
        );
        assert_eq!(section_start("# Server\r\nx:# Persistence\r\n"), None);
    }
}
