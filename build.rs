//! Stamps the commit walrus is built from into `walrus --version` and `walrus_build_info`:
//! `WALRUS_COMMIT` when the build is given one, else git's HEAD, else `unknown`.

use std::process::Command;

fn main() {
    // A build without the repository's history (the Dockerfile's: .git is not in its
    // context) is told the commit: `docker build --build-arg COMMIT=...`.
    println!("cargo:rerun-if-env-changed=WALRUS_COMMIT");
    let commit = std::env::var("WALRUS_COMMIT")
        .ok()
        .filter(|c| !c.is_empty() && c != "unknown")
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WALRUS_COMMIT={commit}");
    // Where git keeps them: in a worktree `.git` is a file, and a path that does not exist
    // would make cargo run this script, and rebuild walrus, every time.
    for name in ["HEAD", "refs/heads"] {
        if let Some(path) = git(&["rev-parse", "--git-path", name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}
