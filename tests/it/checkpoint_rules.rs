//! When walrus takes checkpoints (src/checkpoint/trigger.rs): only when a rule requires
//! one, and each start counted by its rule. The rules themselves, with their figures, are
//! unit tests there; here a real walrus shows that the restore budget, not the ring's fill,
//! starts them when the budget is what runs out first.
use crate::common;
use common::*;

/// The value of the sample `key` (`name{labels}` as Prometheus prints it) on `/metrics`.
fn sample(metrics: &str, key: &str) -> f64 {
    let (code, body) = http_get(metrics, "/metrics");
    assert_eq!(code, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {key} in:\n{body}"))
}

/// A budget of 10 ms leaves the journal about 200 KB at the default replay rate: half a
/// megabyte of writes, 3% of the test ring, far below its fill trigger, starts a checkpoint
/// for the budget.
#[test]
fn a_small_restore_budget_checkpoints_long_before_the_ring_fills() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .checkpoint("max_restore_seconds = 0.01\n")
        .args(&["--metrics-listen", &metrics])
        .start();
    let started = |reason: &str| {
        sample(
            &metrics,
            &format!("walrus_checkpoint_started_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(started("restore_budget"), 0.0, "nothing written yet");
    let taken = w.checkpoints();

    let mut c = Raw::connect(&w.addr);
    let value = "v".repeat(8 << 10);
    let mut batch = Vec::new();
    for i in 0..64 {
        batch.extend_from_slice(&walrus::resp::write::command([
            "SET",
            &format!("k{i}"),
            &value,
        ]));
    }
    c.send_raw(&batch);
    for _ in 0..64 {
        assert_eq!(c.read_frame(), b"+OK\r\n");
    }

    let line = w
        .proc
        .wait_line("checkpoint started: restore_budget", START_TIMEOUT);
    assert!(
        line.contains("checkpoint.max_restore_seconds = 0.01"),
        "the log gives the figures: {line}"
    );
    w.await_checkpoint(taken);
    assert!(started("restore_budget") >= 1.0);
    assert_eq!(started("ring_fill"), 0.0);
    assert_eq!(started("ring_room"), 0.0);
    let fill = sample(&metrics, "walrus_journal_ring_fill_ratio");
    assert!(fill < 0.5, "the ring is {fill} full");
    assert!(sample(&metrics, "walrus_checkpoint_written_bytes_total") > 0.0);
    // The data is all there after those checkpoints.
    assert_eq!(c.cmd(&["STRLEN", "k63"]), b":8192\r\n");
}

/// Found by review: with the latest trigger at 13 of the test ring's 16 segments, a value
/// larger than the room left below it met a full ring; no rule started a checkpoint, and
/// the replica link waited for a release that never came (every write after it stalled).
/// An append refused for room now starts one (`ring_full`).
#[test]
fn a_value_larger_than_the_room_below_the_trigger_is_journaled_not_stalled() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .checkpoint("ring_fill_trigger = 0.8\n")
        .args(&["--metrics-listen", &metrics])
        .start();
    let mut c = Raw::connect(&w.addr);
    let small = "v".repeat(256 << 10);
    let mut i = 0;
    while sample(&metrics, "walrus_journal_ring_fill_ratio") < 10.0 / 16.0 {
        assert_eq!(c.cmd(&["SET", &format!("k{i}"), &small]), b"+OK\r\n");
        i += 1;
    }
    let fill = sample(&metrics, "walrus_journal_ring_fill_ratio");
    assert!(fill < 13.0 / 16.0, "the ring reached its trigger: {fill}");
    // At 10 to 12 of 16 segments in use, at most 6 MiB is free: 7 MiB meets a full ring.
    let big = "b".repeat(7 << 20);
    assert_eq!(c.cmd(&["SET", "big", &big]), b"+OK\r\n");
    w.await_metric(
        "walrus_checkpoint_started_total{reason=\"ring_full\"}",
        |n| n >= 1.0,
    );
    assert!(
        sample(
            &metrics,
            "walrus_checkpoint_started_total{reason=\"ring_full\"}"
        ) >= 1.0
    );
    assert_eq!(c.cmd(&["STRLEN", "big"]), b":7340032\r\n");
}

/// Writes that the test ring (16 MiB) cannot hold three checkpoints' worth of: walrus warns,
/// naming the sizing rule (docs/design.md) and the segments it asks for, and every write is still
/// acknowledged and kept.
#[test]
fn a_ring_too_small_for_the_write_rate_warns_naming_the_sizing_rule() {
    let w = Walrus::build().start();
    let mut c = Raw::connect(&w.addr);
    let value = "v".repeat(512 << 10);
    let needle = "cannot hold this write rate";
    // Up to 100 times the ring: a few seconds of writes at any rate this test sees, more
    // than three checkpoints of a dataset of tens of MB.
    let mut written = 0usize;
    let mut keys = 0usize;
    while !w.proc.log_text().contains(needle) {
        assert!(
            written < 1600 << 20,
            "no warning after {written} bytes:\n{}",
            w.proc.log_text()
        );
        let mut batch = Vec::new();
        for i in 0..8 {
            let key = format!("k{}", (keys + i) % 96);
            batch.extend_from_slice(&walrus::resp::write::command(["SET", &key, &value]));
        }
        c.send_raw(&batch);
        for _ in 0..8 {
            assert_eq!(c.read_frame(), b"+OK\r\n");
        }
        keys += 8;
        written += 8 * value.len();
    }
    let line = w.proc.wait_line(needle, START_TIMEOUT);
    assert!(
        line.contains("WARN")
            && line.contains("(docs/design.md, \"Sizing the ring\")")
            && line.contains("ring of 16777216 bytes")
            && line.contains("journal.segments = "),
        "{line}"
    );
    let segments: u64 = line
        .split("journal.segments = ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(segments > 16, "{line}");
    let last = format!("k{}", (keys - 1) % 96);
    assert_eq!(c.cmd(&["STRLEN", &last]), b":524288\r\n");
}
