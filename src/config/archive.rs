//! `[archive]`: the continuous copy of checkpoints and the journal in object storage
//! ([`crate::archive`]), and how a new node starts from it.

use super::ConfigError;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiveConfig {
    /// Where the archive is: `s3://BUCKET/PREFIX` (AWS S3 or any S3-compatible store) or
    /// `file:///PATH` (a mounted directory, NFS); "": no archive.
    pub url: String,
    /// S3: the endpoint of a store other than AWS (`https://minio.internal:9000`); "":
    /// AWS's, for `region`. An `http://` endpoint is spoken to without TLS.
    pub endpoint: String,
    /// S3: the bucket's region; "": `AWS_REGION`, else `AWS_DEFAULT_REGION`, else us-east-1.
    pub region: String,
    /// S3: name the bucket in the host (`BUCKET.ENDPOINT`) rather than in the path.
    pub virtual_hosted_style: bool,
    /// S3: a credentials file in the AWS shared format (`[default]`,
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`), read again when
    /// it changes (a Kubernetes Secret mounted as a file). "": the usual chain: the
    /// `AWS_ACCESS_KEY_ID` environment, then `AWS_SHARED_CREDENTIALS_FILE` or
    /// `~/.aws/credentials`, then web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`, IRSA), then
    /// the container or instance metadata.
    pub credentials_file: String,
    /// S3: the profile to read in a credentials file; "": `AWS_PROFILE`, else `default`.
    pub profile: String,
    /// S3: a CA certificate (PEM) the store's certificate may chain to, besides the system's.
    pub ca_cert_file: String,
    /// The journal's tail is in the archive at most this long after it became durable
    /// (an upload starts half of it after the oldest entry not yet archived became durable).
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub max_lag_ms: u64,
    /// Refuse writes with `-MISCONF` while the archive lags more than `max_lag_ms` behind the
    /// journal: a store that cannot keep up then puts at risk only what was acknowledged in
    /// the `max_lag_ms` before it fell behind. Off: walrus serves on while the archive cannot
    /// keep up, and says so.
    pub enforce_max_lag: bool,
    /// A walrus whose data directory holds nothing restores from the archive's latest
    /// restore point before it serves (a new node replacing a lost one).
    pub bootstrap: bool,
    /// An upload starts at once when this much journal waits (a sealed segment's worth);
    /// unset: `journal.segment_size_bytes`.
    #[serde(deserialize_with = "crate::units::size_opt")]
    #[schemars(with = "crate::units::Size")]
    pub object_bytes: Option<u64>,
    /// Journal objects smaller than `object_bytes` are merged, this many at a time, so that
    /// a restore reads few objects however small the uploads were (0: never).
    pub merge_objects: u32,
    /// The newest journal kept in memory for the uploader (payloads and their bookkeeping),
    /// so that it does not read back, from the disk the journal writes to, what was just
    /// written; unset: twice `object_bytes` (an upload and the merge of the small ones
    /// before it). 0: none, every upload reads the journal back.
    #[serde(deserialize_with = "crate::units::size_opt")]
    #[schemars(with = "crate::units::Size")]
    pub memory_bytes: Option<u64>,
    /// A checkpoint is uploaded once this much journal was archived after the last one
    /// (and whenever the archive's journal could not go on without one); unset: the ring's
    /// size, so a restore from the archive replays at most about a ring more than one from
    /// the local disk.
    #[serde(deserialize_with = "crate::units::size_opt")]
    #[schemars(with = "crate::units::Size")]
    pub checkpoint_after_bytes: Option<u64>,
    /// A checkpoint is uploaded at least this often while writes come, one taken for it
    /// when the ring's rules have not (0: only by `checkpoint_after_bytes`): the newest
    /// restore point is never much older, and `WalrusArchiveRestorePointOld` can say when
    /// it is.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub checkpoint_interval_ms: u64,
    /// Restore points kept: at most this many (the newest is always kept; 0: no limit).
    pub keep_restore_points: u32,
    /// Restore points kept: none older than this (the newest is always kept; 0: no limit).
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub keep_for_ms: u64,
    /// Longest one request to the store may take, retries included.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub request_timeout_ms: u64,
    /// Longest wait between two retries of a failed upload.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub max_backoff_ms: u64,
    /// How often walrus checks that the archive is still its own to write (another walrus
    /// took it over after a restore from it); every manifest update checks it too.
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub owner_check_interval_ms: u64,
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        ArchiveConfig {
            url: String::new(),
            endpoint: String::new(),
            region: String::new(),
            virtual_hosted_style: false,
            credentials_file: String::new(),
            profile: String::new(),
            ca_cert_file: String::new(),
            // Litestream's default sync interval: a second of writes at most.
            max_lag_ms: 1000,
            enforce_max_lag: false,
            bootstrap: false,
            object_bytes: None,
            // A minute of one-second uploads become one object, an hour's of those another.
            merge_objects: 60,
            memory_bytes: None,
            checkpoint_after_bytes: None,
            checkpoint_interval_ms: 24 * 3_600_000,
            keep_restore_points: 7,
            keep_for_ms: 7 * 24 * 3_600_000,
            request_timeout_ms: 10_000,
            max_backoff_ms: 30_000,
            owner_check_interval_ms: 60_000,
        }
    }
}

