//! Operator artefacts: the Prometheus alert rules (helm/walrus/files/, copied to
//! deploy/prometheus/), their promtool unit tests, their runbook (docs/operations.md)
//! and the Grafana dashboard. promtool comes from Debian's prometheus package, which
//! deploy/setup.sh installs (CI runs it before `cargo test`); python3 reads the dashboard's
//! JSON, as the crate has no JSON dev-dependency.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

/// Every metric family walrus exports, with its type. Mirrors the metrics module
/// (src/metrics/): a family added, renamed or removed there changes here too, and the alert
/// rules and dashboard may only use what is listed.
const METRICS: &[(&str, &str)] = &[
    ("walrus_build_info", "gauge"),
    ("walrus_valkey_info", "gauge"),
    ("walrus_clients_connected", "gauge"),
    ("walrus_clients_accepted_total", "counter"),
    ("walrus_clients_rejected_total", "counter"),
    ("walrus_clients_output_closed_total", "counter"),
    ("walrus_clients_notice_closed_total", "counter"),
    // Client-facing TLS: exported when `tls.listen` is set (the test below sets it).
    ("walrus_tls_certificate_expiry_timestamp_seconds", "gauge"),
    ("walrus_tls_reloads_total", "counter"),
    ("walrus_tls_cert_users_total", "counter"),
    ("walrus_commands_total", "counter"),
    ("walrus_command_duration_seconds", "histogram"),
    ("walrus_ack_hold_seconds", "histogram"),
    ("walrus_held_replies", "gauge"),
    ("walrus_held_bytes", "gauge"),
    ("walrus_dirty_keys", "gauge"),
    ("walrus_writes_refused_total", "counter"),
    ("walrus_durable_lag_bytes", "gauge"),
    ("walrus_journal_written_bytes_total", "counter"),
    ("walrus_journal_entries_total", "counter"),
    ("walrus_journal_entry_bytes_total", "counter"),
    ("walrus_journal_ring_bytes_total", "counter"),
    ("walrus_journal_write_duration_seconds", "histogram"),
    ("walrus_journal_fsync_duration_seconds", "histogram"),
    ("walrus_journal_ring_fill_ratio", "gauge"),
    ("walrus_journal_free_segments", "gauge"),
    ("walrus_journal_info", "gauge"),
    ("walrus_journal_failed", "gauge"),
    ("walrus_disk_used_ratio", "gauge"),
    ("walrus_disk_watermark_reached", "gauge"),
    ("walrus_checkpoints_total", "counter"),
    ("walrus_checkpoint_failures_total", "counter"),
    ("walrus_checkpoint_last_success_timestamp_seconds", "gauge"),
    ("walrus_checkpoint_last_duration_seconds", "gauge"),
    ("walrus_checkpoint_last_size_bytes", "gauge"),
    ("walrus_checkpoint_started_total", "counter"),
    ("walrus_checkpoint_written_bytes_total", "counter"),
    ("walrus_checkpoint_paced_seconds_total", "counter"),
    // The archive's, exported only with [archive] (as below).
    ("walrus_archive_info", "gauge"),
    ("walrus_archive_journal_bytes_total", "counter"),
    ("walrus_archive_lag_bytes", "gauge"),
    ("walrus_archive_lag_seconds", "gauge"),
    ("walrus_archive_last_upload_timestamp_seconds", "gauge"),
    (
        "walrus_archive_newest_restore_point_timestamp_seconds",
        "gauge",
    ),
    (
        "walrus_archive_oldest_restore_point_timestamp_seconds",
        "gauge",
    ),
    ("walrus_archive_requests_total", "counter"),
    ("walrus_archive_restore_points", "gauge"),
    ("walrus_archive_sent_bytes_total", "counter"),
    ("walrus_archive_stopped", "gauge"),
    ("walrus_archive_uploads_total", "counter"),
    ("walrus_restore_in_progress", "gauge"),
    ("walrus_restore_sent_bytes", "gauge"),
    ("walrus_restore_total_bytes", "gauge"),
    ("walrus_restores_total", "counter"),
    ("walrus_restore_last_duration_seconds", "gauge"),
    ("walrus_restore_estimate_seconds", "gauge"),
    ("walrus_restore_rdb_load_bytes_per_second", "gauge"),
    ("walrus_restore_journal_replay_bytes_per_second", "gauge"),
    ("walrus_upstream_connected", "gauge"),
    ("walrus_upstream_reconnects_total", "counter"),
    ("walrus_upstream_in_flight_full_total", "counter"),
    ("walrus_replica_link_up", "gauge"),
    ("walrus_protocol_errors_total", "counter"),
    ("walrus_pinned_sessions_total", "counter"),
    ("walrus_upstream_errors_total", "counter"),
    // The process collector's, under the standard names (no walrus_ prefix).
    ("process_cpu_seconds_total", "counter"),
    ("process_max_fds", "gauge"),
    ("process_open_fds", "gauge"),
    ("process_resident_memory_bytes", "gauge"),
    ("process_start_time_seconds", "gauge"),
    ("process_threads", "gauge"),
    ("process_virtual_memory_bytes", "gauge"),
];

