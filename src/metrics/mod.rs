//! Prometheus metrics (served by [`crate::http`]).
//!
//! Every family is a static registered once. The hot path only touches atomics: counters
//! and histograms are resolved to their label values ahead of time (per command: when the
//! command table is learned, [`CommandCounters`]), and figures that belong to a structure
//! (held replies, dirty keys, free segments) are read from it at scrape time by the hooks
//! registered with [`on_scrape`].

use prometheus::{
    Counter, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry,
};
use std::sync::{LazyLock, Mutex};

mod archive;
mod recovery;
mod tls;
pub use archive::*;
pub use recovery::*;
pub use tls::*;

pub static REGISTRY: LazyLock<Registry> =
    LazyLock::new(|| Registry::new_custom(Some("walrus".into()), None).expect("registry"));

fn register<M: prometheus::core::Collector + Clone + 'static>(m: M) -> M {
    REGISTRY
        .register(Box::new(m.clone()))
        .expect("register metric");
    m
}

fn counter(name: &str, help: &str) -> IntCounter {
    register(IntCounter::new(name, help).expect("metric"))
}

fn float_counter(name: &str, help: &str) -> Counter {
    register(Counter::new(name, help).expect("metric"))
}

fn gauge(name: &str, help: &str) -> IntGauge {
    register(IntGauge::new(name, help).expect("metric"))
}

fn float_gauge(name: &str, help: &str) -> Gauge {
    register(Gauge::new(name, help).expect("metric"))
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(IntCounterVec::new(Opts::new(name, help), labels).expect("metric"))
}

/// Latency buckets from 25 µs to 30 s: commands, held replies and journal writes live in the
/// sub-millisecond range on a local SSD, and in milliseconds on a network volume; the tail
/// goes past etcd's 8 s for a disk that stalls, up to `durability.max_hold_ms`'s default
/// (30 s), where a held reply gives up. A tail cut at 1 s would show a stalled disk as 1 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

fn latency(name: &str, help: &str) -> Histogram {
    register(
        Histogram::with_opts(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()))
            .expect("metric"),
    )
}

// --- build -------------------------------------------------------------------------------

/// walrus's version, and the commit it was built from (build.rs: `WALRUS_COMMIT` given to
/// the build, else git's HEAD, else "unknown"), as `walrus_build_info` and `/status` say them.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("WALRUS_COMMIT");

pub static BUILD_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    let g = register(
        IntGaugeVec::new(
            Opts::new(
                "build_info",
                "walrus's version and the commit it was built from (always 1).",
            ),
            &["version", "commit"],
        )
        .expect("metric"),
    );
    g.with_label_values(&[VERSION, COMMIT]).set(1);
    g
});

// --- cluster -----------------------------------------------------------------------------
// Registered only in cluster mode: first touched by `upstream::cluster::watch`.

/// Which node and shard of a Valkey Cluster this walrus fronts (always 1): the labels a
/// dashboard groups every other family of the same target by.
pub static CLUSTER_NODE_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "cluster_node_info",
                "The Valkey Cluster node and shard this walrus fronts (always 1).",
            ),
            &["node_id", "shard_id"],
        )
        .expect("metric"),
    )
});
pub static CLUSTER_SLOTS: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "cluster_slots",
        "Hash slots the Valkey behind this walrus owns.",
    )
});
pub static CLUSTER_STATE_OK: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "cluster_state_ok",
        "1 while the Valkey behind this walrus says cluster_state:ok, else 0 (or unreachable).",
    )
});

// --- clients -----------------------------------------------------------------------------

pub static CLIENTS: LazyLock<IntGauge> =
    LazyLock::new(|| gauge("clients_connected", "Client connections open now."));
pub static CLIENTS_ACCEPTED: LazyLock<IntCounter> =
    LazyLock::new(|| counter("clients_accepted_total", "Client connections accepted."));
static CLIENTS_REJECTED_VEC: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "clients_rejected_total",
        "Client connections refused, by reason: max_clients (proxy.max_clients open); on the TLS port tls_plaintext (not a TLS handshake), tls_handshake_timeout (tls.handshake_timeout_ms), tls_handshake_failed.",
        &["reason"],
    )
});
/// Refused because `proxy.max_clients` connections were open.
pub static CLIENTS_REJECTED: LazyLock<IntCounter> =
    LazyLock::new(|| CLIENTS_REJECTED_VEC.with_label_values(&["max_clients"]));
pub static PROTOCOL_ERRORS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "protocol_errors_total",
        "Client connections closed for a protocol error.",
    )
});
pub static PINNED_SESSIONS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "pinned_sessions_total",
        "Client sessions moved to a dedicated upstream connection.",
    )
});

