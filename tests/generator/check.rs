//! The final read of every key, once the last fault has settled and walrus serves again,
//! and the checks of the whole history against it.

use crate::conn::{cmd, describe, Reply};
use crate::counters::COUNTERS;
use crate::history::{list_db, Fate, History, ALL_LISTS, LISTS, NEVER, QUEUES};
use crate::keys::{comes_and_goes, counter_key, done_key, list_key, queue_key, PATTERN, TAGS};
use crate::route::{Batch, Router};
use crate::shared::Ctx;
use crate::system::AROUND_KEYS;
use crate::values::big_version;
use crate::workers::bulks;
use crate::{expiry, registers};
use redis_protocol::resp2::types::OwnedFrame;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What walrus holds at the end.
pub struct Final {
    /// Every list, those of the other databases after database 0's.
    pub lists: Vec<Vec<Vec<u8>>>,
    /// The done lists, one per tag.
    pub done: Vec<Vec<Vec<u8>>>,
    pub registers: Vec<Option<Vec<u8>>>,
    pub expiring: Vec<Option<Vec<u8>>>,
    /// When the expiring keys were read.
    pub read_at: std::time::SystemTime,
    pub queues: Vec<Vec<Vec<u8>>>,
    /// Each large value's length and first bytes.
    pub bigs: BTreeMap<String, (i64, Vec<u8>)>,
    pub counters: Vec<i64>,
    pub keys: BTreeSet<String>,
}

