//! Cluster mode (docs/cluster.md, "Valkey Cluster"): the cluster's two other primaries, each a walrus
//! running its own Valkey (its cluster bus on a fixed port) on its own data directory, which every restart
//! reuses (so that it is restored in place, as the shard under test is); the cluster's
//! creation; the fault that kills several shards at once; and what the faults ask of the
//! cluster (who owns a slot, whether every node agrees). Shards are numbered as
//! `System::shards` lists them: 0 is the shard under test.

use crate::common::{decode, free_port, Proc, Raw, Rng, Walrus, START_TIMEOUT};
use crate::faults::{recover, relaunch};
use crate::keys::tag_slot;
use crate::node;
use crate::shared::Ctx;
use crate::system::{System, RECOVERY};
use redis_protocol::resp2::types::OwnedFrame;
use std::io::Write;
use std::time::{Duration, Instant};

/// How long the nodes get to agree on a slot's owner (gossip) once a move or a fix is done.
const SETTLE: Duration = Duration::from_secs(30);

/// Another primary of the cluster.
pub struct Peer {
    pub addr: String,
    /// Its Valkey's cluster bus port, the same across restarts.
    bus_port: u16,
    durable: bool,
    /// Holds its data directory, `data/`.
    dir: tempfile::TempDir,
    walrus: Option<Walrus>,
    /// Spawned, not yet listening.
    starting: Option<(Proc, tempfile::TempDir)>,
    /// Logs of its walruses already replaced.
    logs: Vec<(String, String)>,
}

impl Peer {
    fn new(durable: bool) -> Peer {
        let mut p = Peer {
            addr: format!("127.0.0.1:{}", free_port()),
            bus_port: free_port(),
            durable,
            dir: tempfile::tempdir().unwrap(),
            walrus: None,
            starting: None,
            logs: Vec::new(),
        };
        p.spawn();
        p
    }

    /// Starts walrus on its data directory without waiting for it (`await_started`), so
    /// that several shards restore at once.
    fn spawn(&mut self) {
        let run = self.dir.path().join("run");
        let config = node::managed_config(self.bus_port, self.durable, true, &run);
        let data = self.dir.path().join("data");
        let build = Walrus::build().config(&config).listen(&self.addr);
        self.starting = Some(build.data(&data).spawn());
    }

    fn await_started(&mut self) -> Result<(), String> {
        let Some((proc, config_dir)) = self.starting.take() else {
            return Ok(());
        };
        match node::listening(proc, config_dir) {
            Ok(w) => {
                self.walrus = Some(w);
                Ok(())
            }
            Err((log, why)) => {
                self.logs.push((self.name(), log));
                Err(format!("the walrus at {}: {why}", self.addr))
            }
        }
    }

    fn kill_walrus(&mut self) {
        if let Some(w) = self.walrus.take() {
            self.logs.push((self.name(), node::kill(w)));
        }
    }

    fn kill_valkey(&self) -> bool {
        self.walrus.as_ref().is_some_and(node::kill_valkey)
    }

    fn name(&self) -> String {
        format!("peer-{}", self.addr.rsplit(':').next().unwrap_or_default())
    }

    /// Its walruses' logs, the current one last.
    pub fn logs(&self) -> Vec<(String, String)> {
        let mut logs = self.logs.clone();
        if let Some(w) = &self.walrus {
            logs.push((self.name(), w.proc.log_text()));
        }
        logs
    }
}

impl Drop for Peer {
    /// Walrus dies with its `Proc`; its Valkey is killed first rather than left to PDEATHSIG.
    fn drop(&mut self) {
        if let Some(pid) = self.walrus.as_ref().and_then(node::managed_valkey) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// What a fault kills on one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kill {
    /// Walrus, and with it its Valkey: walrus restarts on the same data.
    Walrus,
    /// Valkey alone: walrus restores it in place.
    Valkey,
}

impl System {
    /// Starts the two other shards and makes the three one cluster, as a user does
    /// (`redis-cli --cluster create` with walrus addresses). `redis-cli` gives each node a
    /// third of the slots in the order named: the first other shard gets the slot of
    /// `{gen2}` (1616), this walrus, named second, the slot of `{gen}` (10060).
    pub fn form_cluster(&mut self) {
        self.peers = vec![Peer::new(self.durable), Peer::new(self.durable)];
        for p in &mut self.peers {
            p.await_started().unwrap_or_else(|e| panic!("{e}"));
        }
        let nodes = [&self.peers[0].addr, &self.addr(), &self.peers[1].addr];
        let out = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes)
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli (deploy/setup.sh installs redis-tools)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("All 16384 slots covered"),
            "{text}"
        );
        for w in self.walruses() {
            w.proc.wait_line("Cluster state changed: ok", START_TIMEOUT);
        }
        self.ids = self
            .shards()
            .iter()
            .map(|a| match call(a, &["CLUSTER", "MYID"]) {
                Ok(OwnedFrame::BulkString(id)) => String::from_utf8(id).unwrap(),
                other => panic!("CLUSTER MYID at {a}: {other:?}"),
            })
            .collect();
        for (tag, shard) in [(0, 0), (1, 1)] {
            let owner = await_settled(self, tag_slot(tag), SETTLE);
            assert_eq!(owner, Ok(shard), "the owner of tag {tag}'s slot");
        }
    }

    /// Every walrus's address, the shard under test's first.
    pub fn shards(&self) -> Vec<String> {
        let peers = self.peers.iter().map(|p| p.addr.clone());
        std::iter::once(self.addr()).chain(peers).collect()
    }

    /// Every walrus running now.
    fn walruses(&self) -> Vec<&Walrus> {
        let peers = self.peers.iter().filter_map(|p| p.walrus.as_ref());
        self.walrus().into_iter().chain(peers).collect()
    }

    /// SIGKILLs shard `i`'s walrus or Valkey; false when there was no Valkey to kill (its
    /// walrus was restarting it).
    pub fn kill_shard(&mut self, i: usize, what: Kill) -> bool {
        match (i, what) {
            (0, Kill::Walrus) => self.kill_walrus(),
            (0, Kill::Valkey) => return self.kill_valkey(),
            (i, Kill::Walrus) => self.peers[i - 1].kill_walrus(),
            (i, Kill::Valkey) => return self.peers[i - 1].kill_valkey(),
        }
        true
    }
}