/// The server behind walrus, as the replica link last found it (one series).
static VALKEY_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "valkey_info",
                "The server walrus is in front of, as its replica link last found it: valkey or redis, and its version (always 1).",
            ),
            &["server", "version"],
        )
        .expect("metric"),
    )
});

/// The replica link found `server` (`valkey` or `redis`) at `version`.
pub fn set_valkey_info(server: &str, version: &str) {
    // Reset only on a change: a scrape in between would see no series.
    if VALKEY_INFO.with_label_values(&[server, version]).get() != 1 {
        VALKEY_INFO.reset();
        VALKEY_INFO.with_label_values(&[server, version]).set(1);
    }
}

// --- commands ----------------------------------------------------------------------------

static COMMANDS_VEC: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "commands_total",
        "Client commands answered, by command (Valkey's command table; anything else is `other`) and result (ok, error).",
        &["cmd", "result"],
    )
});
static COMMAND_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new(
                "command_duration_seconds",
                "Time from a command's arrival to its reply being ready for the client, durability wait included, by class: read, write, blocking (commands Valkey flags blocking, BLPOP, XREAD, WAIT, ..., whose wait is the client's choice), other.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["class"],
        )
        .expect("metric"),
    )
});

/// What a command's latency is counted as: blocking commands wait as long as their client
/// asks, so they are kept apart from the reads and writes whose tail is walrus's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandClass {
    Read,
    Write,
    Blocking,
    /// Connection, administration, Pub/Sub, and commands not in Valkey's table.
    Other,
}

impl CommandClass {
    const ALL: [CommandClass; 4] = [
        CommandClass::Read,
        CommandClass::Write,
        CommandClass::Blocking,
        CommandClass::Other,
    ];

    fn label(self) -> &'static str {
        match self {
            CommandClass::Read => "read",
            CommandClass::Write => "write",
            CommandClass::Blocking => "blocking",
            CommandClass::Other => "other",
        }
    }
}

/// One command's counters and latency histogram, resolved when the command table is learned.
/// Its `walrus_commands_total` series are made as the command is first answered, each
/// result apart (as redis_exporter exports only the commands seen): a table of some 800
/// commands and subcommands would otherwise put 1,600 series of zeros in every scrape.
#[derive(Debug, Clone)]
pub struct CommandCounters {
    cmd: std::sync::Arc<str>,
    ok: std::sync::OnceLock<IntCounter>,
    error: std::sync::OnceLock<IntCounter>,
    duration: Histogram,
}

impl CommandCounters {
    pub fn new(cmd: &str, class: CommandClass) -> CommandCounters {
        CommandCounters {
            cmd: cmd.into(),
            ok: std::sync::OnceLock::new(),
            error: std::sync::OnceLock::new(),
            duration: COMMAND_DURATION.with_label_values(&[class.label()]),
        }
    }

    fn result(&self, result: &'static str) -> &IntCounter {
        let cell = if result == "ok" {
            &self.ok
        } else {
            &self.error
        };
        cell.get_or_init(|| COMMANDS_VEC.with_label_values(&[&self.cmd, result]))
    }

    /// Records the time from the command's arrival to its reply.
    pub fn observe(&self, seconds: f64) {
        self.duration.observe(seconds)
    }

    /// Counts a command relayed without pairing its reply (Pub/Sub and MONITOR relays).
    pub fn relayed(&self) {
        self.result("ok").inc()
    }

    /// Counts a reply (an error reply starts with `-`).
    pub fn count(&self, reply: &[u8]) {
        let result = if reply.first() == Some(&b'-') {
            "error"
        } else {
            "ok"
        };
        self.result(result).inc()
    }
}

/// Commands that are not in Valkey's table.
pub static OTHER_COMMANDS: LazyLock<CommandCounters> =
    LazyLock::new(|| CommandCounters::new("other", CommandClass::Other));

// --- durability --------------------------------------------------------------------------

pub static ACK_HOLD: LazyLock<Histogram> = LazyLock::new(|| {
    latency(
        "ack_hold_seconds",
        "How long replies (writes, and reads of dirty keys) waited for the journal.",
    )
});
pub static HELD_REPLIES: LazyLock<IntGauge> =
    LazyLock::new(|| gauge("held_replies", "Replies waiting for the journal now."));
