//! Configuration: one TOML file (the documented defaults are the top-level `config.toml`),
//! overridden by command-line flags. Every limit walrus enforces is named here.
//!
//! Unknown keys are errors that name the key (serde's `deny_unknown_fields`); values that
//! parse but make no sense are rejected by [`Config::validate`], naming key and value.

mod archive;
mod cluster;
mod tls;
mod upstream;
mod validate;

use crate::resp::Limits;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use crate::journal::JournalConfig;
pub use archive::{Ack, ArchiveConfig, ArchiveUrl};
pub use cluster::{Announce, ClusterConfig, Peer};
pub use tls::{AuthClients, CertUser, TlsConfig, UpstreamTlsConfig};
pub use upstream::{
    UpstreamConfig, UpstreamMode, MAX_SOCKET_PATH_BYTES, RESTORE_SOCKET, VALKEY_SOCKET,
};

#[derive(Debug, Clone, Default, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub proxy: ProxyConfig,
    pub upstream: UpstreamConfig,
    pub data: DataConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
    pub durability: DurabilityConfig,
    pub restore: RestoreConfig,
    pub checkpoint: CheckpointSettings,
    pub disk: DiskConfig,
    pub journal: JournalConfig,
    pub cluster: ClusterConfig,
    pub tls: TlsConfig,
    pub archive: ArchiveConfig,
}

/// When checkpoints are taken ([`crate::checkpoint`]): only when needed, since each costs
/// Valkey a fork and its whole dataset through its main thread.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSettings {
    /// The latest point: a checkpoint starts once this fraction of the ring's segments is in
    /// use, whatever the estimates say. Unset: a little below the ring's low mark
    /// ([`Config::ring_fill_trigger`]).
    pub ring_fill_trigger: Option<f64>,
    /// The budget for a restore after a restart: a checkpoint starts when the journal a
    /// restore would replay after the checkpoint's RDB would take it past this.
    pub max_restore_seconds: f64,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings {
            ring_fill_trigger: None,
            // A minute of downtime per restart: 1.2 GB of journal at the default replay rate
            // (20 MB/s), more than the default ring (1 GiB) holds, so on small datasets the
            // ring decides; on large ones, whose RDB takes much of the minute, the budget.
            max_restore_seconds: 60.0,
        }
    }
}