/// Brings back the shards `killed` names, all at once: the other shards' walruses start,
/// the shard under test comes back (`relaunch` or `recover`), then each of the others.
/// Returns once every one serves again.
pub fn revive(sys: &mut System, ctx: &Ctx, killed: &[(usize, Kill)]) -> Result<(), String> {
    revive_with(sys, killed, |sys| {
        match killed.iter().find(|k| k.0 == 0).map(|k| k.1) {
            Some(Kill::Walrus) => relaunch(sys, ctx),
            Some(Kill::Valkey) => recover(sys, ctx),
            None => Ok(()),
        }
    })
}

/// `revive`, with `this` bringing the shard under test back (`killed`'s other shards start
/// before it, and are awaited after it).
pub fn revive_with(
    sys: &mut System,
    killed: &[(usize, Kill)],
    this: impl FnOnce(&mut System) -> Result<(), String>,
) -> Result<(), String> {
    let others: Vec<(usize, Kill)> = killed.iter().copied().filter(|k| k.0 > 0).collect();
    for &(i, what) in &others {
        if what == Kill::Walrus {
            sys.peers[i - 1].spawn();
        }
    }
    let result = this(sys);
    for &(i, _) in &others {
        let p = &mut sys.peers[i - 1];
        p.await_started()?;
        node::await_serving(&p.addr, RECOVERY)?;
    }
    result
}

/// The fault on several shards at once: the shard under test and one or both of the
/// others, each losing its walrus (its Valkey with it) or its Valkey alone, all killed
/// before any comes back, so that their restores in place run at the same time.
pub fn kill_shards(sys: &mut System, ctx: &Ctx, rng: &mut Rng) -> Result<String, String> {
    let others: &[usize] = match rng.below(3) {
        0 => &[1],
        1 => &[2],
        _ => &[1, 2],
    };
    let mut killed = Vec::new();
    for &i in std::iter::once(&0).chain(others) {
        let what = match rng.below(2) {
            0 => Kill::Walrus,
            _ => Kill::Valkey,
        };
        if sys.kill_shard(i, what) {
            killed.push((i, what));
            let whose = if i == 0 {
                "the shard under test"
            } else {
                "another shard"
            };
            ctx.h()
                .count(&format!("killed at once: {whose}'s {what:?}"));
        }
    }
    revive(sys, ctx, &killed)?;
    Ok(format!("KillShards, {} shards at once", killed.len()))
}

/// One command to the walrus at `addr`: its reply, or why there was none.
pub fn call(addr: &str, args: &[&str]) -> Result<OwnedFrame, String> {
    let mut c = Raw::try_connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    let request = walrus::resp::write::command(args);
    c.stream
        .write_all(&request)
        .map_err(|e| format!("{addr}: {e}"))?;
    Ok(decode(&c.try_read_frame()?))
}

/// CLUSTER NODES as the walrus at `addr` answers it.
pub fn view(addr: &str) -> Result<String, String> {
    match call(addr, &["CLUSTER", "NODES"])? {
        OwnedFrame::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        other => Err(format!("CLUSTER NODES at {addr}: {other:?}")),
    }
}

/// The id of the node that owns `slot` in a CLUSTER NODES `view`, if any.
pub fn owner_in(view: &str, slot: u16) -> Option<String> {
    view.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let covers = |range: &&str| match range.split_once('-') {
            Some((a, b)) => {
                a.parse().is_ok_and(|a: u16| a <= slot) && b.parse().is_ok_and(|b: u16| slot <= b)
            }
            None => range.parse() == Ok(slot),
        };
        fields
            .get(8..)?
            .iter()
            .any(covers)
            .then(|| fields[0].to_string())
    })
}

/// The shard that owns `slot` if every node agrees on it and no node has any slot open
/// (importing or migrating); else what disagrees.
pub fn settled_owner(sys: &System, slot: u16) -> Result<usize, String> {
    let mut owners = Vec::new();
    for addr in sys.shards() {
        let text = view(&addr)?;
        // Open slots show as `[slot->-id]` (migrating) or `[slot-<-id]` (importing).
        if let Some(open) = text.split_whitespace().find(|w| w.starts_with('[')) {
            return Err(format!("{addr} has slot {open} open"));
        }
        owners.push(owner_in(&text, slot));
    }
    match owners.first() {
        Some(Some(id)) if owners.iter().all(|o| o.as_ref() == Some(id)) => sys
            .ids
            .iter()
            .position(|i| i == id)
            .ok_or_else(|| format!("slot {slot}'s owner {id} is no shard")),
        _ => Err(format!(
            "the nodes disagree on slot {slot}'s owner: {owners:?}"
        )),
    }
}

/// Returns the owner of `slot` once every node agrees on it and no slot is open anywhere,
/// within `bound`.
pub fn await_settled(sys: &System, slot: u16, bound: Duration) -> Result<usize, String> {
    let deadline = Instant::now() + bound;
    loop {
        match settled_owner(sys, slot) {
            Ok(owner) => return Ok(owner),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("not settled within {bound:?}: {e}"))
            }
            // The nodes' views converge by gossip, which has no event to await here.
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
