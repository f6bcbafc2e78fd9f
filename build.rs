//! Stamps the commit walrus is built from into `walrus_build_info` (`unknown` outside a git
//! checkout, such as a container build from a source archive).

use std::process::Command;

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
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