/// The alert rules: the chart's file is the source, deploy/prometheus/ has a copy for a
/// Prometheus without the Operator.
const RULES: &str = "helm/walrus/files/walrus-alerts.yml";
const RULES_COPY: &str = "deploy/prometheus/walrus-alerts.yml";
const RULE_TESTS: &str = "deploy/prometheus/walrus-alerts.test.yml";
/// The dashboard: the chart's file (its ConfigMap's), with a copy in deploy/grafana/.
const DASHBOARD: &str = "helm/walrus/files/walrus-dashboard.json";
const DASHBOARD_COPY: &str = "deploy/grafana/walrus-dashboard.json";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Runs `program args` in the crate's root; a missing program fails with `missing`.
fn run(program: &str, args: &[&str], missing: &str) -> Output {
    match Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("{program} not found: {missing}")
        }
        Err(e) => panic!("running {program}: {e}"),
    }
}

fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn promtool(args: &[&str]) {
    let out = run(
        "promtool",
        args,
        "run deploy/setup.sh first (it installs Debian's prometheus package, which ships promtool)",
    );
    assert_success(&format!("promtool {}", args.join(" ")), &out);
}

fn python3(args: &[&str]) -> Output {
    run(
        "python3",
        args,
        "run deploy/setup.sh first (it needs python3 too)",
    )
}

/// Where every runbook_url in the rules points (the chart's runbookBaseUrl default).
const RUNBOOK_BASE: &str = "https://github.com/walrus-db/walrus/blob/main/docs/operations.md";
/// The runbooks: the "Alerts" section of docs/operations.md.
const RUNBOOK: &str = "docs/operations.md";

#[test]
fn deploy_copies_are_the_charts_files() {
    for (source, copy) in [(RULES, RULES_COPY), (DASHBOARD, DASHBOARD_COPY)] {
        assert!(
            read(source) == read(copy),
            "{copy} must be a copy of {source} (edit the chart's file, then `cp {source} {copy}`)"
        );
    }
}

#[test]
fn alert_rules_pass_promtool_check() {
    promtool(&["check", "rules", RULES]);
}

#[test]
fn alert_rules_pass_their_promtool_unit_tests() {
    promtool(&["test", "rules", RULE_TESTS]);
}

/// The alerts in the rules file, each with the text of its rule.
fn alerts() -> Vec<(String, String)> {
    let text = read(RULES);
    let mut alerts: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.trim_start().strip_prefix("- alert:") {
            alerts.push((name.trim().to_string(), String::new()));
        } else if let Some((_, body)) = alerts.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    assert!(alerts.len() >= 14, "{RULES}: found only {alerts:?}");
    alerts
}

#[test]
fn every_alert_has_a_severity_and_says_what_it_means() {
    for (name, body) in alerts() {
        let severities: Vec<&str> = body
            .lines()
            .filter_map(|l| l.trim().strip_prefix("severity:"))
            .map(str::trim)
            .collect();
        assert!(
            severities == ["page"] || severities == ["ticket"],
            "{name}: severity must be page or ticket, found {severities:?}"
        );
        for annotation in ["summary:", "description:"] {
            assert!(
                body.lines().any(|l| l.trim().starts_with(annotation)),
                "{name}: no {annotation} annotation"
            );
        }
    }
}

/// Each alert links its runbook section: docs/operations.md#<alert in lower case>, the
/// GitHub anchor of the `### <alert>` heading in the runbook's "Alerts" section.
#[test]
fn every_alert_has_a_runbook_section() {
    let text = read(RUNBOOK);
    let runbook = text
        .split_once("\n## Alerts\n")
        .map(|(_, alerts)| alerts.split("\n## ").next().unwrap())
        .unwrap_or_else(|| panic!("{RUNBOOK} has no \"## Alerts\" section"));
    let headings: Vec<&str> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .collect();
    let alerts = alerts();
    for (name, body) in &alerts {
        let urls: Vec<&str> = body
            .lines()
            .filter_map(|l| l.trim().strip_prefix("runbook_url:"))
            .map(str::trim)
            .collect();
        assert_eq!(
            urls,
            [format!("{RUNBOOK_BASE}#{}", name.to_lowercase())],
            "{name}: runbook_url"
        );
        assert!(
            headings.contains(&name.as_str()),
            "{RUNBOOK} has no \"### {name}\" section"
        );
    }
    for h in headings {
        assert!(
            alerts.iter().any(|(a, _)| a == h),
            "{RUNBOOK} describes {h}, which {RULES} does not define"
        );
    }
}

