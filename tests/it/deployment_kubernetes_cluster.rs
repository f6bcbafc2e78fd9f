//! The chart's Valkey Cluster (helm/walrus/ci/cluster-values.yaml; docs/cluster.md, "Valkey Cluster").
//!
//! Rendered, validated against the Kubernetes API schemas, and checked for what ties it
//! together: one pod per primary, walrus managing Valkey in cluster mode and announcing the
//! pod's IP, peers named by the headless Service that publishes them from their start, a
//! NetworkPolicy that opens the bus to the other shards only, and the Job that forms the
//! cluster. Then the pods run here as Kubernetes would run them: three walruses with the
//! rendered walrus.toml and arguments (pod IPs 127.0.0.x), and the Job's own script, with
//! `getent` answering for the cluster DNS and redis-cli standing in for the image's
//! valkey-cli.

use crate::common;
use crate::kubernetes;

use common::{free_port, http_get, show, valkey_server_bin, walrus_bin, Proc, Raw};
use kubernetes::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use walrus::config::{Config, UpstreamMode};

const VALUES: &str = "ci/cluster-values.yaml";
/// 1 once the Valkey behind a walrus says cluster_state:ok.
const CLUSTER_OK: &str = "walrus_cluster_state_ok";

/// What the local run needs from the rendering.
struct Rendered {
    walrus_toml: String,
    walrus_args: Vec<String>,
    job_script: String,
    resp_port: u16,
    shards: usize,
    /// Pod i's DNS name, `{i}` in place of i.
    pod_host: String,
}

