//! The families of checkpoints and restores: how often and why checkpoints start, what
//! they write, and what a restore would cost now (the figures the checkpointer plans with).

use super::{counter, counter_vec, float_counter, float_gauge, gauge};
use prometheus::{Counter, Gauge, IntCounter, IntCounterVec, IntGauge};
use std::sync::LazyLock;

// --- checkpoints -------------------------------------------------------------------------

pub static CHECKPOINTS: LazyLock<IntCounter> =
    LazyLock::new(|| counter("checkpoints_total", "Checkpoints taken."));
pub static CHECKPOINT_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "checkpoint_failures_total",
        "Checkpoints that failed (no room on disk, an I/O error, Valkey unreachable, ...).",
    )
});
pub static CHECKPOINT_LAST_SUCCESS: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "checkpoint_last_success_timestamp_seconds",
        "Unix time of the last checkpoint taken (at start, the recorded one's; 0: none yet).",
    )
});
pub static CHECKPOINT_LAST_DURATION: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "checkpoint_last_duration_seconds",
        "How long the last checkpoint took.",
    )
});
pub static CHECKPOINT_LAST_SIZE: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "checkpoint_last_size_bytes",
        "Size of the last checkpoint's RDB.",
    )
});

pub static CHECKPOINT_WRITTEN_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "checkpoint_written_bytes_total",
        "RDB bytes stored and recorded as checkpoints (the checkpointer's and full resyncs'): with walrus_journal_written_bytes_total, what walrus writes per byte of writes.",
    )
});
pub static CHECKPOINT_PACED_SECONDS: LazyLock<Counter> = LazyLock::new(|| {
    float_counter(
        "checkpoint_paced_seconds_total",
        "Seconds the replica link waited before appending, while a checkpoint ran, so that the journal would not fill the ring before it ended (src/checkpoint/pace.rs): writes slowed instead of stalling.",
    )
});
static CHECKPOINT_STARTED_VEC: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "checkpoint_started_total",
        "Checkpoints started (retries after a failure included), by the rule that started them: ring_full (an entry met a full ring), ring_room (the ring would not hold the writes of the next checkpoint), ring_fill (checkpoint.ring_fill_trigger), restore_budget (checkpoint.max_restore_seconds), request (walrus checkpoint).",
        &["reason"],
    )
});

/// The rule that started a checkpoint ([`crate::checkpoint`]'s trigger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointStart {
    RingFull,
    RingRoom,
    RingFill,
    RestoreBudget,
    Request,
}

impl CheckpointStart {
    const ALL: [CheckpointStart; 5] = [
        CheckpointStart::RingFull,
        CheckpointStart::RingRoom,
        CheckpointStart::RingFill,
        CheckpointStart::RestoreBudget,
        CheckpointStart::Request,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CheckpointStart::RingFull => "ring_full",
            CheckpointStart::RingRoom => "ring_room",
            CheckpointStart::RingFill => "ring_fill",
            CheckpointStart::RestoreBudget => "restore_budget",
            CheckpointStart::Request => "request",
        }
    }

    pub fn count(self) {
        static BY_REASON: LazyLock<[IntCounter; CheckpointStart::ALL.len()]> =
            LazyLock::new(|| {
                CheckpointStart::ALL.map(|r| CHECKPOINT_STARTED_VEC.with_label_values(&[r.label()]))
            });
        BY_REASON[self as usize].inc();
    }
}

// --- restore -----------------------------------------------------------------------------

pub static RESTORE_IN_PROGRESS: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "restore_in_progress",
        "1 while walrus loads Valkey from its checkpoint and journal.",
    )
});
pub static RESTORE_TOTAL_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "restore_total_bytes",
        "Bytes the current (or last) restore sends: checkpoint RDB plus journal stream.",
    )
});
pub static RESTORE_SENT_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "restore_sent_bytes",
        "Bytes the current (or last) restore has sent to Valkey.",
    )
});
pub static RESTORES: LazyLock<IntCounter> =
    LazyLock::new(|| counter("restores_total", "Restores completed."));
pub static RESTORE_LAST_DURATION: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "restore_last_duration_seconds",
        "How long the last restore took, verification included.",
    )
});
pub static RESTORE_ESTIMATE: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "restore_estimate_seconds",
        "How long a restore would take now: the checkpoint's RDB at the RDB load rate plus the journal after it at the replay rate (checkpoint.max_restore_seconds bounds it).",
    )
});
pub static RESTORE_RDB_RATE: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "restore_rdb_load_bytes_per_second",
        "The RDB load rate the restore estimate uses: the slowest of this process's recent restores, or a conservative default before any.",
    )
});
pub static RESTORE_JOURNAL_RATE: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "restore_journal_replay_bytes_per_second",
        "The journal replay rate the restore estimate uses: the slowest of this process's recent restores, or a conservative default before any.",
    )
});

/// Registers these families, each reason of a start at 0.
pub(super) fn register() {
    LazyLock::force(&CHECKPOINTS);
    LazyLock::force(&CHECKPOINT_FAILURES);
    LazyLock::force(&CHECKPOINT_LAST_SUCCESS);
    LazyLock::force(&CHECKPOINT_LAST_DURATION);
    LazyLock::force(&CHECKPOINT_LAST_SIZE);
    LazyLock::force(&CHECKPOINT_WRITTEN_BYTES);
    LazyLock::force(&CHECKPOINT_PACED_SECONDS);
    for r in CheckpointStart::ALL {
        let _ = CHECKPOINT_STARTED_VEC.with_label_values(&[r.label()]);
    }
    LazyLock::force(&RESTORE_IN_PROGRESS);
    LazyLock::force(&RESTORE_TOTAL_BYTES);
    LazyLock::force(&RESTORE_SENT_BYTES);
    LazyLock::force(&RESTORES);
    LazyLock::force(&RESTORE_LAST_DURATION);
    LazyLock::force(&RESTORE_ESTIMATE);
    LazyLock::force(&RESTORE_RDB_RATE);
    LazyLock::force(&RESTORE_JOURNAL_RATE);
}