pub static HELD_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "held_bytes",
        "Memory of the replies waiting for the journal.",
    )
});
pub static DIRTY_KEYS: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "dirty_keys",
        "Keys written by writes the journal does not cover yet.",
    )
});
pub static DURABLE_LAG: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "durable_lag_bytes",
        "Valkey's replication offset after the writes walrus sent, minus the journal's durable offset.",
    )
});
static WRITES_REFUSED_VEC: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter_vec(
        "writes_refused_total",
        "Writes refused before they reached Valkey, by reason.",
        &["reason"],
    )
});

/// Why a write was refused.
#[derive(Debug, Clone, Copy)]
pub enum RefusalReason {
    /// The replica link is not attached.
    Detached,
    JournalFailed,
    Restoring,
    DiskWatermark,
    /// Larger than a journal entry.
    TooLarge,
    /// No room for writes (pending bytes, held memory) within `durability.max_hold_ms`.
    NoRoom,
    /// The archive lags past `archive.max_lag_ms` (with `archive.enforce_max_lag`).
    ArchiveLag,
}

impl RefusalReason {
    const ALL: [RefusalReason; 7] = [
        RefusalReason::Detached,
        RefusalReason::JournalFailed,
        RefusalReason::Restoring,
        RefusalReason::DiskWatermark,
        RefusalReason::TooLarge,
        RefusalReason::NoRoom,
        RefusalReason::ArchiveLag,
    ];

    fn label(self) -> &'static str {
        match self {
            RefusalReason::Detached => "detached",
            RefusalReason::JournalFailed => "journal_failed",
            RefusalReason::Restoring => "restoring",
            RefusalReason::DiskWatermark => "disk_watermark",
            RefusalReason::TooLarge => "too_large",
            RefusalReason::NoRoom => "no_room",
            RefusalReason::ArchiveLag => "archive_lag",
        }
    }

    pub fn count(self) {
        static BY_REASON: LazyLock<[IntCounter; RefusalReason::ALL.len()]> = LazyLock::new(|| {
            RefusalReason::ALL.map(|r| WRITES_REFUSED_VEC.with_label_values(&[r.label()]))
        });
        BY_REASON[self as usize].inc();
    }
}

// --- journal -----------------------------------------------------------------------------

pub static JOURNAL_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "journal_written_bytes_total",
        "Bytes written to the journal's segments (whole 4 KiB blocks).",
    )
});
pub static JOURNAL_ENTRIES: LazyLock<IntCounter> =
    LazyLock::new(|| counter("journal_entries_total", "Entries appended to the journal."));
pub static JOURNAL_ENTRY_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "journal_entry_bytes_total",
        "Payload bytes of the entries appended to the journal (record headers not included).",
    )
});
pub static JOURNAL_RING_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "journal_ring_bytes_total",
        "Ring space the journal advanced through: records, headers and the padding skipped at \
         full buffers and segment ends (a write that rewrites the open tail block counts once).",
    )
});
pub static JOURNAL_WRITE: LazyLock<Histogram> = LazyLock::new(|| {
    latency(
        "journal_write_duration_seconds",
        "Journal writes, from submission until durable (one O_DSYNC write, with the hand-off to the thread or ring that runs it).",
    )
});
pub static JOURNAL_FSYNC: LazyLock<Histogram> = LazyLock::new(|| {
    latency(
        "journal_fsync_duration_seconds",
        "The device part of journal writes: the O_DSYNC write itself, which includes its sync (either backend).",
    )
});
pub static RING_FILL: LazyLock<Gauge> = LazyLock::new(|| {
    float_gauge(
        "journal_ring_fill_ratio",
        "Fraction of the journal ring's segments in use (not yet released by a checkpoint).",
    )
});
pub static FREE_SEGMENTS: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "journal_free_segments",
        "Segments of the ring free for new entries.",
    )
});
pub static JOURNAL_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "journal_info",
                "The journal's I/O backend and whether it uses O_DIRECT (always 1).",
            ),
            &["backend", "direct_io"],
        )
        .expect("metric"),
    )
});
pub static JOURNAL_FAILED: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "journal_failed",
        "1 once the journal failed (an I/O error): writes are refused until walrus restarts.",
    )
});

// --- disk --------------------------------------------------------------------------------

pub static DISK_USED: LazyLock<GaugeVec> = LazyLock::new(|| {
    register(
        GaugeVec::new(
            Opts::new(
                "disk_used_ratio",
                "Fraction of the file system in use (as df counts it), by volume: journal, checkpoints.",
            ),
            &["volume"],
        )
        .expect("metric"),
    )
});
pub static WATERMARK_REACHED: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "disk_watermark_reached",
        "1 while new writes are refused because a disk or ring figure passed disk.high_watermark.",
    )
});

// --- upstream ----------------------------------------------------------------------------