fn check(docs: &[J]) -> Rendered {
    let of_kind = |k: &'static str| docs.iter().filter(move |d| d["kind"].s() == k);
    let sets: Vec<&J> = of_kind("StatefulSet").collect();
    assert_eq!(sets.len(), 1, "one StatefulSet");
    let (sts, spec) = (sets[0]["metadata"]["name"].s(), &sets[0]["spec"]);
    let shards = spec["replicas"].num().unwrap() as usize;
    assert_eq!(shards, 3, "cluster.shards pods");
    assert_eq!(
        spec["podManagementPolicy"].s(),
        "Parallel",
        "after a restart of every pod each node needs its peers: they must start together"
    );
    let ps = &spec["template"]["spec"];
    assert!(
        ps["initContainers"].arr().is_empty(),
        "no Valkey sidecar: walrus must restart its node from an RDB to restore it in place"
    );
    let walrus = ps["containers"]
        .named("walrus")
        .expect("a walrus container");
    let args = walrus["args"].strings();
    let at = |flag: &str| {
        let i = args.iter().position(|a| a == flag);
        i.and_then(|i| args.get(i + 1)).map(String::as_str)
    };
    assert_eq!(at("--cluster-announce-ip"), Some("$(POD_IP)"), "{args:?}");
    assert_eq!(at("--upstream"), None, "managed mode: {args:?}");
    let pod_ip = walrus["env"]
        .named("POD_IP")
        .expect("POD_IP in walrus's env");
    assert_eq!(
        pod_ip["valueFrom"]["fieldRef"]["fieldPath"].s(),
        "status.podIP"
    );
    let port = |name: &str| -> u16 {
        walrus["ports"]
            .named(name)
            .and_then(|p| p["containerPort"].num())
            .unwrap_or_else(|| panic!("walrus has no port named {name}")) as u16
    };
    let (resp, bus) = (port("resp"), port("bus"));
    assert_eq!(walrus["readinessProbe"]["httpGet"]["path"].s(), "/readyz");

    // walrus.toml, as walrus reads it with the pod's IP from the flag.
    let cm = of_kind("ConfigMap")
        .find(|d| !d["data"]["walrus.toml"].is_null())
        .expect("the ConfigMap with walrus.toml");
    let walrus_toml = cm["data"]["walrus.toml"].s().to_string();
    let mut config = Config::parse(&walrus_toml).unwrap();
    config.cluster.announce_ip = "10.1.2.3".into();
    config
        .validate()
        .unwrap_or_else(|e| panic!("{e}\n{walrus_toml}"));
    assert_eq!(config.upstream.mode, UpstreamMode::Managed);
    assert!(config.cluster.enabled);
    assert_eq!(
        config.cluster.bus_port, bus,
        "the bus port Valkey gets is the pod's"
    );
    assert_eq!(config.proxy.listen.expect("proxy.listen").port(), resp);
    // Valkey's socket: in a directory walrus creates on an emptyDir walrus mounts (fresh at
    // each start, where the journal's volume could get the kubelet's fsGroup change).
    let socket_dir = &config.upstream.socket_dir;
    let mount = walrus["volumeMounts"]
        .arr()
        .iter()
        .find(|m| socket_dir.starts_with(m["mountPath"].s()) && m["mountPath"].s() != "/")
        .unwrap_or_else(|| panic!("nothing mounted where {} is", socket_dir.display()));
    assert_ne!(
        Path::new(mount["mountPath"].s()),
        socket_dir.as_path(),
        "walrus creates the directory, 0700, inside the volume"
    );
    assert!(
        !ps["volumes"]
            .named(mount["name"].s())
            .expect("the socket's volume")["emptyDir"]
            .is_null(),
        "Valkey's socket belongs on an emptyDir"
    );
    assert!(
        config
            .upstream
            .extra_args
            .windows(2)
            .any(|w| w[0] == "--cluster-node-timeout"),
        "{:?}",
        config.upstream.extra_args
    );

    // Peers: every pod, by the name the governing headless Service gives it from its start.
    let headless = spec["serviceName"].s();
    let svc = of_kind("Service")
        .find(|d| d["metadata"]["name"].s() == headless)
        .expect("the governing Service");
    assert_eq!(svc["spec"]["clusterIP"].s(), "None");
    assert_eq!(
        svc["spec"]["publishNotReadyAddresses"],
        J::Bool(true),
        "a restoring pod's name must resolve for its peers and the Job"
    );
    assert!(svc["spec"]["ports"].named("bus").is_some());
    let pod_host = format!("{sts}-{{i}}.{headless}.storage.svc.cluster.local");
    let want: Vec<String> = (0..shards)
        .map(|i| format!("{}:{resp}@{bus}", pod_host.replace("{i}", &i.to_string())))
        .collect();
    assert_eq!(config.cluster.peers, want);

    // The NetworkPolicy: the bus from the other shards only; no rule opens Valkey's port.
    let np = of_kind("NetworkPolicy")
        .next()
        .expect("cluster-values enables it");
    let rules = np["spec"]["ingress"].arr();
    let bus_rule = rules
        .iter()
        .find(|r| r["ports"].arr().iter().any(|p| p["port"].s() == "bus"))
        .expect("a rule for the bus");
    let from = bus_rule["from"].arr();
    assert_eq!(from.len(), 1);
    assert_eq!(
        &from[0]["podSelector"]["matchLabels"],
        &spec["selector"]["matchLabels"]
    );
    // The resp port from the other shards too: a MIGRATE goes to the target's walrus.
    let resp_rule = rules
        .iter()
        .find(|r| r["ports"].arr().iter().any(|p| p["port"].s() == "resp"))
        .expect("a rule for the client port");
    assert!(
        resp_rule["from"]
            .arr()
            .iter()
            .any(|f| f["podSelector"]["matchLabels"] == spec["selector"]["matchLabels"]),
        "{resp_rule:?}"
    );
    for r in rules {
        for p in r["ports"].arr() {
            assert!(
                ["resp", "metrics", "bus"].contains(&p["port"].s()),
                "only walrus's ports and the bus: {p:?}"
            );
        }
    }

    // The Job: after install, a client of walrus.
    let job = of_kind("Job").next().expect("the cluster-forming Job");
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"].s(),
        "post-install"
    );
    let pod = &job["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"][&format!("{sts}-client")].s(),
        "true"
    );
    assert!(
        !selects(&spec["selector"]["matchLabels"], &pod["metadata"]["labels"]),
        "the StatefulSet's selector must not select the Job's pod"
    );
    let min_ready = spec["minReadySeconds"].num().unwrap_or(0.0);
    let timeout_ms: f64 = config
        .upstream
        .extra_args
        .windows(2)
        .find(|w| w[0] == "--cluster-node-timeout")
        .map(|w| w[1].parse().unwrap())
        .unwrap();
    assert!(
        min_ready >= 2.0 * timeout_ms / 1000.0,
        "a rolling update must wait out twice cluster-node-timeout: {min_ready}"
    );
    let command = pod["spec"]["containers"].arr()[0]["command"].strings();
    assert_eq!(command[..2], ["sh", "-c"]);
    Rendered {
        walrus_toml,
        walrus_args: args,
        job_script: command[2].clone(),
        resp_port: resp,
        shards,
        pod_host,
    }
}

