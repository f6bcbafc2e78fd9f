//! The README and docs/ as a reader follows them: every link between the pages leads to a
//! file and a heading, every section that a message, a comment or a page names by its
//! title is on the page it names, and the README's quick start runs as it reads.

use crate::common;
use common::*;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The markdown pages a reader moves between.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        root().join("README.md"),
        root().join("helm/walrus/README.md"),
        root().join("deploy/kubernetes/README.md"),
    ];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

/// The page's text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The titles of the page's headings.
fn headings(text: &str) -> Vec<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().to_string())
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens; a
/// title met again gets `-1`, `-2`, ...
fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for title in headings(text) {
        let base: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let seen = out
            .iter()
            .filter(|a| {
                **a == base
                    || a.strip_prefix(&format!("{base}-"))
                        .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count();
        out.push(if seen == 0 {
            base
        } else {
            format!("{base}-{seen}")
        });
    }
    out
}

/// `a/b/../c` as `a/c`, without asking the file system.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn every_link_between_the_pages_leads_to_a_file_and_a_heading() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = prose(&read(&page));
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let target = &rest[..rest.find(')').unwrap_or(0)];
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                page.clone()
            } else {
                normal(&page.parent().unwrap().join(file))
            };
            let name = page.strip_prefix(root()).unwrap().display().to_string();
            if !path.exists() {
                broken.push(format!("{name}: {target}: no such file"));
            } else if !anchor.is_empty()
                && path.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&path)).iter().any(|a| a == anchor)
            {
                broken.push(format!("{name}: {target}: no such heading"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every file under `dir` whose text is UTF-8.
fn texts(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    if dir.is_file() {
        if let Ok(text) = std::fs::read_to_string(dir) {
            out.push((dir.to_path_buf(), text));
        }
        return;
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        texts(&entry.unwrap().path(), out);
    }
}

/// `s` past its blanks and a comment leader (`//!`, `///`, `//`, `#`) a reference may wrap
/// past.
fn after_leader(s: &str) -> &str {
    let s = s.trim_start_matches([' ', '\t']);
    ["//!", "///", "//", "#"]
        .iter()
        .find_map(|l| s.strip_prefix(l))
        .unwrap_or(s)
        .trim_start_matches([' ', '\t'])
}

/// The sections named by title after a page: `PAGE, "Title"` or `PAGE "Title"` (in a
/// string, with escaped quotes too), PAGE a `.md` path, a markdown link to one, or README.
/// Returns (the page as written, the title), the title's line breaks and comment leaders
/// folded into spaces.
fn section_refs(text: &str) -> Vec<(String, String)> {
    let bytes = text.as_bytes();
    let path_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/');
    let mut refs = Vec::new();
    for (at, word) in text
        .match_indices(".md")
        .map(|(i, _)| (i, ".md"))
        .chain(text.match_indices("README").map(|(i, _)| (i, "README")))
    {
        let mut end = at + word.len();
        if word == "README" && text[end..].starts_with(".md") {
            continue; // met as ".md"
        }
        if end < bytes.len() && bytes[end].is_ascii_alphanumeric() {
            continue;
        }
        let mut start = at;
        while start > 0 && path_char(bytes[start - 1]) {
            start -= 1;
        }
        let page = text[start..end].to_string();
        // A markdown link: `[text](page#anchor)`, the title after its `)`.
        if start > 1 && &text[start - 2..start] == "](" {
            match text[end..].find(')') {
                Some(close) if !text[end..end + close].contains(char::is_whitespace) => {
                    end += close + 1
                }
                _ => continue,
            }
        }
        // The separator: a comma or blanks, across at most one line break.
        let rest = &text[end..];
        let comma = rest.strip_prefix(',');
        let sep = comma.unwrap_or(rest);
        let mut tail = sep.trim_start_matches([' ', '\t']);
        let mut separated = comma.is_some() || tail.len() < sep.len();
        if let Some(next) = tail.strip_prefix('\n') {
            tail = after_leader(next);
            separated = true;
        }
        if !separated {
            continue;
        }
        let tail = tail.strip_prefix('\\').unwrap_or(tail);
        let Some(quoted) = tail.strip_prefix('"') else {
            continue;
        };
        let Some(close) = quoted.find(['"', '\\']) else {
            continue;
        };
        let title = quoted[..close]
            .lines()
            .map(|l| after_leader(l).trim_end())
            .collect::<Vec<_>>()
            .join(" ");
        refs.push((page, title));
    }
    refs
}

/// The page a reference names, seen from `from`: README is the nearest one above `from`;
/// a path is taken from `from`'s directory, else from the repository's root.
fn resolve(from: &Path, page: &str) -> PathBuf {
    if page == "README" || page == "README.md" {
        let mut dir = from.parent().unwrap();
        while !dir.join("README.md").exists() {
            dir = dir.parent().unwrap();
        }
        return dir.join("README.md");
    }
    let here = normal(&from.parent().unwrap().join(page));
    if here.exists() {
        return here;
    }
    let page = page.trim_start_matches("../");
    root().join(page)
}

/// The page has the section: a heading that starts with the title, or a paragraph or item
/// that leads with it in bold.
fn has_section(text: &str, title: &str) -> bool {
    headings(text).iter().any(|h| h.starts_with(title))
        || prose(text)
            .split(char::is_whitespace)
            .collect::<Vec<_>>()
            .join(" ")
            .contains(&format!("**{title}"))
}

#[test]
fn every_section_named_by_title_is_on_the_page_it_names() {
    let mut files = Vec::new();
    for dir in [
        "src",
        "tests",
        "deploy",
        "helm/walrus",
        "docs",
        "README.md",
        "config.toml",
    ] {
        texts(&root().join(dir), &mut files);
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for (file, text) in &files {
        for (page, title) in section_refs(text) {
            let path = resolve(file, &page);
            let name = file.strip_prefix(root()).unwrap().display();
            if !path.exists() {
                missing.push(format!("{name}: {page}, {title:?}: no such page"));
            } else if !has_section(&read(&path), &title) {
                let shown = path.strip_prefix(root()).unwrap().display();
                missing.push(format!("{name}: {shown} has no section {title:?}"));
            }
            checked += 1;
        }
    }
    // The binary's messages and config.toml name sections of docs/: if none were found,
    // the scan itself is broken.
    assert!(checked > 30, "only {checked} references found");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The README's commands are the ones CI runs, and its first session's promises (the ports,
/// the data directory, managed mode) are what config.toml sets.
#[test]
fn the_readmes_commands_are_cis_and_config_tomls() {
    let readme = read(&root().join("README.md"));
    let block = |heading: &str| -> String {
        let section = &readme[readme.find(heading).unwrap_or_else(|| panic!("{heading}"))..];
        let start = section.find("```sh\n").expect("a sh block") + "```sh\n".len();
        section[start..start + section[start..].find("```").unwrap()].to_string()
    };
    let run = block("\n## Run\n");
    assert_eq!(
        run.trim(),
        "deploy/setup.sh && cargo run --release -- serve --config config.toml"
    );
    let test = block("\n## Test\n");
    let ci = read(&root().join(".ci/run"));
    assert_eq!(
        ci.lines().last(),
        Some(test.trim()),
        ".ci/run must run the README's test command"
    );

    let config = walrus::config::Config::load(&root().join("config.toml")).unwrap();
    assert_eq!(config.upstream.mode, walrus::config::UpstreamMode::Managed);
    let listen = config.proxy.listen.unwrap().to_string();
    let metrics = config.metrics.listen.clone();
    let data = config.data.dir.display().to_string();
    for (said, what) in [
        (format!("listens on\n{listen}"), "proxy.listen"),
        (format!("http://{metrics}/metrics"), "metrics.listen"),
        (format!("`{data}/`"), "data.dir"),
    ] {
        assert!(
            readme.contains(&said),
            "README.md should say {said:?}, config.toml's {what}"
        );
    }
}

/// The README's two setups: the run path's `deploy/setup.sh` installs only what running
/// walrus needs, so it succeeds without Go (PATH without it, an empty cache: no helm to find
/// or build); the test path's `deploy/setup.sh --test` brings helm.
#[test]
fn the_run_setup_needs_no_go_and_the_test_setup_brings_helm() {
    let setup = root().join("deploy/setup.sh");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let without_go: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|dir| !dir.join("go").exists())
        .collect();
    let cache = tempfile::tempdir().unwrap();
    let run = Command::new("bash")
        .arg(&setup)
        .env("PATH", std::env::join_paths(&without_go).unwrap())
        .env("XDG_CACHE_HOME", cache.path())
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        run.status.success(),
        "deploy/setup.sh (the run path) failed without Go:\n{said}"
    );
    for tool in ["helm", "SeaweedFS", "go "] {
        assert!(
            !said.contains(tool),
            "the run path's setup should not need {tool}:\n{said}"
        );
    }
    assert!(
        !cache.path().join("walrus").exists(),
        "the run path's setup built or installed into the cache:\n{said}"
    );

    let test = Command::new("bash")
        .arg(&setup)
        .arg("--test")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&test.stdout);
    assert!(
        test.status.success(),
        "deploy/setup.sh --test failed:\n{said}{}",
        String::from_utf8_lossy(&test.stderr)
    );
    assert!(
        said.lines().any(|l| l.starts_with("setup: helm v3.")),
        "deploy/setup.sh --test should install helm:\n{said}"
    );
}

/// One `$ command` of a console block and the lines it prints.
struct Step {
    command: String,
    prints: Vec<String>,
}

/// The ```console blocks of the README's "A first session".
fn first_session() -> Vec<Vec<Step>> {
    let readme = read(&root().join("README.md"));
    let section = &readme[readme
        .find("\n## A first session\n")
        .expect("README.md has \"A first session\"")..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |e| e + 1)];
    let mut blocks = Vec::new();
    for piece in section.split("```console\n").skip(1) {
        let body = &piece[..piece.find("```").expect("a closed block")];
        let mut steps: Vec<Step> = Vec::new();
        for line in body.lines() {
            if let Some(command) = line.strip_prefix("$ ") {
                steps.push(Step {
                    command: command.to_string(),
                    prints: Vec::new(),
                });
            } else {
                steps
                    .last_mut()
                    .expect("a block starts with a command")
                    .prints
                    .push(line.to_string());
            }
        }
        blocks.push(steps);
    }
    blocks
}

/// Runs a block's commands against the walrus at `addr` (its metrics at `metrics`):
/// redis-cli as at a terminal (`--no-raw`), on walrus's port; each prints what the README
/// shows.
fn run_steps(steps: &[Step], addr: &str, metrics: &str) {
    let port = addr.rsplit(':').next().unwrap();
    for step in steps {
        let mut words: Vec<String> = step
            .command
            .split_whitespace()
            .map(|w| w.replace("127.0.0.1:8379", metrics))
            .collect();
        if words[0] == "redis-cli" {
            words.splice(1..1, ["--no-raw".into(), "-p".into(), port.into()]);
        } else {
            assert!(
                step.command.contains("127.0.0.1:8379"),
                "{}: only redis-cli and the metrics endpoint are run",
                step.command
            );
        }
        let out = Command::new(&words[0]).args(&words[1..]).output().unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            printed.lines().collect::<Vec<_>>(),
            step.prints,
            "{}: {}",
            step.command,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The README's "A first session", run as it reads: its first block against a managed
/// walrus (the README's Run, on free ports, with the tests' ring), walrus and its Valkey
/// then killed, and its second block against the walrus started again on the same data.
#[test]
fn the_readmes_first_session_runs_as_it_reads() {
    let blocks = first_session();
    assert_eq!(
        blocks.len(),
        2,
        "a session, then the same data after a kill"
    );
    let data = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let start = || {
        Walrus::build()
            .data(data.path())
            .args(&["--metrics-listen", &metrics])
            .start()
    };
    let mut w = start();
    run_steps(&blocks[0], &w.addr, &metrics);
    w.kill_with_valkey();
    let w = start();
    run_steps(&blocks[1], &w.addr, &metrics);
}

/// The walrus command lines of the pages' shell blocks: `walrus ARGS` (or a path to it),
/// also after `sudo -u USER`, `kubectl exec ... --` and `cargo run ... --`. Returns (page,
/// the line as shown, ARGS).
fn walrus_commands() -> Vec<(String, String, Vec<String>)> {
    let mut out = Vec::new();
    for page in pages() {
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        let text = read(&page);
        let mut shown = Vec::new();
        for piece in text.split("```").skip(1).step_by(2) {
            let Some((lang, body)) = piece.split_once('\n') else {
                continue;
            };
            if matches!(lang, "sh" | "bash" | "console") {
                shown.push(body.replace("\\\n", " "));
            }
        }
        for body in shown {
            for line in body.lines() {
                let line = line.trim().trim_start_matches("$ ");
                let line = line
                    .split(" #")
                    .next()
                    .unwrap()
                    .trim_end_matches('&')
                    .trim();
                for part in line.split(['|', ';', '&']) {
                    let mut words: Vec<&str> = part.split_whitespace().collect();
                    if words.first() == Some(&"sudo") {
                        words.remove(0);
                        while words.first().is_some_and(|w| w.starts_with('-')) {
                            words.drain(..2.min(words.len()));
                        }
                    }
                    if words.first() == Some(&"kubectl") || words.starts_with(&["cargo", "run"]) {
                        match words.iter().position(|w| *w == "--") {
                            Some(at) if words[0] == "kubectl" => {
                                words.drain(..=at);
                            }
                            Some(at) => {
                                words.drain(..at);
                                words[0] = "walrus";
                            }
                            None => continue,
                        }
                    }
                    let Some(program) = words.first() else {
                        continue;
                    };
                    if (*program == "walrus" || program.ends_with("/walrus")) && words.len() > 1 {
                        let args = words[1..].iter().map(|w| w.to_string()).collect();
                        out.push((name.clone(), part.trim().to_string(), args));
                    }
                }
            }
        }
    }
    out
}

/// Every walrus command the README and docs/ show is one walrus takes: its arguments parse
/// (checked with `--help` after them, which runs nothing; an unknown argument or
/// subcommand fails before it). What each command then does is run by the suites that
/// follow each page (`operations_guide`, `pitr`, `export_aof`, `security`, ...).
#[test]
fn every_walrus_command_the_pages_show_parses() {
    let commands = walrus_commands();
    assert!(
        commands.len() > 20,
        "only {} commands found",
        commands.len()
    );
    let mut refused = Vec::new();
    for (page, line, args) in &commands {
        let out = Command::new(walrus_bin())
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            refused.push(format!(
                "{page}: `{line}`: {}",
                why.lines().next().unwrap_or("")
            ));
        }
    }
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}