/// How long a write's reply waits: until the local journal holds it, or the archive too.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Ack {
    /// The journal on this node's disk holds it.
    #[default]
    Local,
    /// The archive holds it as well (`[archive]` must be set): no acknowledged write is
    /// lost with the node.
    Archive,
}

impl ArchiveConfig {
    pub fn enabled(&self) -> bool {
        !self.url.is_empty()
    }

    pub(super) fn check(&self, ack: Ack) -> Result<(), ConfigError> {
        if !self.enabled() {
            if ack == Ack::Archive {
                return Err(ConfigError::Invalid("durability.ack = \"archive\" needs archive.url: the archive a write's reply waits for".into()));
            }
            if self.bootstrap || self.enforce_max_lag {
                let key = if self.bootstrap {
                    "archive.bootstrap"
                } else {
                    "archive.enforce_max_lag"
                };
                return Err(ConfigError::Invalid(format!("{key} needs archive.url")));
            }
            return Ok(());
        }
        ArchiveUrl::parse(&self.url).map_err(|e| format!("invalid value for archive.url: {e}"))?;
        if self.max_lag_ms < 10 {
            return Err(ConfigError::Invalid(format!(
                "invalid value for archive.max_lag_ms: {} (must be at least 10)",
                self.max_lag_ms
            )));
        }
        if self.request_timeout_ms < 100 {
            return Err(ConfigError::Invalid(format!(
                "invalid value for archive.request_timeout_ms: {} (must be at least 100)",
                self.request_timeout_ms
            )));
        }
        if self.max_backoff_ms == 0 || self.owner_check_interval_ms == 0 {
            return Err(ConfigError::Invalid(
                "archive.max_backoff_ms and archive.owner_check_interval_ms must be above 0".into(),
            ));
        }
        if self.merge_objects == 1 {
            return Err(ConfigError::Invalid(
                "invalid value for archive.merge_objects: 1 (0: never merge; else at least 2)"
                    .into(),
            ));
        }
        if self.object_bytes == Some(0) || self.checkpoint_after_bytes == Some(0) {
            return Err(ConfigError::Invalid(
                "archive.object_bytes and archive.checkpoint_after_bytes must be above 0".into(),
            ));
        }
        Ok(())
    }
}

/// Where an archive is, as `archive.url` (or `--from`) names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchiveUrl {
    /// An S3 bucket, and the prefix (no leading or trailing `/`) every key starts with.
    S3 { bucket: String, prefix: String },
    /// A directory (absolute).
    Dir(std::path::PathBuf),
}

impl ArchiveUrl {
    pub fn parse(text: &str) -> Result<ArchiveUrl, ConfigError> {
        let usage = || format!("{text:?}: expected s3://BUCKET/PREFIX or file:///ABSOLUTE/PATH");
        if let Some(rest) = text.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let prefix = prefix.trim_matches('/');
            let valid_bucket = (3..=63).contains(&bucket.len())
                && bucket.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if !valid_bucket {
                return Err(ConfigError::Invalid(format!(
                    "{}: {bucket:?} is not a bucket name (3 to 63 lowercase letters, digits, '-' and '.')",
                    usage()
                )));
            }
            let clean = prefix
                .split('/')
                .all(|p| !p.is_empty() && p != "." && p != "..");
            if !prefix.is_empty() && !clean {
                return Err(ConfigError::Invalid(format!(
                    "{}: the prefix {prefix:?} has an empty, . or .. part",
                    usage()
                )));
            }
            return Ok(ArchiveUrl::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.to_string(),
            });
        }
        if let Some(path) = text.strip_prefix("file://") {
            let path = std::path::Path::new(path);
            let dotted = path.components().any(|c| {
                matches!(
                    c,
                    std::path::Component::ParentDir | std::path::Component::CurDir
                )
            });
            if !path.is_absolute() || dotted {
                return Err(ConfigError::Invalid(format!(
                    "{}: the path must be absolute, without . or ..",
                    usage()
                )));
            }
            return Ok(ArchiveUrl::Dir(path.to_path_buf()));
        }
        Err(ConfigError::Invalid(usage()))
    }
}

impl std::fmt::Display for ArchiveUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArchiveUrl::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            ArchiveUrl::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            ArchiveUrl::Dir(p) => write!(f, "file://{}", p.display()),
        }
    }
}
