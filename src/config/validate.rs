//! The values that parse but cannot work, named with their key; the journal's own limits are
//! checked by [`crate::journal::JournalConfig`].

use super::ConfigError;
use super::{AuthClients, CertUser, Config, UpstreamMode};
use crate::journal::JournalError;
use std::net::SocketAddr;

/// How often Valkey sends a replica a newline while it prepares an RDB (its replication
/// cron, once a second): what a transfer's progress bound must leave room for, twice.
const KEEPALIVE_MS: u64 = 1000;

impl Config {
    /// `[tls]`'s settings that need no file; the files themselves are read and checked by
    /// `net::tls` when walrus starts and at `walrus config check`.
    fn check_tls(&self) -> Result<(), String> {
        let t = &self.tls;
        if t.listen.is_empty() {
            if self.proxy.listen.is_none() {
                return Err("proxy.listen is \"\" and tls.listen is not set: walrus would accept no client; set either".into());
            }
            return Ok(());
        }
        let tls: SocketAddr = t.listen.parse().map_err(|_| {
            format!(
                "invalid value for tls.listen: {:?} (expected host:port with an IP address)",
                t.listen
            )
        })?;
        if self.proxy.listen == Some(tls) && tls.port() != 0 {
            return Err(format!(
                "tls.listen and proxy.listen are both {tls}: they need a port each"
            ));
        }
        for (key, value) in [
            ("tls.cert_file", &t.cert_file),
            ("tls.key_file", &t.key_file),
        ] {
            if value.is_empty() {
                return Err(format!(
                    "{key} must be set when tls.listen is: walrus's certificate and its key, PEM"
                ));
            }
        }
        let no_ca = t.ca_cert_file.is_empty() && t.ca_cert_dir.is_empty();
        if t.auth_clients != AuthClients::No && no_ca {
            let value = if t.auth_clients == AuthClients::Yes {
                "yes"
            } else {
                "optional"
            };
            return Err(format!(
                "tls.auth_clients = \"{value}\" needs tls.ca_cert_file or tls.ca_cert_dir: the CA client certificates are checked against (or set tls.auth_clients = \"no\")"
            ));
        }
        if t.auth_clients == AuthClients::No && t.auth_clients_user != CertUser::Off {
            return Err("tls.auth_clients_user needs client certificates: set tls.auth_clients to \"yes\" or \"optional\"".into());
        }
        if t.handshake_timeout_ms < 10 {
            return Err(format!(
                "invalid value for tls.handshake_timeout_ms: {} (must be at least 10)",
                t.handshake_timeout_ms
            ));
        }
        if t.reload_interval_ms != 0 && t.reload_interval_ms < 100 {
            return Err(format!(
                "invalid value for tls.reload_interval_ms: {} (0: on SIGHUP only; else at least 100)",
                t.reload_interval_ms
            ));
        }
        Ok(())
    }