/// One pod: walrus with the rendered configuration, moved to this host: pod i's IP is
/// 127.0.0.<10 + i>. Valkey listens on 127.0.0.1 too, where the three pods' Valkeys would
/// collide: each gets its own Valkey and bus port, which its peers are told.
struct Pod {
    proc: Proc,
    ip: String,
    metrics: String,
}

fn start_pods(r: &Rendered, root: &Path) -> (Vec<Pod>, u16) {
    let port = free_port();
    let buses: Vec<u16> = (0..r.shards).map(|_| free_port()).collect();
    let ip = |i: usize| format!("127.0.0.{}", 10 + i);
    let pods = (0..r.shards)
        .map(|i| {
            let mut t: toml::Table = toml::from_str(&r.walrus_toml).unwrap();
            let set = |t: &mut toml::Table, section: &str, key: &str, v: toml::Value| {
                t[section].as_table_mut().unwrap().insert(key.into(), v);
            };
            let s = |v: String| toml::Value::String(v);
            let listen = format!("{}:{port}", ip(i));
            set(&mut t, "proxy", "listen", s(listen));
            let metrics = format!("127.0.0.1:{}", free_port());
            set(&mut t, "metrics", "listen", s(metrics.clone()));
            let data = root.join(format!("pod-{i}"));
            set(&mut t, "data", "dir", s(data.to_str().unwrap().into()));
            let bin = valkey_server_bin().to_str().unwrap().to_string();
            set(&mut t, "upstream", "valkey_server", s(bin));
            // The pods' sockets, apart as their emptyDirs are.
            let run = root.join(format!("run-{i}"));
            set(
                &mut t,
                "upstream",
                "socket_dir",
                s(run.to_str().unwrap().into()),
            );
            set(
                &mut t,
                "journal",
                "segment_size_bytes",
                toml::Value::Integer(1 << 20),
            );
            set(
                &mut t,
                "journal",
                "max_entry_bytes",
                toml::Value::Integer(8 << 20),
            );
            set(
                &mut t,
                "cluster",
                "bus_port",
                toml::Value::Integer(buses[i].into()),
            );
            let peers = (0..r.shards)
                .map(|j| s(format!("{}:{port}@{}", ip(j), buses[j])))
                .collect();
            set(&mut t, "cluster", "peers", toml::Value::Array(peers));
            set(
                &mut t,
                "cluster",
                "poll_interval_ms",
                toml::Value::Integer(100),
            );
            let file = root.join(format!("walrus-{i}.toml"));
            std::fs::write(&file, toml::to_string(&t).unwrap()).unwrap();
            // The pod's arguments, as the kubelet expands them.
            let args: Vec<String> = r
                .walrus_args
                .iter()
                .map(|a| match a.as_str() {
                    "$(POD_IP)" => ip(i),
                    "/etc/walrus/walrus.toml" => file.to_str().unwrap().into(),
                    "/data" => data.to_str().unwrap().into(),
                    _ => a.clone(),
                })
                .collect();
            let mut cmd = Command::new(walrus_bin());
            cmd.args(&args).env("RUST_LOG", "info");
            let proc = Proc::spawn(cmd, true);
            proc.wait_line("listening", common::START_TIMEOUT);
            Pod {
                proc,
                ip: ip(i),
                metrics,
            }
        })
        .collect();
    (pods, port)
}

