//! `[upstream]`: where Valkey is and how walrus reaches it; in managed mode, where the
//! Unix socket that is walrus's only way to its own Valkey lives.

use super::Config;
use super::ConfigError;
use serde::Deserialize;
use std::path::PathBuf;

/// The longest path a Unix socket may have: `sun_path` holds 108 bytes with the final NUL.
/// Valkey cuts nothing: it refuses to start on a longer one, so walrus checks it first.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// The managed Valkey's socket, in [`Config::socket_dir`].
pub const VALKEY_SOCKET: &str = "valkey.sock";
/// The socket of the second valkey-server a cluster node's restore runs beside it
/// ([`crate::restore::in_place`]).
pub const RESTORE_SOCKET: &str = "valkey-restore.sock";

/// Settings walrus sets on the managed valkey-server itself, which `upstream.extra_args`
/// must not name: each would open Valkey to clients around walrus, or move the socket
/// walrus connects to. `include` would read settings no check sees.
const OWN_ARGS: &[&str] = &[
    "port",
    "tls-port",
    // Valkey built with RDMA listens there too.
    "rdma-port",
    "rdma-bind",
    // A cluster bus listens on TCP: walrus's to open, in cluster mode ([cluster]).
    "cluster-enabled",
    "cluster-port",
    "unixsocket",
    "unixsocketperm",
    "unixsocketgroup",
    "include",
];

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamMode {
    /// walrus runs its own valkey-server child.
    Managed,
    /// walrus connects to a Valkey it does not manage.
    External,
}

#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    pub mode: UpstreamMode,
    pub address: String,
    pub username: String,
    pub password: String,
    pub password_file: String,
    pub pool_size: usize,
    /// How long opening a connection to Valkey may take: the connect, the TLS handshake and
    /// the commands that set it up (AUTH, CLIENT ID, RESET, HELLO).
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub connect_timeout_ms: u64,
    /// How long walrus waits for Valkey on an open connection: each reply, each write, each
    /// piece of an RDB it sends; a connection that owes clients replies with no byte from
    /// Valkey this long is given up, failing the requests on it. At least 2000 (Valkey sends
    /// a newline a second while it prepares an RDB).
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub reply_timeout_ms: u64,
    /// Requests one connection to Valkey may owe replies for before it waits for one.
    pub max_in_flight_requests: usize,
    #[serde(deserialize_with = "crate::units::millis")]
    #[schemars(with = "crate::units::Millis")]
    pub reconnect_backoff_max_ms: u64,
    pub valkey_server: String,
    /// Managed mode: the directory of the managed Valkey's Unix socket, walrus's only way to
    /// it (Valkey listens on no TCP port). walrus creates it with mode 0700 and refuses one
    /// that others may open or another user owns. Empty: `run` under `data.dir`. A socket's
    /// path has at most 107 bytes (the kernel's sun_path, [`MAX_SOCKET_PATH_BYTES`]): a
    /// shorter directory here when the data directory's path is too long.
    pub socket_dir: PathBuf,
    /// Removed: the managed Valkey has no TCP port any more. Kept out of the schema, and
    /// read only to say so when a configuration still sets it (0, the old default, is
    /// accepted: it asked for nothing).
    #[schemars(skip)]
    pub port: Option<u16>,
    pub extra_args: Vec<String>,
    /// External mode: refuse to start when Valkey's settings differ from what walrus needs
    /// (otherwise each difference is logged once, with what it risks).
    pub strict_settings: bool,
    pub tls: super::UpstreamTlsConfig,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            mode: UpstreamMode::Managed,
            address: "127.0.0.1:6380".into(),
            username: String::new(),
            password: String::new(),
            password_file: String::new(),
            // One connection carries every client's stateless commands in large batches:
            // Valkey's one thread reads them with fewer calls, and walrus's durability gate
            // asks one ROLE per batch. On two cores this measured 20-30% more durable SETs
            // and GETs than four connections.
            pool_size: 1,
            connect_timeout_ms: 2_000,
            // Far above any command Valkey serves in normal use, and above its
            // busy-reply-threshold (5 s), past which a script gets other clients -BUSY.
            reply_timeout_ms: 30_000,
            // Far more than a connection needs to stay busy (a batch is at most 256 KiB),
            // and a bound on what a Valkey that answers slowly can make walrus keep: about
            // 100 bytes of bookkeeping per request, some MiB per connection.
            max_in_flight_requests: 64 << 10,
            reconnect_backoff_max_ms: 1_000,
            valkey_server: String::new(),
            socket_dir: PathBuf::new(),
            port: None,
            extra_args: Vec::new(),
            strict_settings: false,
            tls: super::UpstreamTlsConfig::default(),
        }
    }
}

