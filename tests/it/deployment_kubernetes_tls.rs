//! The Helm chart's TLS for clients (issue 25): a certificate Secret as cert-manager writes
//! it, mounted read-only as a whole and named by walrus.toml's `[tls]`, the `tls` port in
//! the container, the Services and the NetworkPolicy, TLS only when asked; and the values
//! that cannot work refused. The rendered walrus.toml passes `walrus config check` with real
//! certificate files where the Secret would be.

use crate::common;
use crate::kubernetes;

use common::certs::{write, Ca, Leaf};
use common::{output_text, run_walrus};
use kubernetes::*;
use std::path::Path;
use walrus::config::{AuthClients, CertUser, Config};

/// Renders (lint, template, kubernetes-validate) with these values, YAML.
fn render(name: &str, values: &str, dir: &Path) -> Vec<J> {
    let file = write(dir, &format!("{name}.yaml"), values);
    render_valid(name, Some(&file), dir)
}

fn doc<'a>(docs: &'a [J], kind: &str, name: &str) -> &'a J {
    docs.iter()
        .find(|d| d["kind"].s() == kind && d["metadata"]["name"].s() == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn walrus_toml(docs: &[J]) -> String {
    doc(docs, "ConfigMap", "demo-walrus-config")["data"]["walrus.toml"]
        .s()
        .to_string()
}

fn port_names(ports: &J) -> Vec<String> {
    ports
        .arr()
        .iter()
        .map(|p| p["name"].s().to_string())
        .collect()
}

#[test]
fn chart_serves_tls_from_a_certificate_secret() {
    let dir = tempfile::tempdir().unwrap();
    let docs = render(
        "tls",
        "tls:\n  enabled: true\n  existingSecret: walrus-tls\n  authClientsUser: CN\nnetworkPolicy:\n  enabled: true\n  allowExternal: false\n",
        dir.path(),
    );
    let text = walrus_toml(&docs);
    let config = Config::parse(&text).unwrap();
    config.validate().unwrap();
    let t = &config.tls;
    assert_eq!(t.listen, "0.0.0.0:6390");
    assert_eq!(t.auth_clients, AuthClients::Yes);
    assert_eq!(t.auth_clients_user, CertUser::CN);
    assert_eq!(t.reload_interval_ms, 60_000);
    assert_eq!(config.proxy.listen, Some("0.0.0.0:6379".parse().unwrap()));

    let pod = &doc(&docs, "StatefulSet", "demo-walrus")["spec"]["template"]["spec"];
    let walrus = pod["containers"].named("walrus").unwrap();
    let tls_port = walrus["ports"].named("tls").expect("a container port tls");
    assert_eq!(tls_port["containerPort"].num(), Some(6390.0));
    assert!(walrus["ports"].named("resp").is_some());

    // The Secret, read-only, as a whole (a subPath mount would never see a renewal), with
    // walrus.toml's files in it.
    let mount = walrus["volumeMounts"]
        .named("tls")
        .expect("the Secret's mount");
    assert_eq!(mount["readOnly"], J::Bool(true));
    assert!(
        mount["subPath"].is_null(),
        "a subPath mount is never updated"
    );
    let at = Path::new(mount["mountPath"].s());
    let secret = &pod["volumes"].named("tls").unwrap()["secret"];
    assert_eq!(secret["secretName"].s(), "walrus-tls");
    let items: Vec<String> = secret["items"]
        .arr()
        .iter()
        .map(|i| i["path"].s().to_string())
        .collect();
    for (file, name) in [
        (&t.cert_file, "tls.crt"),
        (&t.key_file, "tls.key"),
        (&t.ca_cert_file, "ca.crt"),
    ] {
        assert_eq!(Path::new(file), at.join(name), "{name}");
        assert!(items.iter().any(|i| i == name), "{name} is not mounted");
    }

    // The TLS port in both Services and the NetworkPolicy, beside the plaintext one.
    let client = doc(&docs, "Service", "demo-walrus");
    let tls = client["spec"]["ports"]
        .named("tls")
        .expect("a Service port tls");
    assert_eq!(
        (tls["port"].num(), tls["targetPort"].s()),
        (Some(6390.0), "tls")
    );
    assert_eq!(port_names(&client["spec"]["ports"]), ["resp", "tls"]);
    let headless = doc(&docs, "Service", "demo-walrus-headless");
    assert_eq!(
        port_names(&headless["spec"]["ports"]),
        ["resp", "tls", "metrics"]
    );
    let np = &doc(&docs, "NetworkPolicy", "demo-walrus")["spec"]["ingress"].arr()[0];
    let opened: Vec<String> = np["ports"]
        .arr()
        .iter()
        .map(|p| p["port"].s().to_string())
        .collect();
    assert_eq!(opened, ["resp", "tls"]);
    assert!(
        !np["from"].arr().is_empty(),
        "TLS clients come from the same peers"
    );

    // walrus accepts the rendered configuration with real files where the Secret would be.
    let ca = Ca::new("chart CA");
    let server = ca.sign(&Leaf::server(1));
    let files = tempfile::tempdir().unwrap();
    write(files.path(), "tls.crt", &server.cert);
    write(files.path(), "tls.key", &server.key);
    write(files.path(), "ca.crt", &ca.pem);
    let local = text.replace(at.to_str().unwrap(), files.path().to_str().unwrap());
    let path = write(files.path(), "walrus.toml", &local);
    let out = run_walrus(&["config", "check", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", output_text(&out));
}

#[test]
fn chart_serves_tls_clients_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let docs = render(
        "tls-only",
        "tls:\n  enabled: true\n  existingSecret: walrus-tls\n  authClients: \"no\"\n  disablePlaintext: true\nnetworkPolicy:\n  enabled: true\n",
        dir.path(),
    );
    let config = Config::parse(&walrus_toml(&docs)).unwrap();
    config.validate().unwrap();
    assert_eq!(config.proxy.listen, None);
    assert_eq!(config.tls.auth_clients, AuthClients::No);
    assert!(
        config.tls.ca_cert_file.is_empty(),
        "no CA without client certificates"
    );
    let pod = &doc(&docs, "StatefulSet", "demo-walrus")["spec"]["template"]["spec"];
    let walrus = pod["containers"].named("walrus").unwrap();
    assert_eq!(port_names(&walrus["ports"]), ["tls", "metrics"]);
    let items = &pod["volumes"].named("tls").unwrap()["secret"]["items"];
    assert!(items.arr().iter().all(|i| i["key"].s() != "ca.crt"));
    assert_eq!(
        port_names(&doc(&docs, "Service", "demo-walrus")["spec"]["ports"]),
        ["tls"]
    );
    let np = &doc(&docs, "NetworkPolicy", "demo-walrus")["spec"]["ingress"].arr()[0];
    assert_eq!(np["ports"].arr().len(), 1);
    assert_eq!(np["ports"].arr()[0]["port"].s(), "tls");
}

#[test]
fn chart_refuses_tls_values_that_cannot_work() {
    for (args, named) in [
        (
            &["--set", "tls.enabled=true"][..],
            "tls.enabled needs tls.existingSecret",
        ),
        (
            &["--set", "tls.disablePlaintext=true"],
            "tls.disablePlaintext needs tls.enabled",
        ),
        (
            &[
                "--set",
                "tls.enabled=true",
                "--set",
                "tls.existingSecret=s",
                "--set",
                "tls.port=6379",
            ],
            "tls.port (6379) must differ",
        ),
        (
            &[
                "--set",
                "tls.enabled=true",
                "--set",
                "tls.existingSecret=s",
                "--set",
                "tls.authClientsUser=SAN",
            ],
            "authClientsUser",
        ),
        (
            &[
                "--set",
                "tls.enabled=true",
                "--set",
                "tls.existingSecret=s",
                "--set",
                "cluster.enabled=true",
                "--set",
                "networkPolicy.enabled=true",
            ],
            "TLS for a cluster is not supported yet",
        ),
    ] {
        let (ok, out) = template(args);
        assert!(!ok, "helm template {args:?} must fail:\n{out}");
        assert!(
            out.contains(named),
            "helm template {args:?} must name {named}:\n{out}"
        );
    }
}
