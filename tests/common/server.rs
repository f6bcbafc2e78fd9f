//! The server under test (`valkey-server` as deploy/setup.sh installs it, or `VALKEY_SERVER`
//! for one version of the matrix), and the features its version has: a test of a feature
//! the server lacks says so and passes, so that one suite serves every version.
use std::path::PathBuf;
use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Valkey (`true`) or Redis OSS.
    pub valkey: bool,
    pub v: (u32, u32, u32),
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.v;
        let name = if self.valkey { "Valkey" } else { "Redis" };
        write!(f, "{name} {a}.{b}.{c}")
    }
}

/// A server binary's version, from `--version`: `Valkey server v=9.1.2 ...` or
/// `Redis server v=7.0.15 ...`.
pub fn version_of(binary: &std::path::Path) -> Version {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .expect("run the server's --version");
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or_else(|| panic!("no version in {text:?}"));
    let n: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
    Version {
        valkey: text.starts_with("Valkey"),
        v: (n[0], n[1], n[2]),
    }
}

/// The version of the server every test starts.
pub fn under_test() -> Version {
    static V: OnceLock<Version> = OnceLock::new();
    *V.get_or_init(|| version_of(&super::valkey_server_bin()))
}

impl Version {
    /// At least Valkey `valkey`, or at least Redis OSS `redis` (`None`: no Redis has it).
    pub fn since(&self, valkey: (u32, u32), redis: Option<(u32, u32)>) -> bool {
        let (a, b, _) = self.v;
        if self.valkey {
            (a, b) >= valkey
        } else {
            redis.is_some_and(|r| (a, b) >= r)
        }
    }

    /// Hash-field expiration: HEXPIRE, HTTL, HPERSIST (Valkey 9.0, Redis 7.4); HSETEX,
    /// HGETEX (Valkey 9.0, Redis 8.0).
    pub fn hash_field_ttls(&self) -> bool {
        self.since((9, 0), Some((8, 0)))
    }

    /// `SET ... IFEQ` (Valkey 8.1).
    pub fn set_ifeq(&self) -> bool {
        self.since((8, 1), None)
    }

    /// What came with Redis 7.2, which every Valkey has: `CLIENT SETINFO`, `ZRANK ...
    /// WITHSCORE`, `WAITAOF`, small lists and sets as listpacks, a nested MULTI that aborts.
    pub fn redis_7_2(&self) -> bool {
        self.since((7, 2), Some((7, 2)))
    }

    /// `HSCAN ... NOVALUES` (Valkey 8.0, Redis 7.4).
    pub fn hscan_novalues(&self) -> bool {
        self.since((8, 0), Some((7, 4)))
    }
}

/// Whether the server under test has a feature; if not, says which test part is skipped.
pub fn has(feature: bool, what: &str) -> bool {
    if !feature {
        eprintln!("skipped: {what}: {} does not have it", under_test());
    }
    feature
}

/// The servers of the version matrix that deploy/setup.sh installs besides the default:
/// `<cache>/walrus/servers/<name>-<version>` (see `deploy/setup.sh`), newest first. Panics
/// if there are none: the README's test command installs them, and a matrix that silently
/// ran nothing would pass.
pub fn matrix() -> Vec<(Version, PathBuf)> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
    let dir = cache.join("walrus/servers");
    let mut found: Vec<(Version, PathBuf)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .map(|p| (version_of(&p), p))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !found.is_empty(),
        "no servers in {}: run deploy/setup.sh, which installs the version matrix",
        dir.display()
    );
    found.sort();
    found.reverse();
    found
}
