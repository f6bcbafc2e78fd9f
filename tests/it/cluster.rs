//! Valkey Cluster through walrus (docs/cluster.md, "Valkey Cluster"): three primaries on loopback,
//! each a managed Valkey in cluster mode behind its own walrus. The cluster is created the
//! way a user creates one (`redis-cli --cluster create` with the walruses' addresses), a
//! cluster-aware client (the `redis` crate's) reaches it through walrus, every address a
//! client is given is a walrus's, and a shard whose Valkey or walrus is killed comes back in
//! place: the same node, its slots, and every acknowledged write.

use crate::common;
use common::*;
use redis::cluster::ClusterClient;
use redis::Commands;
use std::collections::BTreeSet;
use std::process::Command;

/// Cluster mode; the metrics of the node's state read from Valkey every 100 ms, for the test
/// that waits for them.
const CLUSTER: &str = "[cluster]\nenabled = true\npoll_interval_ms = 100\n";
/// 1 once the Valkey behind a walrus says cluster_state:ok (its watch polls every 100 ms).
const CLUSTER_OK: &str = "walrus_cluster_state_ok";

/// One shard: its walrus (managed Valkey in cluster mode) and the client port, kept across
/// restarts since the cluster knows the shard by it.
struct Shard {
    walrus: Walrus,
    ip: String,
    port: u16,
    metrics: String,
}

impl Shard {
    fn start(port: u16, metrics: &str, data: Option<&std::path::Path>) -> Walrus {
        Shard::start_at(&format!("127.0.0.1:{port}"), CLUSTER, metrics, data)
    }

