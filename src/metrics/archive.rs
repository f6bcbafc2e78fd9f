//! The archive's families ([`crate::archive`]): how far behind it is, what it sends (the
//! request count is most of an S3 bill), how uploads fare, and its restore points.

use super::{counter, counter_vec, float_gauge, gauge, register};
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use std::sync::LazyLock;

pub static ARCHIVE_LAG_SECONDS: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "archive_lag_seconds",
        "How long the oldest durable journal entry not yet in the archive has been durable (0: caught up).",
    )
});
pub static ARCHIVE_LAG_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "archive_lag_bytes",
        "Replication stream bytes durable in the journal and not yet in the archive.",
    )
});
pub static ARCHIVE_UPLOADS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "archive_uploads_total",
        "Uploads to the archive by kind (journal, merge, checkpoint, manifest) and result (ok, error).",
        &["kind", "result"],
    )
});
pub static ARCHIVE_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "archive_requests_total",
        "Requests to the archive's store by operation (put, get, list, delete) and result (ok, error); multipart parts count one each.",
        &["op", "result"],
    )
});
pub static ARCHIVE_SENT_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "archive_sent_bytes_total",
        "Bytes sent to the archive's store in requests that succeeded.",
    )
});
pub static ARCHIVE_JOURNAL_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "archive_journal_bytes_total",
        "Replication stream bytes archived for the first time (against walrus_archive_sent_bytes_total: bytes sent per byte of stream).",
    )
});
pub static ARCHIVE_RESTORE_POINTS: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "archive_restore_points",
        "Restore points in the archive's manifest.",
    )
});
pub static ARCHIVE_OLDEST_RESTORE_POINT: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "archive_oldest_restore_point_timestamp_seconds",
        "Unix time of the oldest restore point in the archive (0: none).",
    )
});
pub static ARCHIVE_NEWEST_RESTORE_POINT: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "archive_newest_restore_point_timestamp_seconds",
        "Unix time of the newest restore point in the archive (0: none).",
    )
});
pub static ARCHIVE_LAST_UPLOAD: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "archive_last_upload_timestamp_seconds",
        "Unix time of the last successful upload to the archive (0: none since start).",
    )
});
pub static ARCHIVE_STOPPED: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "archive_stopped",
        "1 when walrus no longer writes the archive: another walrus took it over (the log says which).",
    )
});
pub static ARCHIVE_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "archive_info",
                "The archive walrus writes, and its acknowledgement mode (always 1).",
            ),
            &["url", "ack"],
        )
        .expect("metric"),
    )
});

/// Registers the archive's families, each at its zero, when walrus has an archive: without
/// one they are absent, and so are the alerts on them.
pub fn register_archive(url: &str, ack: &str) {
    LazyLock::force(&ARCHIVE_LAG_SECONDS);
    LazyLock::force(&ARCHIVE_LAG_BYTES);
    for kind in ["journal", "merge", "checkpoint", "manifest"] {
        for result in ["ok", "error"] {
            let _ = ARCHIVE_UPLOADS.with_label_values(&[kind, result]);
        }
    }
    for op in ["put", "get", "list", "delete"] {
        for result in ["ok", "error"] {
            let _ = ARCHIVE_REQUESTS.with_label_values(&[op, result]);
        }
    }
    LazyLock::force(&ARCHIVE_SENT_BYTES);
    LazyLock::force(&ARCHIVE_JOURNAL_BYTES);
    LazyLock::force(&ARCHIVE_RESTORE_POINTS);
    LazyLock::force(&ARCHIVE_OLDEST_RESTORE_POINT);
    LazyLock::force(&ARCHIVE_NEWEST_RESTORE_POINT);
    LazyLock::force(&ARCHIVE_LAST_UPLOAD);
    LazyLock::force(&ARCHIVE_STOPPED);
    ARCHIVE_INFO.with_label_values(&[url, ack]).set(1);
}