/// Runs the Job's script: the cluster DNS is a `getent` that knows the pods' names, and
/// valkey-cli is redis-cli (deploy/setup.sh's redis-tools), which speaks the same
/// `--cluster create`.
fn run_job(r: &Rendered, root: &Path, port: u16) -> (bool, String) {
    let bin = root.join("job-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let hosts: String = (0..r.shards)
        .map(|i| {
            let host = r.pod_host.replace("{i}", &i.to_string());
            format!("  {host}) echo \"127.0.0.{}  STREAM $2\" ;;\n", 10 + i)
        })
        .collect();
    let getent = format!(
        "#!/bin/sh\n[ \"$1\" = ahostsv4 ] || exit 2\ncase \"$2\" in\n{hosts}  *) exit 2 ;;\nesac\n"
    );
    std::fs::write(bin.join("getent"), getent).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("getent"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let redis_cli = which("redis-cli").expect("redis-cli (deploy/setup.sh installs redis-tools)");
    let _ = std::fs::remove_file(bin.join("valkey-cli"));
    std::os::unix::fs::symlink(redis_cli, bin.join("valkey-cli")).unwrap();
    // Every pod listens on the chart's port in its own network namespace; here they share
    // one, on another port.
    let script = r.job_script.replace(
        &format!("port={}\n", r.resp_port),
        &format!("port={port}\n"),
    );
    assert_ne!(script, r.job_script, "the script's port line");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run(Command::new("sh").args(["-c", &script]).env("PATH", path))
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

#[test]
fn the_charts_cluster_renders_valid_and_its_job_forms_it_through_walrus() {
    let dir = tempfile::tempdir().unwrap();
    let values = chart().join(VALUES);
    let docs = render_valid("cluster-values.yaml", Some(&values), dir.path());
    let r = check(&docs);

    let (pods, port) = start_pods(&r, dir.path());
    let (ok, out) = run_job(&r, dir.path(), port);
    assert!(ok && out.contains("All 16384 slots covered"), "{out}");
    for p in &pods {
        let ok = || common::state::sample(&http_get(&p.metrics, "/metrics").1, CLUSTER_OK);
        common::state::await_read(&p.proc, CLUSTER_OK, common::START_TIMEOUT, ok, |v| {
            *v == Some(1.0)
        });
    }
    // Forming a cluster is the Job's: no walrus met a peer meanwhile (each knows its peers'
    // addresses from the start), which would add handshakes beside the Job's own.
    for p in &pods {
        assert!(
            !p.proc.log_text().contains("cluster.peers:"),
            "{}",
            p.proc.log_text()
        );
    }
    // Run again (the hook reruns, or the release is reinstalled over kept volumes): it sees
    // the cluster and leaves it as it is.
    let (ok, again) = run_job(&r, dir.path(), port);
    assert!(ok && again.contains("the cluster exists"), "{again}");

    // A cluster client through the walruses; every address it is given is a walrus's.
    let walruses: BTreeSet<String> = pods.iter().map(|p| format!("{}:{port}", p.ip)).collect();
    let nodes: Vec<String> = walruses.iter().map(|a| format!("redis://{a}")).collect();
    let mut c = redis::cluster::ClusterClient::new(nodes)
        .unwrap()
        .get_connection()
        .unwrap();
    for i in 0..100 {
        redis::cmd("SET")
            .arg(format!("k{i}"))
            .arg(i)
            .exec(&mut c)
            .unwrap();
    }
    for i in 0..100 {
        let v: i64 = redis::cmd("GET")
            .arg(format!("k{i}"))
            .query(&mut c)
            .unwrap();
        assert_eq!(v, i);
    }
    for p in &pods {
        let nodes = Raw::connect(&format!("{}:{port}", p.ip)).cmd(&["CLUSTER", "NODES"]);
        let seen: BTreeSet<String> = String::from_utf8_lossy(&nodes)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .map(|a| a.split('@').next().unwrap().to_string())
            .collect();
        assert_eq!(seen, walruses, "{}", show(&nodes));
        assert_eq!(http_get(&p.metrics, "/readyz").0, 200);
    }
    for mut p in pods {
        p.proc.signal(libc::SIGTERM);
        let status = p.proc.wait_exit(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "walrus exits 0 on SIGTERM:\n{}",
            p.proc.log_text()
        );
    }
}