/// The runbook's re-base of the plain rule file, run as the page shows it (its output path
/// moved into a temporary directory): every alert then links the new base with its own
/// anchor, and the result is still a rule file promtool accepts.
#[test]
fn the_runbooks_rebase_command_points_every_alert_at_the_new_base() {
    let text = read(RUNBOOK);
    let block = text
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("sed ") && b.contains(RULES_COPY))
        .unwrap_or_else(|| panic!("{RUNBOOK} shows no sed command re-basing {RULES_COPY}"));
    let new_base = block
        .split('|')
        .nth(2)
        .unwrap_or_else(|| panic!("no s|old|new| in {block}"));
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("walrus-alerts.yml");
    let script = block.replace(
        "/etc/prometheus/walrus-alerts.yml",
        out_file.to_str().unwrap(),
    );
    assert!(
        script != block,
        "the command no longer writes /etc/prometheus/walrus-alerts.yml"
    );
    let out = run("sh", &["-ec", &script], "sh is part of every Debian");
    assert_success("the runbook's re-base", &out);
    let rebased = std::fs::read_to_string(&out_file).unwrap();
    let urls: Vec<&str> = rebased
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url:"))
        .map(str::trim)
        .collect();
    let names: Vec<String> = alerts().into_iter().map(|(n, _)| n).collect();
    assert_eq!(urls.len(), names.len(), "one runbook_url per alert");
    for (url, name) in urls.iter().zip(&names) {
        assert_eq!(*url, format!("{new_base}#{}", name.to_lowercase()));
    }
    promtool(&["check", "rules", out_file.to_str().unwrap()]);
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_test_case() {
    let tests = read(RULE_TESTS);
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    // (alert, fires): `exp_alerts:` followed by a list fires; `exp_alerts: []` (or none) is quiet.
    let mut cases: Vec<(&str, bool)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("alertname:") {
            let fires = lines.get(i + 1) == Some(&"exp_alerts:");
            cases.push((name.trim(), fires));
        }
    }
    for (name, _) in alerts() {
        for fires in [true, false] {
            assert!(
                cases.contains(&(name.as_str(), fires)),
                "{RULE_TESTS}: {name} has no case where it {}",
                if fires { "fires" } else { "stays quiet" }
            );
        }
    }
    for (name, _) in &cases {
        assert!(
            alerts().iter().any(|(a, _)| a == name),
            "{RULE_TESTS} tests {name}, which {RULES} does not define"
        );
    }
}

#[test]
fn dashboard_is_valid_json() {
    let out = python3(&[
        "-c",
        "import json,sys; json.load(open(sys.argv[1]))",
        DASHBOARD,
    ]);
    assert_success(&format!("parsing {DASHBOARD} as JSON"), &out);
}

/// Checks the dashboard's structure and writes each query, with Grafana's variables
/// replaced, as a recording rule into the file argv[2], for promtool to parse.
const DASHBOARD_CHECK: &str = r#"
import json, re, sys
d = json.load(open(sys.argv[1]))
errors = []
if d.get("schemaVersion") != 39:
    errors.append("schemaVersion is %r, not 39" % d.get("schemaVersion"))
variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
ds = variables.get("DS_PROMETHEUS")
if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
    errors.append("no datasource variable DS_PROMETHEUS of type prometheus")
# namespace and pod for Kubernetes, instance for any scrape; each query filters on all three.
# Their "All" is ".*", which also matches a series without the label (a static scrape has no
# namespace or pod).
FILTERS = ["namespace", "pod", "instance"]
for name in FILTERS:
    v = variables.get(name)
    if not v or "label_values(walrus_build_info" not in json.dumps(v.get("query")) or (", %s)" % name) not in json.dumps(v.get("query")):
        errors.append("no %s variable from label_values(walrus_build_info..., %s)" % (name, name))
    elif v.get("allValue") != ".*":
        errors.append("variable %s: allValue must be .* (series without the label match it)" % name)
ids, exprs = [], []
def walk(panels):
    for p in panels:
        ids.append(p.get("id"))
        title = p.get("title")
        if p.get("type") != "row":
            if p.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                errors.append("panel %r: datasource is not ${DS_PROMETHEUS}" % title)
            if not p.get("targets"):
                errors.append("panel %r: no query" % title)
            for t in p.get("targets", []):
                if t.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                    errors.append("panel %r: a query's datasource is not ${DS_PROMETHEUS}" % title)
                e = t.get("expr", "")
                for name in FILTERS:
                    if ('%s=~"$%s"' % (name, name)) not in e:
                        errors.append("panel %r: query ignores $%s: %s" % (title, name, e))
                if 'job=' in e:
                    errors.append("panel %r: a job name differs per scrape setup: %s" % (title, e))
                # The timestamp is 0 until the first checkpoint: an age from it is ~56 years.
                if re.search(r"time\(\)\s*-\s*walrus_checkpoint_last_success_timestamp_seconds", e):
                    errors.append("panel %r: age of a 0 timestamp: filter it with > 0: %s" % (title, e))
                exprs.append(e)
        walk(p.get("panels", []))