    pub(super) fn check(&self) -> Result<(), ConfigError> {
        fn at_least(key: &str, value: u64, min: u64) -> Result<(), String> {
            if value < min {
                return Err(format!(
                    "invalid value for {key}: {value} (must be at least {min})"
                ));
            }
            Ok(())
        }
        self.log.filter()?;
        self.archive.check(self.durability.ack)?;
        if self.archive.enabled() && !self.durability.enabled {
            return Err(ConfigError::Invalid(
                "archive.url needs durability.enabled: the archive copies the journal".into(),
            ));
        }
        let p = &self.proxy;
        at_least("proxy.max_clients", p.max_clients as u64, 1)?;
        at_least("proxy.max_bulk_bytes", p.max_bulk_bytes as u64, 1)?;
        at_least("proxy.max_array_len", p.max_array_len as u64, 1)?;
        at_least("proxy.max_inline_bytes", p.max_inline_bytes as u64, 16)?;
        at_least("proxy.max_reply_depth", p.max_reply_depth as u64, 8)?;
        at_least("proxy.max_reply_bytes", p.max_reply_bytes as u64, 1024)?;
        at_least("proxy.max_push_bytes", p.max_push_bytes as u64, 1024)?;
        if let Some(bytes) = p.max_output_bytes {
            at_least("proxy.max_output_bytes", bytes as u64, 1024)?;
        }
        if p.worker_threads > 1024 {
            return Err(ConfigError::Invalid(format!(
                "invalid value for proxy.worker_threads: {} (must be at most 1024; 0: automatic)",
                p.worker_threads
            )));
        }
        at_least(
            "proxy.max_pipeline_requests",
            p.max_pipeline_requests as u64,
            1,
        )?;
        at_least(
            "proxy.max_query_buffer_bytes",
            p.max_query_buffer_bytes as u64,
            p.max_inline_bytes as u64,
        )?;
        let u = &self.upstream;
        at_least("upstream.pool_size", u.pool_size as u64, 1)?;
        if u.pool_size > 256 {
            return Err(ConfigError::Invalid(format!(
                "invalid value for upstream.pool_size: {} (at most 256)",
                u.pool_size
            )));
        }
        at_least("upstream.connect_timeout_ms", u.connect_timeout_ms, 1)?;
        // Each piece of an RDB Valkey sends (a full sync, a checkpoint) must come within
        // the reply timeout, and Valkey sends a newline a second while it prepares one.
        if u.reply_timeout_ms < 2 * KEEPALIVE_MS {
            return Err(ConfigError::Invalid(format!(
                "invalid value for upstream.reply_timeout_ms: {} (must be at least {}: it also bounds each piece of an RDB Valkey sends, and Valkey sends a newline a second while it prepares one)",
                u.reply_timeout_ms,
                2 * KEEPALIVE_MS
            )));
        }
        at_least(
            "upstream.max_in_flight_requests",
            u.max_in_flight_requests as u64,
            1,
        )?;
        at_least(
            "upstream.reconnect_backoff_max_ms",
            u.reconnect_backoff_max_ms,
            1,
        )?;
        if u.mode == UpstreamMode::External && u.address.is_empty() {
            return Err(ConfigError::Invalid(
                "invalid value for upstream.address: \"\" (external mode needs an address)".into(),
            ));
        }
        if u.tls.enabled {
            // Managed mode runs its own valkey-server on a Unix socket only walrus opens,
            // where TLS would only cost CPU; its certificate would be walrus's to make.
            if u.mode == UpstreamMode::Managed {
                return Err(ConfigError::Invalid("upstream.tls.enabled needs upstream.mode = \"external\": a managed valkey-server is reached on its Unix socket only, where TLS protects nothing".into()));
            }
            // How net::Address tells a Unix socket (config is below net: not imported).
            if u.address.starts_with("unix:") || u.address.starts_with('/') {
                return Err(ConfigError::Invalid(format!(
                    "upstream.tls.enabled with the Unix socket upstream.address = {:?}: TLS is for TCP addresses (a Unix socket is reached only from this machine)",
                    u.address
                )));
            }
        }
        if !u.password.is_empty() && !u.password_file.is_empty() {
            return Err(ConfigError::Invalid(
                "upstream.password and upstream.password_file are both set: choose one".into(),
            ));
        }
        if !self.metrics.listen.is_empty() && self.metrics.listen.parse::<SocketAddr>().is_err() {
            return Err(ConfigError::Invalid(format!(
                "invalid value for metrics.listen: {:?} (expected host:port)",
                self.metrics.listen
            )));
        }
        if self.metrics.admin_allow_remote && self.metrics.admin_token_file.is_empty() {
            return Err(ConfigError::Invalid(
                "metrics.admin_allow_remote needs metrics.admin_token_file: without a token, anyone who reaches the metrics port could take checkpoints and write backups".into(),
            ));
        }
        if let Some(bytes) = self.durability.max_pending_bytes {
            at_least("durability.max_pending_bytes", bytes, 1 << 20)?;
        }
        at_least(
            "durability.max_held_bytes",
            self.durability.max_held_bytes,
            1 << 20,
        )?;
        at_least("restore.timeout_ms", self.restore.timeout_ms, 100)?;
        at_least("durability.max_hold_ms", self.durability.max_hold_ms, 100)?;
        let (low, high) = (self.disk.low_watermark, self.disk.high_watermark);
        if !(low > 0.0 && low < high && high < 1.0) {
            return Err(ConfigError::Invalid(format!(
                "invalid values for disk.low_watermark ({low}) and disk.high_watermark ({high}): need 0 < low < high < 1"
            )));
        }
        at_least("disk.check_interval_ms", self.disk.check_interval_ms, 10)?;
        if let Some(trigger) = self.checkpoint.ring_fill_trigger {
            // Below the ring's own high mark too: on a ring of few segments it is lower than
            // the disk's (3 segments: 2/3), and a trigger past it never comes before writes
            // are refused.
            let ring_high = self.ring_watermarks().0;
            if !(trigger > 0.0 && trigger < low && trigger < ring_high) {
                return Err(ConfigError::Invalid(format!(
                    "invalid value for checkpoint.ring_fill_trigger: {trigger} (must be above 0 and below disk.low_watermark, {low}, and the ring's own high mark, {ring_high:.4}, so that a checkpoint frees the ring before writes are refused; unset, it follows the marks)"
                )));
            }
        }
        let budget = self.checkpoint.max_restore_seconds;
        if !(budget.is_finite() && budget > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "invalid value for checkpoint.max_restore_seconds: {budget} (must be a number of seconds above 0)"
            )));
        }
        if self.data.dir.as_os_str().is_empty() {
            return Err(ConfigError::Invalid(
                "invalid value for data.dir: \"\"".into(),
            ));
        }
        // The journal's message names its key, as every other here does: no prefix.
        self.journal.validate().map_err(|e| match e {
            JournalError::Config(why) => ConfigError::Invalid(why),
            e => ConfigError::Invalid(e.to_string()),
        })?;
        self.check_managed()?;
        self.check_tls()?;
        if self.cluster.enabled {
            let Some(listen) = self.proxy.listen else {
                return Err(ConfigError::Invalid("cluster.enabled needs proxy.listen: cluster clients are told its port (TLS cluster clients are not supported yet)".into()));
            };
            self.cluster.check(listen)?;
        }
        // The ring's own low mark is half a segment below its high one: low disk marks on a
        // ring of few segments would put it at or below 0, where the ring's figure never is.
        let (ring_high, ring_low) = self.ring_watermarks();
        if ring_low <= 0.0 {
            return Err(ConfigError::Invalid(format!(
                "invalid values for disk.high_watermark ({high}) and disk.low_watermark ({low}) with journal.segments = {}: the ring's own marks would be {ring_high} and {ring_low} (its figure moves a segment at a time, and its low mark is half a segment below the high one); raise the marks or use more segments",
                self.journal.segments
            )));
        }
        // In whole segments (see `ring_fill_trigger`): a trigger below 2 checkpoints an idle
        // ring without end, and one at or past the segment where the ring refuses writes
        // leaves a failed checkpoint no room. A ring of 3 segments cannot have both.
        let trigger = self.ring_fill_trigger();
        let (at, refuse) = (
            self.ring_segments_at(trigger),
            self.ring_segments_at(ring_high),
        );
        if self.journal.segments > crate::journal::config::MIN_SEGMENTS
            && !(2..refuse).contains(&at)
        {
            return Err(ConfigError::Invalid(format!(
                "invalid checkpoint trigger for journal.segments = {}: checkpoint.ring_fill_trigger {trigger:.4} starts checkpoints at {at} segments in use, and the ring refuses writes at {refuse} (its high mark, {ring_high:.4}); the trigger must come at 2 segments or more and before the high mark: leave it unset, change it, raise the marks or use more segments",
                self.journal.segments
            )));
        }
        Ok(())
    }
}