/// Reads everything through walrus (in cluster mode, each key where it lives, and the
/// keyspace of every walrus), retrying each command while walrus answers an error (it may
/// still be finishing a restore: -LOADING).
pub fn read_final(ctx: &Arc<Ctx>, big_keys: &[String]) -> Result<Final, String> {
    let mut router = Router::new(ctx.clone(), 1);
    // `at`: the walrus to ask, whatever the command's keys.
    let mut ask_at = |args: &[&str], at: Option<&str>| -> Result<OwnedFrame, String> {
        let c = vec![cmd(args)];
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let reply = match at {
                Some(addr) => router.exchange_at(addr, &c),
                None => router.exchange(&c, Batch::Pipeline),
            };
            match reply.map(|mut r| r.remove(0)) {
                Some(Reply::Frame(f)) => return Ok(f),
                None | Some(Reply::Lost) => {
                    return Err(format!("the final `{}` got no reply", describe(&c[0])))
                }
                Some(Reply::Error(e)) if Instant::now() > deadline => {
                    return Err(format!(
                        "the final `{}` keeps failing: -{e}",
                        describe(&c[0])
                    ))
                }
                // Retry pacing while walrus finishes a restore.
                Some(Reply::Error(_)) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    };
    let mut keys = BTreeSet::new();
    for node in ctx.nodes() {
        keys.append(&mut scan(|args| ask_at(args, Some(&node)))?);
    }
    let mut ask = |args: &[&str]| ask_at(args, None);
    let mut range = |key: &str| -> Result<Vec<Vec<u8>>, String> {
        match ask(&["LRANGE", key, "0", "-1"])? {
            OwnedFrame::Array(items) => {
                bulks(items).ok_or_else(|| format!("LRANGE {key}: not strings"))
            }
            f => Err(format!("LRANGE {key}: {f:?}")),
        }
    };
    let mut lists: Vec<Vec<Vec<u8>>> = (0..LISTS)
        .map(|k| range(&list_key(k)))
        .collect::<Result<_, _>>()?;
    let queues = (0..QUEUES)
        .map(|q| range(&queue_key(q)))
        .collect::<Result<_, _>>()?;
    let done = (0..TAGS.len())
        .map(|t| range(&done_key(t)))
        .collect::<Result<_, _>>()?;
    let mut get = |key: &str| -> Result<Option<Vec<u8>>, String> {
        match ask(&["GET", key])? {
            OwnedFrame::BulkString(b) => Ok(Some(b)),
            OwnedFrame::Null => Ok(None),
            f => Err(format!("GET {key}: {f:?}")),
        }
    };
    let registers = registers::keys()
        .iter()
        .map(|k| get(k))
        .collect::<Result<_, _>>()?;
    let read_at = std::time::SystemTime::now();
    let expiring = expiry::keys()
        .iter()
        .map(|k| get(k))
        .collect::<Result<_, _>>()?;
    let mut bigs = BTreeMap::new();
    for key in big_keys {
        let len = match ask(&["STRLEN", key])? {
            OwnedFrame::Integer(n) => n,
            f => return Err(format!("STRLEN {key}: {f:?}")),
        };
        let head = match ask(&["GETRANGE", key, "0", "63"])? {
            OwnedFrame::BulkString(b) => b,
            f => return Err(format!("GETRANGE {key}: {f:?}")),
        };
        bigs.insert(key.clone(), (len, head));
    }
    let mut counters = Vec::with_capacity(COUNTERS);
    for c in 0..COUNTERS {
        let key = counter_key(c);
        counters.push(match ask(&["GET", &key])? {
            OwnedFrame::Null => 0,
            OwnedFrame::BulkString(b) => {
                parse_int(&b).ok_or_else(|| format!("GET {key}: {b:?}"))?
            }
            f => return Err(format!("GET {key}: {f:?}")),
        });
    }
    // The other databases' lists (none in cluster mode): SELECT, LRANGE, SELECT 0 on one
    // connection.
    for k in LISTS..ALL_LISTS {
        if ctx.cluster() {
            lists.push(Vec::new());
            continue;
        }
        let db = list_db(k).to_string();
        let c = [
            cmd(&["SELECT", &db]),
            cmd(&["LRANGE", &list_key(k), "0", "-1"]),
            cmd(&["SELECT", "0"]),
        ];
        let replies = router.exchange_at(&ctx.target.get(), &c);
        match replies.map(|mut r| r.remove(1)) {
            Some(Reply::Frame(OwnedFrame::Array(items))) => lists
                .push(bulks(items).ok_or_else(|| format!("LRANGE {}: not strings", list_key(k)))?),
            other => return Err(format!("the final LRANGE in database {db}: {other:?}")),
        }
    }
    Ok(Final {
        lists,
        done,
        registers,
        expiring,
        read_at,
        queues,
        bigs,
        counters,
        keys,
    })
}

/// Every client key of one walrus's keyspace, asked with `ask`.
fn scan(
    mut ask: impl FnMut(&[&str]) -> Result<OwnedFrame, String>,
) -> Result<BTreeSet<String>, String> {
    let mut keys = BTreeSet::new();
    let mut cursor = "0".to_string();
    loop {
        let page = ask(&["SCAN", &cursor, "MATCH", PATTERN, "COUNT", "1000"])?;
        let OwnedFrame::Array(mut page) = page else {
            return Err(format!("SCAN: {page:?}"));
        };
        let found = match page.pop() {
            Some(OwnedFrame::Array(found)) => bulks(found),
            _ => None,
        };
        let next = match page.pop() {
            Some(OwnedFrame::BulkString(c)) => String::from_utf8(c).ok(),
            _ => None,
        };
        let (Some(found), Some(next)) = (found, next) else {
            return Err("SCAN: not a page".into());
        };
        keys.extend(
            found
                .into_iter()
                .map(|k| String::from_utf8_lossy(&k).into_owned()),
        );
        if next == "0" {
            break;
        }
        cursor = next;
    }
    Ok(keys)
}

/// A counter's value, as GET returns it.
pub fn parse_int(b: &[u8]) -> Option<i64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

impl History {
    /// Every check of the whole history against the final state.
    pub fn check_final(&mut self, f: &Final) {
        self.settle();
        let mut present: HashMap<u32, (usize, usize)> = HashMap::new();
        for key in 0..ALL_LISTS {
            let Some(ids) = self.observe_list(key, None, &f.lists[key], "the final LRANGE") else {
                continue;
            };
            self.final_list(key, &ids);
            for (i, &e) in ids.iter().enumerate() {
                present.insert(e, (key, i + 1));
            }
        }
        self.lost_appends(&present);
        self.groups_whole(&present);
        self.final_queues(f);
        self.final_bigs(f);
        self.final_counters(&f.counters);
        self.final_regs(&f.registers);
        self.final_expiry(&f.expiring, f.read_at);
        self.final_keyspace(f);
    }

    /// A final list against what reads saw of it, and its order against real time.
    fn final_list(&mut self, key: usize, ids: &[u32]) {
        let list = &self.lists[key];
        let (seen, max_len) = (list.longest.len(), list.max_len);
        if seen > ids.len() {
            let gone: Vec<String> = list.longest[ids.len()..]
                .iter()
                .map(|e| format!("e{e}"))
                .collect();
            self.violation(format!(
                "dirty read: a read of {} showed {seen} elements, the final list has {}; gone: {}",
                list_key(key),
                ids.len(),
                gone.join(" ")
            ));
        }
        if max_len > ids.len() {
            self.violation(format!(
                "dirty read: LLEN {} showed {max_len}, the final list has {} elements",
                list_key(key),
                ids.len()
            ));
        }
        let times: Vec<(u64, u64)> = ids
            .iter()
            .map(|&e| {
                (
                    self.elems[e as usize].send_ts,
                    self.elems[e as usize].ack_ts,
                )
            })
            .collect();
        self.real_time_order(&list_key(key), 'e', ids, &times);
    }

    /// An element acknowledged before another was sent stands before it. (Queues too: pops
    /// only take from the head, so what remains keeps the pushes' order.)
    fn real_time_order(&mut self, key: &str, prefix: char, ids: &[u32], times: &[(u64, u64)]) {
        self.count("check: list order");
        // The element sent last among those before the current one.
        let mut latest: Option<usize> = None;
        for (i, &(send, ack)) in times.iter().enumerate() {
            if let Some(l) = latest.filter(|&l| times[l].0 > ack) {
                self.violation(format!(
                    "order: in {key}, {prefix}{} stands before {prefix}{}, which was acknowledged \
                     (t={ack}) before {prefix}{} was sent (t={})",
                    ids[l], ids[i], ids[l], times[l].0
                ));
            }
            if latest.is_none_or(|l| times[l].0 < send) {
                latest = Some(i);
            }
        }
    }

    /// Every acknowledged append is in its list, where its acknowledgement said.
    fn lost_appends(&mut self, present: &HashMap<u32, (usize, usize)>) {
        let mut found = Vec::new();
        for (e, el) in self.elems.iter().enumerate() {
            if el.fate != Fate::Acked {
                continue;
            }
            let want = (el.key, el.pos.unwrap_or(0));
            match present.get(&(e as u32)) {
                Some(&got) if got == want => {}
                Some(&(_, pos)) => found.push(format!(
                    "lost acknowledged write: {} is at position {pos} of the final {}",
                    self.describe(e as u32),
                    list_key(el.key)
                )),
                None => found.push(format!(
                    "lost acknowledged write: {} is not in the final {}",
                    self.describe(e as u32),
                    list_key(el.key)
                )),
            }
        }
        let n = self.elems.iter().filter(|e| e.fate == Fate::Acked).count();
        self.count_n("check: acknowledged append present", n as u64);
        self.report(found);
    }

    /// A transaction's, or one RPUSH's, elements are all there or none; an RPUSH's side by
    /// side.
    fn groups_whole(&mut self, present: &HashMap<u32, (usize, usize)>) {
        let mut found = Vec::new();
        let mut checked = 0;
        for g in self
            .groups
            .iter()
            .filter(|g| g.atomic && g.members.len() > 1)
        {
            checked += 1;
            let at: Vec<Option<&(usize, usize)>> =
                g.members.iter().map(|e| present.get(e)).collect();
            let n = at.iter().flatten().count();
            if n != 0 && n != at.len() {
                let shown: Vec<String> = g
                    .members
                    .iter()
                    .zip(&at)
                    .map(|(e, p)| {
                        format!("e{e} {}", if p.is_some() { "present" } else { "absent" })
                    })
                    .collect();
                found.push(format!(
                    "not all-or-nothing: {} of {}",
                    g.what,
                    shown.join(", ")
                ));
            } else if n > 1 && g.what == "RPUSH" {
                let contiguous = at.windows(2).all(|w| match (w[0], w[1]) {
                    (Some(a), Some(b)) => a.0 == b.0 && a.1 + 1 == b.1,
                    _ => false,
                });
                if !contiguous {
                    found.push(format!(
                        "not all-or-nothing: one RPUSH's elements are not side by side: {at:?}"
                    ));
                }
            }
        }
        self.count_n("check: group all-or-nothing", checked);
        self.report(found);
    }

    /// No popped job is back; every acknowledged (or seen) job is still queued or was
    /// popped, allowing one vanished job per pop whose reply never came.
    fn final_queues(&mut self, f: &Final) {
        let mut queued = HashSet::new();
        for q in 0..QUEUES {
            let ids = self.observe_queue(q, NEVER, &f.queues[q], "the final LRANGE");
            let times: Vec<(u64, u64)> = ids
                .iter()
                .map(|&j| (self.jobs[j as usize].send_ts, self.jobs[j as usize].ack_ts))
                .collect();
            self.real_time_order(&queue_key(q), 'j', &ids, &times);
            self.pops_seen_then_lost(q, &ids);
            queued.extend(ids);
        }
        self.final_done(&f.done, &queued);
        let vanished: Vec<u32> = (0..self.jobs.len() as u32)
            .filter(|j| {
                let job = &self.jobs[*j as usize];
                (job.fate == Fate::Acked || self.seen_jobs.contains(j))
                    && job.popped == NEVER
                    && !queued.contains(j)
            })
            .collect();
        self.count_n("check: job accounted for", self.jobs.len() as u64);
        if vanished.len() > self.unknown_pops {
            let shown: Vec<String> = vanished.iter().take(20).map(|j| format!("j{j}")).collect();
            self.violation(format!(
                "lost acknowledged write: {} acknowledged or seen jobs are neither queued nor \
                 popped, but only {} pops may have taken them unseen: {}",
                vanished.len(),
                self.unknown_pops,
                shown.join(" ")
            ));
        }
    }

    /// Each large value is its latest acknowledged version or a later one, no older than
    /// any read saw, and whole.
    fn final_bigs(&mut self, f: &Final) {
        let mut found = Vec::new();
        for (key, big) in &self.bigs {
            let Some((len, head)) = f.bigs.get(key) else {
                continue;
            };
            let acked = big
                .versions
                .iter()
                .rposition(|v| v.1 == Fate::Acked)
                .map_or(0, |i| i + 1);
            let Some(v) = big_version(key, head).filter(|&v| v <= big.versions.len()) else {
                found.push(format!(
                    "phantom: the final {key} begins {:?}, which nobody wrote",
                    String::from_utf8_lossy(head)
                ));
                continue;
            };
            if v < acked {
                found.push(format!(
                    "lost acknowledged write: the final {key} is version {v}, version {acked} \
                     was acknowledged"
                ));
            }
            if v > 0 && big.versions[v - 1].1 == Fate::NotRun {
                found.push(format!(
                    "aborted write visible: the final {key} is version {v}, whose transaction \
                     did not run"
                ));
            }
            if v < big.max_seen {
                found.push(format!(
                    "dirty read: a read of {key} showed version {}, the final value is version {v}",
                    big.max_seen
                ));
            }
            if v > 0 && *len != big.versions[v - 1].0 as i64 {
                found.push(format!(
                    "torn value: the final {key} (version {v}) is {len} bytes, {} were written",
                    big.versions[v - 1].0
                ));
            }
        }
        self.count_n("check: large value", self.bigs.len() as u64);
        self.report(found);
    }

    /// Keys that reads saw are still there; DBSIZE never counted more than can be.
    fn final_keyspace(&mut self, f: &Final) {
        let gone: Vec<String> = self.seen_keys.difference(&f.keys).cloned().collect();
        if !gone.is_empty() {
            self.violation(format!(
                "dirty read: reads saw keys that are gone: {gone:?}"
            ));
        }
        // Queues come and go, and so may the keys written around walrus; every other key,
        // once there, stays.
        let stays = f.keys.iter().filter(|k| !comes_and_goes(k)).count();
        // The keys that come and go, and the one a script let through would write
        // (`admin.rs`).
        let transient = QUEUES + f.registers.len() + f.expiring.len() + 1;
        if self.max_dbsize > stays + transient + AROUND_KEYS {
            self.violation(format!(
                "dirty read: DBSIZE showed {}, but only {stays} keys, {transient} that come and \
                 go and {AROUND_KEYS} keys written around walrus can exist",
                self.max_dbsize
            ));
        }
        self.count("check: keyspace");
    }
}