/// How far below the ring's low mark an unset `checkpoint.ring_fill_trigger` sits. A trigger
/// must be below that mark (the validation says why); this is the step the default marks
/// keep between them (0.85 and 0.90), so that the latest checkpoint starts one such step
/// below where writes resume, as writes resume one step below where they are refused.
const RING_FILL_MARGIN: f64 = 0.05;

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {}: {source}", .path.display())]
    InFile {
        path: PathBuf,
        source: Box<ConfigError>,
    },
    /// A file of a secret (`upstream.password_file`, `metrics.admin_token_file`).
    #[error("cannot read {key} {}: {source}", .path.display())]
    SecretFile {
        key: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML, an unknown key, a value of the wrong type.
    #[error("{0}")]
    Parse(#[from] toml::de::Error),
    /// A value that parses but cannot work; the text names the key and the value.
    #[error("{0}")]
    Invalid(String),
}

/// A check's message, naming the key and the value: private checks build it, the public
/// function's `?` wraps it.
impl From<String> for ConfigError {
    fn from(why: String) -> ConfigError {
        ConfigError::Invalid(why)
    }
}

/// Disk watermarks ([`crate::disk`]).
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DiskConfig {
    /// Fraction of a file system (the journal's, the checkpoints'), or of the ring, in use
    /// past which new writes are refused.
    pub high_watermark: f64,
    /// Writes resume once every figure is below this fraction again.
    pub low_watermark: f64,
    /// How often the figures are read (also after every checkpoint).
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub check_interval_ms: u64,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            high_watermark: 0.90,
            low_watermark: 0.85,
            check_interval_ms: 1000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RestoreConfig {
    /// What to do when Valkey holds data of another history than walrus's journal
    /// (`crate::restore::decide`, case (c)).
    pub on_conflict: OnConflict,
    /// How long Valkey may take for each step of a restore: connecting to walrus, the
    /// handshake, and between two signs of progress while it loads. A Valkey that is gone
    /// (another process answers) ends the restore at once, which starts over with the new one.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub timeout_ms: u64,
}

impl Default for RestoreConfig {
    fn default() -> Self {
        RestoreConfig {
            on_conflict: OnConflict::Refuse,
            timeout_ms: 60_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DurabilityConfig {
    /// Off: walrus is a plain proxy (no journal, no held replies). For measuring the proxy.
    pub enabled: bool,
    /// Bytes Valkey may have executed that the journal does not cover yet; past it, new
    /// writes wait before they are sent. Unset: 64 MiB, or less on a ring whose room above
    /// `disk.high_watermark` is smaller ([`Config::max_pending_bytes`]).
    #[serde(deserialize_with = "crate::units::size_opt")]
    #[schemars(with = "crate::units::Size")]
    pub max_pending_bytes: Option<u64>,
    /// Memory of replies held for durability; past it, new writes wait.
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub max_held_bytes: u64,
    /// Largest RDB a full resynchronization may send.
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub max_rdb_bytes: u64,
    /// Longest a reply waits for the journal, or a write for room, before it gets an error; a
    /// keyspace notification or tracking invalidation held that long closes its client.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub max_hold_ms: u64,
    /// When a write's reply leaves: once the local journal holds it (`local`), or once the
    /// archive holds it too (`archive`, which needs `[archive]`).
    pub ack: Ack,
}

impl Default for DurabilityConfig {
    fn default() -> Self {
        DurabilityConfig {
            enabled: true,
            max_pending_bytes: None,
            max_held_bytes: 256 << 20,
            max_rdb_bytes: 64 << 30,
            max_hold_ms: 30_000,
            ack: Ack::Local,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Address plaintext clients connect to, host:port; "" for none (TLS clients only, at
    /// `tls.listen`).
    #[serde(deserialize_with = "listen_or_none")]
    #[schemars(with = "String")]
    pub listen: Option<SocketAddr>,
    pub max_clients: usize,
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub max_query_buffer_bytes: usize,
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub max_bulk_bytes: usize,
    pub max_array_len: usize,
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub max_inline_bytes: usize,
    pub max_reply_depth: usize,
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub max_reply_bytes: usize,
    pub max_pipeline_requests: usize,
    /// Messages Valkey sends a client unasked (RESP3 pushes, RESP2 Pub/Sub messages) queued
    /// for it, waiting for the journal (a keyspace notification or tracking invalidation, and
    /// what follows it) or for a client that does not read them; past it the client is
    /// disconnected.
    #[serde(deserialize_with = "crate::units::size")]
    #[schemars(with = "crate::units::Size")]
    pub max_push_bytes: usize,
    /// Reply bytes a client has not read (walrus could not write them to its socket), and the
    /// requests it sent meanwhile (read on, unhandled, while its replies pile up), before it
    /// is disconnected, as Valkey's `client-output-buffer-limit` does; unset: one reply of
    /// the largest size walrus passes on (`max_reply_bytes`), so that no reply is too large
    /// for a client that reads slowly.
    #[serde(deserialize_with = "crate::units::size_opt")]
    #[schemars(with = "crate::units::Size")]
    pub max_output_bytes: Option<usize>,
    /// On SIGTERM/SIGINT, how long pending replies are waited for before clients are
    /// closed. A stop still running after twice this ends as a SIGKILL would.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub shutdown_timeout_ms: u64,
    /// Threads serving clients; 0: half the CPUs walrus may use, at least one.
    pub worker_threads: usize,
    /// Pass on the administrative commands walrus refuses because they would break what it
    /// relies on (REPLICAOF, FAILOVER, SHUTDOWN, CONFIG SET of the settings it needs, ...):
    /// for an operator who knows what each does.
    pub allow_admin_commands: bool,
    /// Relay MONITOR, which shows every command with its arguments as Valkey runs it: the
    /// values of writes a crash can still lose among them, before the journal holds them
    /// (refused otherwise, naming this setting).
    pub allow_monitor: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        let l = Limits::default();
        ProxyConfig {
            listen: Some("127.0.0.1:6379".parse().unwrap()),
            max_clients: 10_000,
            max_query_buffer_bytes: 1 << 30,
            max_bulk_bytes: l.max_bulk_bytes,
            max_array_len: l.max_array_len,
            max_inline_bytes: l.max_inline_bytes,
            max_reply_depth: l.max_reply_depth,
            max_reply_bytes: l.max_reply_bytes,
            max_pipeline_requests: 16_384,
            // Valkey's own hard limit for Pub/Sub clients.
            max_push_bytes: 32 << 20,
            max_output_bytes: None,
            shutdown_timeout_ms: 10_000,
            worker_threads: 0,
            allow_admin_commands: false,
            allow_monitor: false,
        }
    }
}

impl ProxyConfig {
    /// `worker_threads`, with 0 resolved. Valkey's own thread runs next to walrus on the
    /// same CPUs, so walrus leaves it half of them: on two cores one thread serves every
    /// client with no cross-thread wake-ups, which measured cheaper per request than two.
    pub fn max_output_bytes(&self) -> usize {
        self.max_output_bytes.unwrap_or(self.max_reply_bytes)
    }

    pub fn worker_threads(&self) -> usize {
        match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            n => n,
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_bulk_bytes: self.max_bulk_bytes,
            max_array_len: self.max_array_len,
            max_inline_bytes: self.max_inline_bytes,
            max_reply_depth: self.max_reply_depth,
            max_reply_bytes: self.max_reply_bytes,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    pub dir: PathBuf,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            dir: PathBuf::from("walrus-data"),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Empty disables the HTTP endpoint.
    pub listen: String,
    /// Accept admin requests (`POST /checkpoint`, `POST /backup`) from other hosts than
    /// loopback; needs `admin_token_file`.
    pub admin_allow_remote: bool,
    /// A file holding the token admin requests must carry (`Authorization: Bearer`), from
    /// loopback too; read at each request, so replacing it rotates the token. Empty: none
    /// (loopback callers only).
    pub admin_token_file: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: "127.0.0.1:8379".into(),
            admin_allow_remote: false,
            admin_token_file: String::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter: `info`, `walrus=debug`, ...; `RUST_LOG` overrides it.
    pub level: String,
    pub format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl LogConfig {
    /// `level` as a tracing filter: each comma-separated directive is a level, or
    /// `target=level`. A level is tracing's (`trace`, `debug`, `info`, `warn`, `error`,
    /// `off`) or Valkey's `loglevel` name (`verbose` is debug, `notice` info, `warning`
    /// warn), so a valkey.conf habit works. Anything else is an error: tracing would read a
    /// bare unknown word (`notice`) as a target name and log nothing else.
    pub fn filter(&self) -> Result<String, ConfigError> {
        let level = |word: &str| -> Option<&'static str> {
            Some(match word.trim().to_ascii_lowercase().as_str() {
                "trace" => "trace",
                "debug" | "verbose" => "debug",
                "info" | "notice" => "info",
                "warn" | "warning" => "warn",
                "error" => "error",
                "off" => "off",
                _ => return None,
            })
        };
        let directive = |d: &str| -> Option<String> {
            match d.split_once('=') {
                None => level(d).map(str::to_string),
                Some((target, l)) if !target.trim().is_empty() => {
                    level(l).map(|l| format!("{}={l}", target.trim()))
                }
                Some(_) => None,
            }
        };
        self.level
            .split(',')
            .map(|d| {
                directive(d).ok_or_else(|| {
                    format!(
                        "invalid value for log.level: {:?} ({:?} is not a level: use trace, debug, info, warn, error or off, Valkey's verbose, notice or warning, or target=level, as in \"info,walrus::proxy=debug\")",
                        self.level,
                        d.trim()
                    )
                })
            })
            .collect::<Result<Vec<_>, String>>()
            .map(|v| v.join(","))
            .map_err(ConfigError::Invalid)
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

/// Credentials for walrus's own connections to Valkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: Option<String>,
    pub password: String,
}

impl Config {
    /// Reads a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text).map_err(|source| ConfigError::InFile {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// Rejects values that parse but cannot work, naming the key and the value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check()
    }

    /// The bound on executed-but-not-durable bytes: as set, or unset 64 MiB capped by the
    /// ring's room above `disk.high_watermark`, so that the writes admitted before the ring's
    /// mark is seen still fit the ring.
    pub fn max_pending_bytes(&self) -> u64 {
        self.durability
            .max_pending_bytes
            .unwrap_or_else(|| (64 << 20).min(self.ring_headroom_bytes()).max(1))
    }

    /// `checkpoint.ring_fill_trigger`, or unset [`RING_FILL_MARGIN`] below the ring's own low
    /// mark (0.8 with the default marks: 13 of 16 segments), counted in whole segments as the
    /// ring's figure moves: at least 2 (one is always in use, and a trigger there would
    /// checkpoint an idle ring without end), and at least one segment below where the ring
    /// refuses writes ([`Config::ring_segments_at`]), so that a checkpoint that fails once
    /// still has a segment of room. The value sits half a segment below its count, clear of
    /// rounding. A ring of 3 segments has room for neither: it checkpoints at 2.
    pub fn ring_fill_trigger(&self) -> f64 {
        self.checkpoint.ring_fill_trigger.unwrap_or_else(|| {
            let (high, low) = self.ring_watermarks();
            let want = self.ring_segments_at(low - RING_FILL_MARGIN);
            let at = want.min(self.ring_segments_at(high) - 1).max(2);
            (f64::from(at) - 0.5) / f64::from(self.journal.segments.max(1))
        })
    }

    /// How many of the ring's segments are in use when its fill first reaches `fraction`
    /// (the figure is segments in use over segments, so it moves a segment at a time).
    pub fn ring_segments_at(&self, fraction: f64) -> u32 {
        let n = f64::from(self.journal.segments.max(1));
        // A fraction computed as k/n may land a hair above k/n: not a segment more.
        (fraction * n - 1e-9).ceil().max(0.0) as u32
    }

    /// The part of the ring above its high mark ([`Config::ring_watermarks`]).
    pub fn ring_headroom_bytes(&self) -> u64 {
        let ring = self.journal.segment_size_bytes * u64::from(self.journal.segments);
        ((1.0 - self.ring_watermarks().0) * ring as f64) as u64
    }

    /// The ring's own (high, low) marks. Its figure moves a segment at a time, so its high
    /// mark must come by the time one segment is left, or writes already sent would meet a
    /// full ring; and its low mark half a step below that, so that it is ever reached:
    /// `disk.high_watermark` and `disk.low_watermark`, lowered for a ring of few segments.
    pub fn ring_watermarks(&self) -> (f64, f64) {
        let n = f64::from(self.journal.segments.max(1));
        let step = 1.0 / n;
        // (n - 1) / n, computed as the ring's figure is (segments in use / segments): as
        // 1 - 1/n it can round above the figure at n - 1 segments (3 segments: 0.66..67
        // against 0.66..63), and the mark then came only with the ring full.
        let high = self.disk.high_watermark.min((n - 1.0) / n);
        (high, self.disk.low_watermark.min(high - step / 2.0))
    }

    /// `archive.object_bytes`: as set, or a journal segment's size.
    pub fn archive_object_bytes(&self) -> u64 {
        self.archive
            .object_bytes
            .unwrap_or(self.journal.segment_size_bytes)
    }

    /// `archive.memory_bytes`: as set, or twice `archive.object_bytes`.
    pub fn archive_memory_bytes(&self) -> u64 {
        self.archive
            .memory_bytes
            .unwrap_or(2 * self.archive_object_bytes())
    }

    /// `archive.checkpoint_after_bytes`: as set, or the ring's size.
    pub fn archive_checkpoint_after_bytes(&self) -> u64 {
        self.archive
            .checkpoint_after_bytes
            .unwrap_or(self.journal.segment_size_bytes * u64::from(self.journal.segments))
    }

    /// The credentials walrus uses for its own connections, reading the password file if set.
    pub fn credentials(&self) -> Result<Option<Credentials>, ConfigError> {
        let u = &self.upstream;
        let password = if !u.password_file.is_empty() {
            read_secret("upstream.password_file", u.password_file.as_ref())?
        } else {
            u.password.clone()
        };
        if password.is_empty() && u.username.is_empty() {
            return Ok(None);
        }
        let username = (!u.username.is_empty()).then(|| u.username.clone());
        Ok(Some(Credentials { username, password }))
    }
}

/// A listening address, host:port, or "" for none.
fn listen_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    parse_listen(&text).map_err(serde::de::Error::custom)
}

/// `host:port`, or "" for no listener (what `proxy.listen` and `--listen` take).
pub fn parse_listen(text: &str) -> Result<Option<SocketAddr>, ConfigError> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        ConfigError::Invalid(format!("{text:?} is not an address to listen on: expected host:port with an IP address (127.0.0.1:6379, [::]:6379), or \"\" for none"))
    })
}

/// What `restore.on_conflict` says to do in case (c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OnConflict {
    Refuse,
    ValkeyWins,
    JournalWins,
}

#[cfg(test)]
mod tests;

/// A secret from the file `path` (the setting `key` names it), without trailing line ends:
/// a Secret created from a file, or `echo`, often leaves one, and both sides of a password
/// or token must read the same.
pub fn read_secret(key: &'static str, path: &std::path::Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::SecretFile {
        key,
        path: path.to_path_buf(),
        source,
    })?;
    Ok(text.trim_end_matches(['\r', '\n']).to_string())
}
