//! Security (README, "Security"): the admin endpoint refuses anyone without its token.

mod common;
use common::*;

/// With `metrics.admin_token_file`, `POST /checkpoint` and `/backup` need the token, from
/// loopback too; replacing the file rotates it; metrics, health, readiness and status stay
/// open; every admin request is logged with its caller. Remote admin access needs a token.
#[test]
fn the_admin_endpoint_refuses_anyone_without_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "first-token\n").unwrap();
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "first-tokex").unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "[metrics]\nadmin_token_file = {:?}\n",
        token.to_str().unwrap()
    );
    let w = Walrus::build()
        .config(&config)
        .args(&["--metrics-listen", &metrics])
        .start();
    w.await_writable();

    let checkpoint = |token_file: Option<&std::path::Path>| {
        let mut args = vec!["checkpoint", "--metrics", &metrics];
        if let Some(f) = token_file {
            args.extend(["--token-file", f.to_str().unwrap()]);
        }
        run_walrus(&args)
    };
    let out = checkpoint(None);
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("(401)")
            && output_text(&out).contains("metrics.admin_token_file"),
        "{}",
        output_text(&out)
    );
    let out = checkpoint(Some(&wrong));
    assert_eq!(out.status.code(), Some(2), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("wrong admin token"),
        "{}",
        output_text(&out)
    );
    let out = checkpoint(Some(&token));
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("checkpoint taken"),
        "{}",
        output_text(&out)
    );

    // Rotated: the old token is refused, the new one accepted, without a restart.
    let old = dir.path().join("old-token");
    std::fs::copy(&token, &old).unwrap();
    std::fs::write(&token, "second-token").unwrap();
    assert_eq!(checkpoint(Some(&old)).status.code(), Some(2));
    assert!(checkpoint(Some(&token)).status.success());

    // Everything else stays open.
    for path in ["/metrics", "/healthz", "/readyz", "/status"] {
        assert_eq!(http_get(&metrics, path).0, 200, "{path}");
    }
    // Each admin request in the log, with its caller.
    let log = w.proc.log_text();
    let refused = log
        .lines()
        .filter(|l| l.contains("admin request refused") && l.contains("peer=127.0.0.1:"))
        .count();
    let accepted = log
        .lines()
        .filter(|l| l.contains("admin request") && !l.contains("refused"))
        .filter(|l| l.contains("peer=127.0.0.1:"))
        .count();
    assert_eq!((refused, accepted), (3, 2), "{log}");

    // A token that cannot be read is refused at start, naming the file; remote admin
    // access without a token is refused too.
    let missing = dir.path().join("missing");
    let config = format!(
        "[metrics]\nadmin_token_file = {:?}\n",
        missing.to_str().unwrap()
    );
    let data = tempfile::tempdir().unwrap();
    let line = refuses_to_start(None, &config, data.path(), "admin_token_file");
    assert!(
        line.contains("cannot read") && line.contains("missing"),
        "{line}"
    );
    let config = "[metrics]\nadmin_allow_remote = true\n";
    let line = refuses_to_start(None, config, data.path(), "admin_allow_remote");
    assert!(line.contains("needs metrics.admin_token_file"), "{line}");
}