    fn start_at(
        listen: &str,
        config: &str,
        metrics: &str,
        data: Option<&std::path::Path>,
    ) -> Walrus {
        let mut b = Walrus::build()
            .config(config)
            .listen(listen)
            .args(&["--metrics-listen", metrics]);
        if let Some(d) = data {
            b = b.data(d);
        }
        b.start()
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    fn cmd(&self, args: &[&str]) -> Vec<u8> {
        Raw::connect(&self.addr()).cmd(args)
    }

    fn id(&self) -> String {
        let r = self.cmd(&["CLUSTER", "MYID"]);
        String::from_utf8_lossy(&r)
            .lines()
            .nth(1)
            .unwrap()
            .to_string()
    }

    /// Returns this walrus's metrics once `pred` holds for them (they are refreshed every
    /// `poll_interval_ms`), within a bound.
    fn metrics_when(&self, pred: impl Fn(&str) -> bool) -> String {
        for _ in 0..100 {
            let (_, text) = http_get(&self.metrics, "/metrics");
            if pred(&text) {
                return text;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        http_get(&self.metrics, "/metrics").1
    }

    /// How many `cmd` commands this walrus forwarded, from its metrics.
    fn forwarded(&self, cmd: &str) -> u64 {
        let (_, text) = http_get(&self.metrics, "/metrics");
        let prefix = format!("walrus_commands_total{{cmd=\"{cmd}\",result=\"ok\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0, |n| n.trim().parse().unwrap())
    }
}

/// Three shards, made one cluster by `redis-cli --cluster create` given only walrus
/// addresses; returns once every node says the cluster is ok.
fn cluster() -> Vec<Shard> {
    let shards: Vec<Shard> = (0..3)
        .map(|_| {
            let port = free_port();
            let metrics = format!("127.0.0.1:{}", free_port());
            Shard {
                walrus: Shard::start(port, &metrics, None),
                ip: "127.0.0.1".into(),
                port,
                metrics,
            }
        })
        .collect();
    create(&shards);
    shards
}

/// `redis-cli --cluster create` of the shards' walruses; returns once every node says the
/// cluster is ok.
fn create(shards: &[Shard]) {
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(shards.iter().map(Shard::addr))
        .args(["--cluster-yes"])
        .output()
        .expect("redis-cli (deploy/setup.sh installs redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("All 16384 slots covered"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for s in shards {
        s.walrus.await_metric(CLUSTER_OK, |ok| ok == 1.0);
    }
}

fn client(shards: &[Shard]) -> redis::cluster::ClusterConnection {
    let nodes: Vec<String> = shards
        .iter()
        .map(|s| format!("redis://{}", s.addr()))
        .collect();
    ClusterClient::new(nodes).unwrap().get_connection().unwrap()
}

/// Every port number in a reply (integers, and `ip:port` / `port@busport` in text).
fn ports_in(reply: &[u8]) -> BTreeSet<u16> {
    let text = String::from_utf8_lossy(reply);
    let mut ports = BTreeSet::new();
    for line in text.split("\r\n") {
        // `:12345` integers and `ip:port@bus` in CLUSTER NODES.
        if let Some(n) = line.strip_prefix(':').and_then(|n| n.parse().ok()) {
            ports.insert(n);
        }
        for word in line.split_whitespace() {
            if let Some((_, rest)) = word.rsplit_once(':') {
                if let Some(p) = rest.split('@').next().and_then(|p| p.parse().ok()) {
                    ports.insert(p);
                }
            }
        }
    }
    ports
}

#[test]
fn cluster_clients_are_given_only_walrus_addresses() {
    let shards = cluster();
    let walruses: BTreeSet<u16> = shards.iter().map(|s| s.port).collect();
    for s in &shards {
        // CLUSTER SLOTS: [start, end, [ip, port, id, {}], ...]; the integers are slots and
        // ports: every port must be a walrus's.
        let slots = s.cmd(&["CLUSTER", "SLOTS"]);
        let ports: BTreeSet<u16> = ports_in(&slots)
            .into_iter()
            .filter(|p| *p > 16383)
            .collect();
        assert_eq!(ports, walruses, "{}", show(&slots));
        // CLUSTER SHARDS: each node's map has `port` (and `tls-port` with TLS): walruses.
        let shards_reply = s.cmd(&["CLUSTER", "SHARDS"]);
        let text = String::from_utf8_lossy(&shards_reply).to_string();
        let lines: Vec<&str> = text.split("\r\n").collect();
        let ports: BTreeSet<u16> = lines
            .windows(2)
            .filter(|w| w[0] == "port" || w[0] == "tls-port")
            .map(|w| w[1].trim_start_matches(':').parse().unwrap())
            .collect();
        assert_eq!(ports, walruses, "{text}");
        // CLUSTER NODES names each node `ip:port@bus`: the port is a walrus's.
        let nodes = String::from_utf8_lossy(&s.cmd(&["CLUSTER", "NODES"])).to_string();
        let named: BTreeSet<u16> = nodes
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter_map(|a| a.split('@').next()?.rsplit_once(':')?.1.parse().ok())
            .collect();
        assert_eq!(named, walruses, "{nodes}");
    }
    // A key of another shard: MOVED names that shard's walrus.
    let mut moved = 0;
    for i in 0..20 {
        let r = shards[0].cmd(&["SET", &format!("key{i}"), "v"]);
        if r.starts_with(b"-MOVED") {
            let text = String::from_utf8_lossy(&r).to_string();
            let port: u16 = text.trim().rsplit(':').next().unwrap().parse().unwrap();
            assert!(walruses.contains(&port) && port != shards[0].port, "{text}");
            moved += 1;
        } else {
            assert_eq!(r, b"+OK\r\n", "{}", show(&r));
        }
    }
    assert!(moved > 0, "no key of another shard among 20");
    // A cluster-aware client learns the topology from walrus and writes everywhere.
    let mut c = client(&shards);
    for i in 0..300 {
        let _: () = c.set(format!("k{i}"), i).unwrap();
    }
    for i in 0..300 {
        assert_eq!(c.get::<_, i64>(format!("k{i}")).unwrap(), i);
    }
    let sizes: Vec<i64> = shards
        .iter()
        .map(|s| {
            let r = s.cmd(&["DBSIZE"]);
            String::from_utf8_lossy(&r[1..r.len() - 2]).parse().unwrap()
        })
        .collect();
    assert!(sizes.iter().all(|n| *n > 50), "{sizes:?}");
    // Each walrus's metrics name its node and shard, its slots and the cluster's state.
    let mut total = 0;
    for s in &shards {
        let shard_id = String::from_utf8_lossy(&s.cmd(&["CLUSTER", "MYSHARDID"]))
            .lines()
            .nth(1)
            .unwrap()
            .to_string();
        let info = format!(
            "walrus_cluster_node_info{{node_id=\"{}\",shard_id=\"{shard_id}\"}} 1",
            s.id()
        );
        let text = s.metrics_when(|t| t.contains(&info) && t.contains("walrus_cluster_state_ok 1"));
        assert!(
            text.contains(&info) && text.contains("walrus_cluster_state_ok 1"),
            "{info}\n{text}"
        );
        let slots: i64 = text
            .lines()
            .find_map(|l| l.strip_prefix("walrus_cluster_slots "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((5461..=5462).contains(&slots), "{slots}");
        total += slots;
    }
    assert_eq!(total, 16384);
    // Cross-slot and redirect answers are Valkey's own.
    let r = shards[0].cmd(&["MSET", "a", "1", "b", "2"]);
    assert!(r.starts_with(b"-CROSSSLOT"), "{}", show(&r));
}

/// Asks `shard` for CLUSTER SLOTS over and over until told to stop; returns every reply
/// that differs from `slots`. A node restarted in place must never be shown with another
/// address (its peers once fell back to Valkey's own port for a moment after its restart).
fn watch_topology(
    shard: &Shard,
    slots: Vec<u8>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<String>> {
    let addr = shard.addr();
    std::thread::spawn(move || {
        let mut c = Raw::connect(&addr);
        let mut seen = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let r = c.cmd(&["CLUSTER", "SLOTS"]);
            if r != slots {
                seen.push(show(&r));
            }
        }
        seen
    })
}

#[test]
fn a_shard_is_restored_in_place_after_its_valkey_or_its_walrus_dies() {
    let mut shards = cluster();
    let mut c = client(&shards);
    for i in 0..300 {
        let _: () = c.set(format!("k{i}"), i).unwrap();
    }
    let id = |s: &Shard| s.cmd(&["CLUSTER", "MYID"]);
    let before: Vec<Vec<u8>> = shards.iter().map(id).collect();
    let slots = shards[0].cmd(&["CLUSTER", "SLOTS"]);

    // Shard 0 is asked for the topology all along: it must name walruses only.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = watch_topology(&shards[0], slots.clone(), stop.clone());

    // Valkey dies: walrus restarts it empty, restores a second server, and restarts the
    // node from that server's RDB, as the same node; the link continues with PSYNC.
    shards[1].walrus.kill_valkey_and_await_restore();
    let got = id(&shards[1]);
    assert_eq!(
        got,
        before[1],
        "{}\n{}",
        show(&got),
        shards[1].walrus.proc.log_text()
    );
    let log = shards[1].walrus.proc.log_text();
    assert!(
        log.contains("restarting the cluster node from the restored RDB")
            && !log.contains("Valkey restarted (process"),
        "{log}"
    );
    assert_eq!(id(&shards[1]), before[1]);
    for i in 0..300 {
        assert_eq!(c.get::<_, i64>(format!("k{i}")).unwrap(), i, "k{i}");
    }

    // walrus dies (its Valkey with it) and starts again on the same port and data.
    for i in 300..400 {
        let _: () = c.set(format!("k{i}"), i).unwrap();
    }
    let data = shards[2].walrus.data.path().join("data");
    shards[2].walrus.kill_with_valkey();
    let port = shards[2].port;
    let metrics = shards[2].metrics.clone();
    let old = std::mem::replace(
        &mut shards[2].walrus,
        Shard::start(port, &metrics, Some(&data)),
    );
    let _data = old.data; // the data directory the new walrus runs on
    let w = &shards[2].walrus;
    // It may come before walrus listens, which `start` waited for.
    let line = "Valkey continued with a partial resync";
    if !w.proc.log_text().contains(line) {
        w.proc.wait_line(line, START_TIMEOUT);
    }
    w.await_metric(CLUSTER_OK, |ok| ok == 1.0);
    assert_eq!(id(&shards[2]), before[2]);
    for i in 0..400 {
        assert_eq!(c.get::<_, i64>(format!("k{i}")).unwrap(), i, "k{i}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = watcher.join().unwrap();
    assert!(
        seen.is_empty(),
        "{} other topologies, first: {}",
        seen.len(),
        seen[0]
    );
    for s in &shards {
        let info = String::from_utf8_lossy(&s.cmd(&["CLUSTER", "INFO"])).to_string();
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
}

/// Every pod of a StatefulSet restarted: each node comes back at a new IP, and every
/// address in every nodes.conf is stale. Each walrus knows its peers by a name that follows
/// them (`cluster.peers`; here the new IPs themselves, as a pod's DNS name would resolve)
/// and has its Valkey meet them again: the same nodes, slots and keys, at the new addresses.
/// Without `peers` the cluster stays down.
#[test]
fn a_cluster_whose_every_node_moved_to_a_new_ip_reforms_from_its_peers_names() {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let buses: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // Shard i at 127.0.0.<first + i>, knowing the others there.
    let start = |first: u8| -> Vec<Shard> {
        (0..3)
            .map(|i| {
                let ip = format!("127.0.0.{}", first + i as u8);
                let peers: Vec<String> = (0..3)
                    .filter(|&j| j != i)
                    .map(|j| format!("\"127.0.0.{}:{}@{}\"", first + j as u8, ports[j], buses[j]))
                    .collect();
                // Peers are lost once not heard from for cluster-node-timeout: shortened.
                let config = format!(
                    "{CLUSTER}bus_port = {}\npeers = [{}]\n[upstream]\nextra_args = [\"--cluster-node-timeout\", \"3000\"]\n",
                    buses[i],
                    peers.join(", ")
                );
                let metrics = format!("127.0.0.1:{}", free_port());
                let listen = format!("{ip}:{}", ports[i]);
                Shard {
                    walrus: Shard::start_at(&listen, &config, &metrics, Some(dirs[i].path())),
                    ip,
                    port: ports[i],
                    metrics,
                }
            })
            .collect()
    };
    let mut shards = start(2);
    create(&shards);
    let mut c = client(&shards);
    for i in 0..200 {
        let _: () = c.set(format!("k{i}"), i).unwrap();
    }
    let ids: Vec<Vec<u8>> = shards.iter().map(|s| s.cmd(&["CLUSTER", "MYID"])).collect();
    drop(c);
    for s in &mut shards {
        s.walrus.kill_with_valkey();
    }
    drop(shards);

    // Valkey listens on 127.0.0.1 too: the new addresses share no IP with the old ones.
    let shards = start(5);
    // Every node knows every other at its new address, linked and unflagged. (Each one's
    // state says ok even while it reaches nobody: only a majority can fail a node.)
    let walruses: BTreeSet<String> = shards.iter().map(Shard::addr).collect();
    let peers_seen = |s: &Shard| -> BTreeSet<String> {
        let nodes = String::from_utf8_lossy(&s.cmd(&["CLUSTER", "NODES"])).to_string();
        nodes
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let healthy = f.len() > 7 && f[7] == "connected" && !f[2].contains("fail");
                healthy.then(|| f[1].split('@').next().unwrap().to_string())
            })
            .collect()
    };
    for s in &shards {
        let reformed = (0..600).any(|_| {
            let done = peers_seen(s) == walruses;
            if !done {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            done
        });
        assert!(
            reformed,
            "{}\n{}",
            String::from_utf8_lossy(&s.cmd(&["CLUSTER", "NODES"])),
            s.walrus.proc.log_text()
        );
    }
    // One reintroduction is enough: the others learn the new addresses by gossip.
    let introduced = |s: &Shard| {
        let log = s.walrus.proc.log_text();
        log.contains("cluster.peers: Valkey lost peers; introduced")
    };
    assert!(shards.iter().any(introduced));
    let now: Vec<Vec<u8>> = shards.iter().map(|s| s.cmd(&["CLUSTER", "MYID"])).collect();
    assert_eq!(now, ids, "the same nodes");
    let mut c = client(&shards);
    for i in 0..200 {
        assert_eq!(c.get::<_, i64>(format!("k{i}")).unwrap(), i, "k{i}");
    }
    for s in &shards {
        let info = String::from_utf8_lossy(&s.cmd(&["CLUSTER", "INFO"])).to_string();
        assert!(info.contains("cluster_state:ok"), "{info}");
    }

    // Again, but shard 2 lost its volume: it comes back as a new, empty node. The others
    // meet each other again, not it: it would join as an empty primary beside the lost
    // one (or, were it another cluster's node on a recycled IP, merge the two clusters).
    drop(c);
    let mut shards = shards;
    for s in &mut shards {
        s.walrus.kill_with_valkey();
    }
    drop(shards);
    std::fs::remove_dir_all(dirs[2].path()).unwrap();
    std::fs::create_dir(dirs[2].path()).unwrap();
    let shards = start(8);
    let fresh = String::from_utf8_lossy(&shards[2].cmd(&["CLUSTER", "MYID"]))
        .lines()
        .nth(1)
        .unwrap()
        .to_string();
    assert!(
        !ids[2].ends_with(format!("{fresh}\r\n").as_bytes()),
        "a new node"
    );
    let refused = "not one this node lost: not introduced";
    let w = &shards[0].walrus.proc;
    if !w.log_text().contains(refused) {
        w.wait_line(refused, START_TIMEOUT);
    }
    let nodes = String::from_utf8_lossy(&shards[0].cmd(&["CLUSTER", "NODES"])).to_string();
    assert!(!nodes.contains(&fresh), "{nodes}");
}

#[test]
fn an_external_cluster_node_must_announce_walrus() {
    let v = Valkey::start_with(&["--cluster-enabled", "yes"]);
    let tmp = tempfile::tempdir().unwrap();
    // Without cluster.enabled: clients would be sent to Valkey's own address.
    let line = refuses_to_start(Some(&v.addr()), "", tmp.path(), "runs in cluster mode");
    assert!(line.contains("set cluster.enabled"), "{line}");
    // With it, but Valkey would turn replica once it gave its last slot away.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let config = format!("{CLUSTER}announce_port = {port}\n");
    let line = refuses_to_start(
        Some(&v.addr()),
        &config,
        tmp.path(),
        "cluster-allow-replica-migration yes",
    );
    assert!(
        line.contains("CONFIG SET cluster-allow-replica-migration no"),
        "{line}"
    );
    let mut c = Raw::connect(&v.addr());
    let r = c.cmd(&["CONFIG", "SET", "cluster-allow-replica-migration", "no"]);
    assert_eq!(r, b"+OK\r\n");
    // Valkey announces itself: the error gives the commands.
    let line = refuses_to_start(Some(&v.addr()), &config, tmp.path(), "not this walrus");
    assert!(
        line.contains(&format!(
            "cluster-announce-client-port {port} cluster-announce-ip 127.0.0.1 cluster-announce-port {port}"
        )),
        "{line}"
    );
    // Announcing walrus: it starts.
    let r = c.cmd(&[
        "CONFIG",
        "SET",
        "cluster-announce-client-ipv4",
        "127.0.0.1",
        "cluster-announce-client-port",
        &port.to_string(),
        "cluster-announce-ip",
        "127.0.0.1",
        "cluster-announce-port",
        &port.to_string(),
    ]);
    assert_eq!(r, b"+OK\r\n");
    let metrics = format!("127.0.0.1:{}", free_port());
    let w = Walrus::build()
        .upstream(&v.addr())
        .config(CLUSTER)
        .listen(&listen)
        .args(&["--metrics-listen", &metrics])
        .start();
    let r = Raw::connect(&w.addr).cmd(&["CLUSTER", "MYID"]);
    assert!(r.starts_with(b"$40\r\n"), "{}", show(&r));
    // Changed on Valkey behind walrus's back (or lost by a restart without CONFIG
    // REWRITE): checked at every poll, walrus is not ready until it is put back.
    let readyz = |want: u16, text: &str| {
        for _ in 0..200 {
            let (code, body) = http_get(&metrics, "/readyz");
            if code == want && body.contains(text) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("{:?}\n{}", http_get(&metrics, "/readyz"), w.proc.log_text());
    };
    readyz(200, "");
    let mut set_port = |p: &str| {
        let r = c.cmd(&["CONFIG", "SET", "cluster-announce-client-port", p]);
        assert_eq!(r, b"+OK\r\n");
    };
    set_port("1");
    readyz(503, "not this walrus");
    set_port(&port.to_string());
    readyz(200, "");
    // ... and refuses to let a client point the announcement elsewhere.
    let r = Raw::connect(&w.addr).cmd(&["CONFIG", "SET", "cluster-announce-client-port", "1"]);
    assert!(
        r.starts_with(
            b"-ERR walrus: cluster-announce-* (or cluster-preferred-endpoint-type) is refused"
        ),
        "{}",
        show(&r)
    );
}

#[test]
fn cluster_mode_refuses_a_valkey_that_cannot_announce_walrus() {
    // Valkey 8 has cluster-announce-client-ipv4 but not -port: clients would be told
    // Valkey's own port.
    let (_, bin) = common::server::matrix()
        .into_iter()
        .find(|(v, _)| v.valkey && v.v.0 == 8)
        .expect("deploy/setup.sh installs Valkey 8.1.8");
    let v = Valkey::start_bin(&bin, &["--cluster-enabled", "yes"]);
    let tmp = tempfile::tempdir().unwrap();
    let line = refuses_to_start(
        Some(&v.addr()),
        CLUSTER,
        tmp.path(),
        "cluster mode needs Valkey 9.0",
    );
    assert!(line.contains("cluster-announce-client-port"), "{line}");
}

/// Resharding with MIGRATE (the path `redis-cli --cluster reshard` takes) under a writer,
/// every slot of one shard moved to another: the source's Valkey connects to the address
/// the cluster announces for the target, its walrus, so each `RESTORE-ASKING` is answered
/// only once the target's journal holds it, and only then does the source delete the key
/// (docs/cluster.md, "Resharding"). Killing the target's Valkey right after loses
/// nothing; the source, left without slots, stays a primary that its walrus journals.
#[test]
fn resharding_moves_keys_through_the_target_walrus_and_loses_no_acknowledged_write() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let shards = cluster();
    let mut c = client(&shards);
    for i in 0..500 {
        let _: () = c.set(format!("k{i}"), i).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let nodes: Vec<String> = shards
        .iter()
        .map(|s| format!("redis://{}", s.addr()))
        .collect();
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = ClusterClient::new(nodes).unwrap().get_connection().unwrap();
            let mut acked = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if c.set::<_, _, ()>(format!("w{i}"), i).is_ok() {
                    acked.push(i);
                }
                i += 1;
            }
            acked
        })
    };
    let (from, to) = (&shards[2], &shards[1]);
    let out = Command::new("redis-cli")
        .args(["--cluster", "reshard", &from.addr()])
        .args(["--cluster-from", &from.id(), "--cluster-to", &to.id()])
        .args(["--cluster-slots", "16384", "--cluster-yes"])
        .output()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let acked = writer.join().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!acked.is_empty());
    // The keys reached the target through its walrus's gate, not around it.
    assert!(
        to.forwarded("restore-asking") > 0,
        "no RESTORE-ASKING went through the target's walrus"
    );
    // The source kept no slot and is still the primary its walrus journals.
    let role = from.cmd(&["ROLE"]);
    assert!(role.starts_with(b"*3\r\n$6\r\nmaster"), "{}", show(&role));
    let log = from.walrus.proc.log_text();
    assert_eq!(log.matches("replica link attached").count(), 1, "{log}");
    let owned = |s: &Shard| {
        let nodes = String::from_utf8_lossy(&s.cmd(&["CLUSTER", "NODES"])).to_string();
        let me = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .unwrap()
            .to_string();
        me.split_whitespace().skip(8).collect::<Vec<_>>().join(" ")
    };
    let slots = owned(to);
    // The moves' CLUSTER SETSLOTs are not in the target's journal: Valkey propagates them
    // only to cluster replicas (`myself->num_replicas`), which walrus is not, so a restore
    // in place never replays one into its plain server; the slots come from nodes.conf.
    let journal = to.walrus.data.path().join("data/journal");
    for f in std::fs::read_dir(&journal).unwrap() {
        let bytes = std::fs::read(f.unwrap().path())
            .unwrap()
            .to_ascii_lowercase();
        assert!(!bytes.windows(7).any(|w| w == b"setslot"));
    }
    to.walrus.kill_valkey_and_await_restore();
    assert_eq!(
        owned(to),
        slots,
        "the restored node keeps the slots it took"
    );
    let mut c = client(&shards);
    for i in 0..500 {
        assert_eq!(c.get::<_, i64>(format!("k{i}")).unwrap(), i, "k{i}");
    }
    for i in acked {
        assert_eq!(c.get::<_, u64>(format!("w{i}")).unwrap(), i, "w{i}");
    }
    let moved = String::from_utf8_lossy(&from.cmd(&["DBSIZE"])).to_string();
    assert_eq!(moved, ":0\r\n");
}

#[test]
fn atomic_slot_migration_and_flushslot_are_refused_through_walrus() {
    let shards = cluster();
    let r = shards[0].cmd(&[
        "CLUSTER",
        "MIGRATESLOTS",
        "SLOTSRANGE",
        "0",
        "10",
        "NODE",
        &shards[1].id(),
    ]);
    let text = show(&r);
    assert!(
        r.starts_with(b"-ERR walrus: CLUSTER MIGRATESLOTS is refused") && text.contains("2723"),
        "{text}"
    );
    // Its deletions would reach the journal as a command a restore in place cannot replay.
    let r = shards[0].cmd(&["CLUSTER", "FLUSHSLOT", "0"]);
    assert!(
        r.starts_with(b"-ERR walrus: CLUSTER FLUSHSLOT is refused"),
        "{}",
        show(&r)
    );
}

/// The Python clients users run, redis-py's RedisCluster and valkey-glide, given one
/// walrus: every node they learn is a walrus, and every command they send goes through
/// one (the walruses counted them all).
#[test]
fn python_cluster_clients_reach_every_shard_through_walrus() {
    const KEYS: u64 = 200;
    let shards = cluster();
    let counted = |cmd: &str| shards.iter().map(|s| s.forwarded(cmd)).sum::<u64>();
    let (sets, gets) = (counted("set"), counted("get"));
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/cluster_clients.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(shards[0].addr())
        .arg(KEYS.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{} (deploy/setup.sh installs redis and valkey-glide)",
        String::from_utf8_lossy(&out.stderr)
    );
    let learned: BTreeSet<String> = text
        .lines()
        .find_map(|l| l.strip_prefix("redis-py "))
        .unwrap()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let walruses: BTreeSet<String> = shards.iter().map(Shard::addr).collect();
    assert_eq!(learned, walruses);
    assert!(text.lines().any(|l| l == "glide"), "{text}");
    assert!(
        counted("set") - sets >= 2 * KEYS,
        "some SETs went around walrus"
    );
    assert!(
        counted("get") - gets >= 2 * KEYS,
        "some GETs went around walrus"
    );
}

/// During a slot migration a client sends `ASKING` and then the command for the importing
/// slot: Valkey keeps the flag for that next command only. Sent in one write behind a write
/// (walrus adds a ROLE behind every batch that writes), the ASKING reaches the target's
/// Valkey right before the command it is for, as when the same bytes go to Valkey directly.
/// (walrus's ROLE went between them: the command got `-MOVED` back to the source, whose
/// `-ASK` sent the client back again.)
#[test]
fn asking_after_a_write_reaches_valkey_right_before_its_command() {
    let shards = cluster();
    let (source, target) = (&shards[0], &shards[1]);
    // A key the target serves, and one of a slot the source owns, which the target imports.
    let (mut own, mut importing) = (None, None);
    for i in 0.. {
        let key = format!("key{i}");
        let r = String::from_utf8_lossy(&target.cmd(&["GET", &key])).to_string();
        match r.strip_prefix("-MOVED ") {
            None => own = own.or(Some(key)),
            Some(moved) if moved.trim_end().ends_with(&format!(":{}", source.port)) => {
                let slot = moved.split(' ').next().unwrap().to_string();
                importing = importing.or(Some((key, slot)));
            }
            Some(_) => {}
        }
        if own.is_some() && importing.is_some() {
            break;
        }
    }
    let (own, (key, slot)) = (own.unwrap(), importing.unwrap());
    let r = target.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source.id()]);
    assert_eq!(r, b"+OK\r\n", "{}", show(&r));
    let mut c = Raw::connect(&target.addr());
    // ASKING gives a session its own connection to Valkey (as READWRITE does): this one has
    // it already, as after an earlier redirection.
    assert_eq!(c.cmd(&["READWRITE"]), b"+OK\r\n");
    let mut batch = walrus::resp::write::command(["SET", own.as_str(), "1"]).to_vec();
    batch.extend_from_slice(&walrus::resp::write::command(["ASKING"]));
    c.send_raw(&batch);
    assert_eq!(c.read_frame(), b"+OK\r\n");
    assert_eq!(c.read_frame(), b"+OK\r\n");
    let r = c.cmd(&["SET", &key, "imported"]);
    assert_eq!(r, b"+OK\r\n", "{}", show(&r));
}