pub static UPSTREAM_CONNECTED: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "upstream_connected",
        "1 while walrus has a live pooled connection to Valkey.",
    )
});
pub static UPSTREAM_ERRORS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "upstream_errors_total",
        "Requests answered with an error because Valkey was unreachable.",
    )
});
pub static UPSTREAM_RECONNECTS: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "upstream_reconnects_total",
        "Pooled upstream connections re-established.",
    )
});
pub static CLIENTS_OUTPUT_CLOSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "clients_output_closed_total",
        "Clients disconnected because they did not read their replies (over proxy.max_output_bytes).",
    )
});
pub static CLIENTS_NOTICE_CLOSED: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "clients_notice_closed_total",
        "Clients disconnected because a keyspace notification or tracking invalidation for them could never be released (its write was not journaled within durability.max_hold_ms, or may be lost).",
    )
});
pub static UPSTREAM_IN_FLIGHT_FULL: LazyLock<IntCounter> = LazyLock::new(|| {
    counter(
        "upstream_in_flight_full_total",
        "Times a connection to Valkey owed upstream.max_in_flight_requests replies and waited for one before sending more.",
    )
});
pub static REPLICA_LINK_UP: LazyLock<IntGauge> = LazyLock::new(|| {
    gauge(
        "replica_link_up",
        "1 while the journal follows Valkey's replication stream.",
    )
});

// --- scrape-time figures -----------------------------------------------------------------

type Hook = Box<dyn Fn() + Send + Sync>;
static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// Registers `hook` to run before every scrape: it sets gauges from a structure walrus
/// keeps anyway, so that the hot path does not maintain them.
pub fn on_scrape(hook: impl Fn() + Send + Sync + 'static) {
    HOOKS.lock().expect("scrape hooks").push(Box::new(hook));
}

/// The registry's families, after the scrape hooks ran.
pub fn gather() -> Vec<prometheus::proto::MetricFamily> {
    for hook in HOOKS.lock().expect("scrape hooks").iter() {
        hook();
    }
    let mut families = REGISTRY.gather();
    families.extend(PROCESS.gather());
    families
}

/// The process's own figures under their standard names (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, `process_open_fds`, ...), which dashboards and alerts
/// written for any exporter read: a registry of their own, without the `walrus_` prefix.
static PROCESS: LazyLock<Registry> = LazyLock::new(|| {
    let r = Registry::new();
    r.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))
    .expect("register the process collector");
    r
});

/// Registers every family, so that a scrape shows each one before its first event.
pub fn register_all() {
    LazyLock::force(&BUILD_INFO);
    LazyLock::force(&CLIENTS);
    LazyLock::force(&CLIENTS_ACCEPTED);
    LazyLock::force(&CLIENTS_REJECTED);
    LazyLock::force(&PROTOCOL_ERRORS);
    LazyLock::force(&PINNED_SESSIONS);
    LazyLock::force(&OTHER_COMMANDS);
    for class in CommandClass::ALL {
        let _ = COMMAND_DURATION.with_label_values(&[class.label()]);
    }
    LazyLock::force(&ACK_HOLD);
    LazyLock::force(&HELD_REPLIES);
    LazyLock::force(&HELD_BYTES);
    LazyLock::force(&DIRTY_KEYS);
    LazyLock::force(&DURABLE_LAG);
    for r in RefusalReason::ALL {
        // Each reason shows at 0 before its first refusal.
        let _ = WRITES_REFUSED_VEC.with_label_values(&[r.label()]);
    }
    LazyLock::force(&JOURNAL_BYTES);
    LazyLock::force(&JOURNAL_ENTRIES);
    LazyLock::force(&JOURNAL_ENTRY_BYTES);
    LazyLock::force(&JOURNAL_RING_BYTES);
    LazyLock::force(&JOURNAL_WRITE);
    LazyLock::force(&JOURNAL_FSYNC);
    LazyLock::force(&RING_FILL);
    LazyLock::force(&FREE_SEGMENTS);
    LazyLock::force(&JOURNAL_INFO);
    LazyLock::force(&JOURNAL_FAILED);
    LazyLock::force(&DISK_USED);
    LazyLock::force(&WATERMARK_REACHED);
    recovery::register();
    LazyLock::force(&UPSTREAM_CONNECTED);
    LazyLock::force(&UPSTREAM_ERRORS);
    LazyLock::force(&UPSTREAM_RECONNECTS);
    LazyLock::force(&UPSTREAM_IN_FLIGHT_FULL);
    LazyLock::force(&CLIENTS_OUTPUT_CLOSED);
    LazyLock::force(&CLIENTS_NOTICE_CLOSED);
    LazyLock::force(&REPLICA_LINK_UP);
}
