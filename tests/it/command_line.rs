//! The command as an operator meets it: `--version` names the commit, shell completions and
//! man pages come from the command's own definition, and the license Cargo.toml declares
//! is the one the repository ships.

use std::process::{Command, Output};

fn walrus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walrus"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{o:?}");
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let version = stdout(&walrus(&["--version"]));
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    // The tests' walrus has fail points (docs/testing.md); a release build ends in `)`.
    assert_eq!(
        version.trim(),
        format!(
            "walrus {} ({commit}, with fail points: a test build)",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn completions_cover_every_command_and_parse() {
    let bash = stdout(&walrus(&["completions", "bash"]));
    for word in [
        "serve",
        "checkpoint",
        "journal",
        "config",
        "export-aof",
        "--data-dir",
    ] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    let check = Command::new("bash")
        .args(["-n", "-c", &bash])
        .output()
        .unwrap();
    assert!(check.status.success(), "bash -n: {check:?}");
    for shell in ["zsh", "fish"] {
        assert!(stdout(&walrus(&["completions", shell])).contains("serve"));
    }
    let bad = walrus(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}

#[test]
fn man_pages_document_every_command() {
    let page = stdout(&walrus(&["man"]));
    assert!(page.contains(".TH walrus 1"), "{page}");
    assert!(page.contains("serve") && page.contains("journal"));
    let dir = tempfile::tempdir().unwrap();
    stdout(&walrus(&["man", "--dir", dir.path().to_str().unwrap()]));
    for page in [
        "walrus.1",
        "walrus-serve.1",
        "walrus-journal-init.1",
        "walrus-config-check.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}");
    }
}

#[test]
fn the_repository_ships_the_license_cargo_declares() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"MIT\""));
    let license = std::fs::read_to_string(root.join("LICENSE")).unwrap();
    assert!(license.starts_with("MIT License"));
}
