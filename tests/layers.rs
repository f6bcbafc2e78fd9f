//! The architecture rule, checked: no module imports one of a higher layer, and no two
//! modules import each other (`.ci/layers.py` draws the graph from the `use` lines; the
//! layers are listed there and in lib.rs).

#[test]
fn no_import_points_up_and_no_cycle() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("python3")
        .arg(format!("{root}/.ci/layers.py"))
        .output()
        .expect("python3 runs .ci/layers.py");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
