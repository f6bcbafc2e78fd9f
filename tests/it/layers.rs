//! The architecture rule, checked: no module imports one of a higher layer, and no two
//! files or folders use each other (`.ci/layers.py` resolves every path the code writes; the
//! layers are listed there and in lib.rs). The other tests plant faults in a small tree of
//! their own and see the check catch each, and not be fooled by comments or strings.

use std::path::Path;

/// Runs a check of .ci/ with `args`: whether it passed, and what it printed.
fn run(script: &str, args: &[&std::ffi::OsStr]) -> (bool, String) {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("python3")
        .arg(format!("{root}/.ci/{script}"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("python3 runs .ci/{script}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs the layer check on `src`.
fn check(src: &Path) -> (bool, String) {
    run("layers.py", &["--src".as_ref(), src.as_os_str()])
}

/// A crate of four rooms (resp below upstream below proxy, as in LAYERS) with `files`
/// (path under src/, contents) laid over it.
fn planted(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let base: &[(&str, &str)] = &[
        (
            "lib.rs",
            "pub mod resp;\npub mod upstream;\npub mod proxy;\n",
        ),
        ("resp/mod.rs", "pub mod reply;\npub fn parse() {}\n"),
        ("resp/reply.rs", "pub struct Reply;\n"),
        (
            "upstream/mod.rs",
            "pub mod client;\npub mod tls;\npub use client::Conn;\n",
        ),
        (
            "upstream/client.rs",
            "pub struct Conn;\npub fn frame() {}\n",
        ),
        ("upstream/tls.rs", "pub fn explain() {}\n"),
        ("proxy/mod.rs", "pub mod session;\npub fn serve() {}\n"),
        ("proxy/session.rs", "pub struct Session;\n"),
    ];
    for (path, text) in base.iter().chain(files) {
        let f = dir.path().join(path);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, text).unwrap();
    }
    dir
}

#[test]
fn no_import_points_up_and_no_cycle() {
    let (ok, text) = check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(ok, "{text}");
}

#[test]
fn the_planted_tree_alone_passes() {
    let dir = planted(&[]);
    let (ok, text) = check(dir.path());
    assert!(ok, "{text}");
}

#[test]
fn an_inline_super_path_pointing_up_is_caught() {
    let dir = planted(&[(
        "resp/reply.rs",
        "pub struct Reply;\nfn f() { let _ = super::super::proxy::session::Session; }\n",
    )]);
    let (ok, text) = check(dir.path());
    assert!(!ok, "{text}");
    assert!(text.contains("up: resp -> proxy (resp/reply.rs)"), "{text}");
}

#[test]
fn nested_grouped_uses_and_re_exports_pointing_up_are_caught() {
    let dir = planted(&[(
        "resp/mod.rs",
        "pub mod reply;\npub fn parse() {}\n\
         pub use crate::{upstream::{self, Conn as C}, proxy::{session::{self}}};\n",
    )]);
    let (ok, text) = check(dir.path());
    assert!(!ok, "{text}");
    assert!(text.contains("up: resp -> proxy (resp/)"), "{text}");
    assert!(text.contains("up: resp -> upstream (resp/)"), "{text}");
}

#[test]
fn two_files_of_one_folder_that_use_each_other_are_a_cycle() {
    let dir = planted(&[
        (
            "upstream/client.rs",
            "use super::tls::explain;\npub struct Conn;\npub fn frame() { explain() }\n",
        ),
        (
            "upstream/tls.rs",
            "pub fn explain() {}\nfn f() { super::client::frame() }\n",
        ),
    ]);
    let (ok, text) = check(dir.path());
    assert!(!ok, "{text}");
    assert!(
        text.contains("cycle: upstream/client.rs <-> upstream/tls.rs"),
        "{text}"
    );
}

#[test]
fn a_cycle_through_a_re_export_is_a_cycle() {
    // tls names `super::Conn`, which upstream/mod.rs re-exports from client.
    let dir = planted(&[
        (
            "upstream/client.rs",
            "pub struct Conn;\npub fn frame() { super::tls::explain() }\n",
        ),
        ("upstream/tls.rs", "use super::Conn;\npub fn explain() {}\n"),
    ]);
    let (ok, text) = check(dir.path());
    assert!(!ok, "{text}");
    assert!(
        text.contains("cycle: upstream/client.rs <-> upstream/tls.rs"),
        "{text}"
    );
}

#[test]
fn comments_and_strings_neither_fake_nor_hide_a_path() {
    // Every upward path here is in a comment, a doc comment or a literal: no arrow.
    let faked = planted(&[(
        "resp/reply.rs",
        "//! Read by [`crate::proxy::serve`]; see `super::super::proxy::session`.\n\
         /// Like [`crate::proxy::session::Session`].\n\
         pub struct Reply;\n\
         /* use crate::proxy; /* nested */ crate::proxy::serve(); */\n\
         const A: &str = \"crate::proxy::serve\";\n\
         const B: &str = r#\"use crate::proxy;\"#;\n\
         const C: char = '\"';\n",
    )]);
    let (ok, text) = check(faked.path());
    assert!(ok, "{text}");
    // And a real upward path after a string holding `//`, or a quote in a char, is seen.
    let hidden = planted(&[(
        "resp/reply.rs",
        "pub struct Reply;\n\
         fn f() -> &'static str { let _ = '\"'; crate::proxy::serve(); \"http://x\" }\n\
         fn g() { let _ = \"//\"; super::super::proxy::serve(); }\n",
    )]);
    let (ok, text) = check(hidden.path());
    assert!(!ok, "{text}");
    assert!(text.contains("up: resp -> proxy (resp/reply.rs)"), "{text}");
}

#[test]
fn a_path_written_as_an_attributes_string_counts_but_not_a_doc_attributes() {
    let doc = planted(&[(
        "resp/reply.rs",
        "#[doc = \"crate::proxy::serve\"]\npub struct Reply;\n",
    )]);
    let (ok, text) = check(doc.path());
    assert!(ok, "{text}");
    let serde = planted(&[(
        "resp/reply.rs",
        "pub struct Reply {\n    #[serde(deserialize_with = \"crate::proxy::serve\")]\n    n: u64,\n}\n",
    )]);
    let (ok, text) = check(serde.path());
    assert!(!ok, "{text}");
    assert!(text.contains("up: resp -> proxy (resp/reply.rs)"), "{text}");
}

#[test]
fn super_in_an_inline_module_counts_from_that_module() {
    // In `mod tests` of client.rs, `super` is client itself: no arrow to tls from the
    // `super::` there, so no cycle; the same path at the file's top level would be one.
    let dir = planted(&[
        (
            "upstream/tls.rs",
            "pub fn explain() { super::client::frame() }\n",
        ),
        (
            "upstream/client.rs",
            "pub struct Conn;\npub fn frame() {}\nfn explain() {}\n\
             mod tests { fn t() { super::explain(); super::super::client::frame(); } }\n",
        ),
    ]);
    let (ok, text) = check(dir.path());
    assert!(ok, "{text}");
}

/// deploy/bench/'s shared modules import no suite, no Python file of deploy/ imports one
/// that imports it back, and deploy/bench.py and the other entry points start.
#[test]
fn the_benchmark_tool_has_no_import_cycle_and_starts() {
    let (ok, text) = run("bench_layers.py", &[]);
    assert!(ok, "{text}");
}

/// Runs the check that no public function returns `Result<_, String>` on `src`.
fn string_errors(src: &Path) -> (bool, String) {
    run("string_errors.py", &["--src".as_ref(), src.as_os_str()])
}

#[test]
fn no_public_function_returns_a_string_error() {
    let (ok, text) = string_errors(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(ok, "{text}");
}

#[test]
fn a_string_error_is_caught_over_several_lines_and_at_any_visibility() {
    let dir = planted(&[(
        "resp/reply.rs",
        "pub struct Reply;\n\
         pub(super) fn one(x: u8) -> Result<u8, String> { Ok(x) }\n\
         pub async fn two<T: Into<u8>>(\n    t: T,\n) -> Result<\n    (String, u8),\n    String,\n> {\n    Ok((String::new(), t.into()))\n}\n",
    )]);
    let (ok, text) = string_errors(dir.path());
    assert!(!ok, "{text}");
    assert!(text.contains("resp/reply.rs: fn one"), "{text}");
    assert!(text.contains("resp/reply.rs: fn two"), "{text}");
    // Private functions, other error types, and signatures in comments or strings pass.
    let fine = planted(&[(
        "resp/reply.rs",
        "pub struct Reply;\n\
         fn helper() -> Result<(), String> { Ok(()) }\n\
         pub fn typed() -> Result<String, std::io::Error> { Ok(String::new()) }\n\
         // pub fn commented() -> Result<(), String>\n\
         const S: &str = \"pub fn quoted() -> Result<(), String>\";\n",
    )]);
    let (ok, text) = string_errors(fine.path());
    assert!(ok, "{text}");
}