walk(d.get("panels", []))
if len(ids) != len(set(ids)):
    errors.append("panel ids are not unique: %r" % ids)
with open(sys.argv[2], "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        e = e.replace("$__rate_interval", "5m")
        for name in FILTERS:
            e = e.replace("$" + name, ".*")
        f.write("      - record: dashboard:query_%d\n        expr: %s\n" % (i, json.dumps(e)))
if errors:
    sys.exit("\n".join(errors))
print(len(exprs))
"#;

#[test]
fn dashboard_has_its_variables_and_its_queries_parse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("dashboard-queries.yml");
    let rules = rules.to_str().expect("utf-8 path");
    let out = python3(&["-c", DASHBOARD_CHECK, DASHBOARD, rules]);
    assert_success(&format!("checking {DASHBOARD}"), &out);
    let queries: usize = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("query count");
    assert!(queries >= 30, "{DASHBOARD}: only {queries} queries");
    promtool(&["check", "rules", rules]);
}

/// Every `walrus_...` name in `text`, each with the line it is on.
fn metric_names(text: &str) -> Vec<(String, usize)> {
    let mut names = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let mut from = 0;
        while let Some(at) = line[from..].find("walrus_").map(|i| i + from) {
            let standalone =
                at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            let end = line[at..]
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .map_or(line.len(), |i| i + at);
            // `walrus_[a-z0-9_]+`: the prefix alone ("the walrus_ metrics") names nothing.
            if standalone && end > at + "walrus_".len() {
                names.push((line[at..end].to_string(), n + 1));
            }
            from = end;
        }
    }
    names
}

/// Whether `name` is a series of a listed family (a histogram's `_bucket`, `_sum`, `_count`).
fn known(name: &str) -> bool {
    METRICS.iter().any(|&(family, kind)| {
        name == family
            || (kind == "histogram"
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(family)))
    })
}

#[test]
fn alerts_and_dashboard_use_only_exported_metrics() {
    let mut unknown = Vec::new();
    for file in [RULES, RULE_TESTS, DASHBOARD] {
        let names = metric_names(&read(file));
        assert!(names.len() >= 10, "{file}: found only {names:?}");
        for (name, line) in names {
            if !known(&name) {
                unknown.push(format!("{file}:{line}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "names that walrus does not export (the list in tests/it/operations.rs mirrors src/metrics/):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_metric_name_scan_finds_names_and_rejects_strangers() {
    let names = metric_names(
        "rate(walrus_commands_total{x=\"y\"}[5m]) / walrus_nope_total + xwalrus_hidden walrus_a1 walrus_ names",
    );
    let names: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["walrus_commands_total", "walrus_nope_total", "walrus_a1"]
    );
    assert!(known("walrus_journal_fsync_duration_seconds_bucket"));
    assert!(known("walrus_durable_lag_bytes"));
    assert!(!known("walrus_durable_lag_bytes_bucket"));
    assert!(!known("walrus_nope_total"));
    let mut families: Vec<&str> = METRICS.iter().map(|&(f, _)| f).collect();
    families.sort_unstable();
    families.dedup();
    assert_eq!(families.len(), METRICS.len(), "a family is listed twice");
}

/// The list above is what a running walrus exports: every family, with its type, and no
/// other (with TLS for clients and an archive on, whose families exist only then).
#[test]
fn the_metric_list_is_what_walrus_exports() {
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let tls = common::tls::TlsFiles::new();
    let bucket = tempfile::tempdir().unwrap();
    let archive = format!("[archive]\nurl = \"file://{}\"\n", bucket.path().display());
    let w = common::Walrus::build()
        .config(&format!("{}{archive}", tls.toml("")))
        .args(&["--metrics-listen", &metrics])
        .start();
    // Command counters exist once a command was answered.
    assert_eq!(common::Raw::connect(&w.addr).cmd(&["PING"]), b"+PONG\r\n");
    let (_, body) = common::http_get(&metrics, "/metrics");
    let mut exported: Vec<(String, String)> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, kind) = l.split_once(' ').unwrap();
            (name.to_string(), kind.to_string())
        })
        .collect();
    exported.sort();
    let mut listed: Vec<(String, String)> = METRICS
        .iter()
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .collect();
    listed.sort();
    assert_eq!(exported, listed);
}
