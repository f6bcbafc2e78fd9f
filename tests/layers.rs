//! The architecture rule, checked: no module imports one of a higher layer, and no two
//! modules import each other (`.ci/layers.py` draws the graph from the `use` lines; the
//! layers are listed there and in lib.rs). The same for the benchmark tool in deploy/
//! (`.ci/bench_layers.py`).

/// Runs a check of .ci/ and fails with what it printed.
fn check(script: &str) {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("python3")
        .arg(format!("{root}/.ci/{script}"))
        .output()
        .unwrap_or_else(|e| panic!("python3 runs .ci/{script}: {e}"));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn no_import_points_up_and_no_cycle() {
    check("layers.py");
}

/// deploy/bench/'s shared modules import no suite, no Python file of deploy/ imports one
/// that imports it back, and deploy/bench.py and the other entry points start.
#[test]
fn the_benchmark_tool_has_no_import_cycle_and_starts() {
    check("bench_layers.py");
}