impl Config {
    /// Managed mode: the directory of Valkey's socket (`upstream.socket_dir`, or `run` under
    /// the data directory), as an absolute path: Valkey works in a directory of its own, where
    /// a relative one would name another place.
    pub fn socket_dir(&self) -> PathBuf {
        let dir = if self.upstream.socket_dir.as_os_str().is_empty() {
            self.data.dir.join("run")
        } else {
            self.upstream.socket_dir.clone()
        };
        std::path::absolute(&dir).unwrap_or(dir)
    }

    /// The path of the socket `name` in [`Config::socket_dir`]; an error naming the limit
    /// and the key to change when it is too long for a Unix socket.
    pub fn socket_path(&self, name: &str) -> Result<PathBuf, ConfigError> {
        let path = self.socket_dir().join(name);
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH_BYTES {
            return Err(ConfigError::Invalid(format!(
                "the managed Valkey's Unix socket {} would be {len} bytes long, and a socket's path has at most {MAX_SOCKET_PATH_BYTES} (sun_path): set upstream.socket_dir to a shorter directory (walrus creates it, mode 0700)",
                path.display()
            )));
        }
        Ok(path)
    }

    /// Managed mode's settings: the socket's path fits, `extra_args` leaves walrus's own
    /// arguments alone, the removed `upstream.port` is not set.
    pub(super) fn check_managed(&self) -> Result<(), ConfigError> {
        let u = &self.upstream;
        if let Some(port) = u.port.filter(|&p| p != 0) {
            return Err(ConfigError::Invalid(format!(
                "upstream.port = {port}: the setting was removed; the managed Valkey listens on no TCP port, only on a Unix socket in upstream.socket_dir (`valkey-cli -s {}` reaches it), so that nothing reaches it around walrus; remove the key",
                self.socket_dir().join(VALKEY_SOCKET).display()
            )));
        }
        check_extra_args(&u.extra_args)
            .map_err(|e| format!("invalid value for upstream.extra_args: {e}"))?;
        if u.mode == UpstreamMode::Managed {
            self.socket_path(VALKEY_SOCKET)?;
            if self.cluster.enabled {
                self.socket_path(RESTORE_SOCKET)?;
            }
        }
        Ok(())
    }
}

/// Reads `extra_args` as valkey-server reads its command line (server.c, `main`): an
/// argument starting with `--` names a setting, and may carry its values after a space
/// (`"--port 6380"` is one line of config); the arguments that follow are its values. Each
/// name must be a plain word (Valkey would unquote `--"port"`), not one of [`OWN_ARGS`],
/// and no argument may hold a line break (a second line of config). The last setting must
/// have a value: Valkey would take walrus's own `--port`, which follows, as that value.
fn check_extra_args(args: &[String]) -> Result<(), String> {
    let mut wants_value: Option<&str> = None;
    for arg in args {
        if arg.contains(['\n', '\r']) {
            return Err(format!(
                "{arg:?} holds a line break, which valkey-server would read as another setting"
            ));
        }
        let Some(setting) = arg.strip_prefix("--") else {
            wants_value = None;
            continue;
        };
        let mut words = setting.split_whitespace();
        let name = words.next().unwrap_or("");
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !plain {
            return Err(format!(
                "{arg:?}: a setting's name is letters, digits, '-', '_' and '.'"
            ));
        }
        if OWN_ARGS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{arg:?} is walrus's to set: the managed Valkey listens only on its Unix socket in upstream.socket_dir, reachable by walrus's user alone (docs/security.md, \"Security\")"
            ));
        }
        // `--save` alone means `save ""` (Valkey's special case).
        let alone = words.next().is_none() && !name.eq_ignore_ascii_case("save");
        wants_value = alone.then_some(arg);
    }
    match wants_value {
        Some(arg) => Err(format!(
            "{arg:?} comes last with no value; valkey-server would take walrus's own next argument as its value"
        )),
        None => Ok(()),
    }
}
