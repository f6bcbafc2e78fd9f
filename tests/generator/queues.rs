//! The history of the queues: every job pushed, every pop, and what reads of the queues
//! saw. A job popped with an acknowledged reply never comes back; every acknowledged job is
//! queued or popped (the final check, in `check.rs`).

use crate::history::{parse_id, Fate, History, NEVER, QUEUES};
use crate::keys::queue_key;
use std::collections::{HashMap, HashSet};

pub struct Job {
    pub queue: usize,
    pub send_ts: u64,
    pub ack_ts: u64,
    pub fate: Fate,
    /// When its acknowledged pop was stamped.
    pub popped: u64,
    /// Its acknowledged pop was a BLMOVE to its tag's done list (`keys::done_key`).
    pub moved: bool,
    /// When it was sent, for the check that needs no crash (`release.rs`).
    pub sent: crate::release::Stamp,
}

impl History {
    pub fn new_job(&mut self, queue: usize) -> u32 {
        let send_ts = self.tick();
        let sent = self.stamp();
        self.jobs.push(Job {
            queue,
            send_ts,
            ack_ts: NEVER,
            fate: Fate::Pending,
            popped: NEVER,
            moved: false,
            sent,
        });
        (self.jobs.len() - 1) as u32
    }

    pub fn job_pushed(&mut self, j: u32, acked: bool) {
        let ts = self.tick();
        let job = &mut self.jobs[j as usize];
        if acked {
            job.fate = Fate::Acked;
            job.ack_ts = ts;
            let sent = job.sent;
            self.count("ack: job push");
            self.reveals(&sent, |_| {
                format!("the acknowledgement of the push of j{j}")
            });
        } else {
            job.fate = Fate::Unknown;
            self.count("unknown: job push");
        }
    }

    /// The job of `item` in `queue`, if it is one pushed there.
    fn job_in(&mut self, queue: usize, item: &[u8], what: &str) -> Option<u32> {
        let j =
            parse_id(item, b'j').filter(|&j| j < self.jobs.len() && self.jobs[j].queue == queue);
        if j.is_none() {
            self.violation(format!(
                "phantom: {what} of {} shows {:?}, which no producer pushed there",
                queue_key(queue),
                String::from_utf8_lossy(item)
            ));
        }
        j.map(|j| j as u32)
    }

    /// An acknowledged pop of `item` from the queue named `key`, by a request stamped `sent`
    /// (a BLMOVE to the done list if `moved`).
    pub fn popped(&mut self, key: &[u8], item: &[u8], sent: &crate::release::Stamp, moved: bool) {
        self.reveals(sent, |_| {
            format!(
                "the acknowledgement of a pop of {}",
                String::from_utf8_lossy(item)
            )
        });
        let ts = self.tick();
        self.count("ack: job pop");
        self.count("check: popped job");
        let queue = (0..QUEUES).find(|&q| queue_key(q).as_bytes() == key);
        let Some(queue) = queue else {
            return self.unexpected("BLPOP", &String::from_utf8_lossy(key));
        };
        let Some(j) = self.job_in(queue, item, "BLPOP") else {
            return;
        };
        let job = &mut self.jobs[j as usize];
        if job.popped != NEVER {
            let first = job.popped;
            self.violation(format!(
                "duplicate: j{j} popped twice from {}: first acknowledged at t={first}, again at \
                 t={ts}",
                queue_key(queue)
            ));
        } else {
            job.popped = ts;
            job.moved = moved;
        }
    }

    pub fn pop_unknown(&mut self) {
        self.unknown_pops += 1;
        self.count("unknown: job pop");
    }

    /// An LRANGE of a queue sent at `send_ts` (`NEVER`: the final read): no job whose pop
    /// was acknowledged before. Kept for the final check of what it showed popped.
    pub fn observe_queue(
        &mut self,
        queue: usize,
        send_ts: u64,
        items: &[Vec<u8>],
        what: &str,
    ) -> Vec<u32> {
        self.count("check: queue read");
        let mut ids = Vec::new();
        let mut once = HashSet::new();
        for item in items {
            let Some(j) = self.job_in(queue, item, what) else {
                continue;
            };
            if !once.insert(j) {
                self.violation(format!(
                    "duplicate: {what} of {} shows j{j} twice",
                    queue_key(queue)
                ));
            }
            let (popped, sent) = (self.jobs[j as usize].popped, self.jobs[j as usize].sent);
            if send_ts != NEVER {
                self.reveals(&sent, |_| {
                    format!("{what} of {} showed j{j}", queue_key(queue))
                });
            }
            if popped < send_ts {
                self.violation(format!(
                    "popped job reappeared: {what} of {} sent at t={send_ts} shows j{j}, whose \
                     pop was acknowledged at t={popped}",
                    queue_key(queue)
                ));
            }
            self.seen_jobs.insert(j);
            ids.push(j);
        }
        if send_ts != NEVER {
            self.queue_reads[queue].push(ids.clone());
        }
        ids
    }

    /// A queue is a window of the jobs pushed to it, in push order: a read that shows job Y
    /// but not X, pushed before Y, shows X popped. If X is queued at the end, that pop was
    /// lost after a read saw it: a dirty read. `last` is the final queue.
    pub fn pops_seen_then_lost(&mut self, queue: usize, last: &[u32]) {
        let at: HashMap<u32, usize> = last.iter().enumerate().map(|(i, &j)| (j, i)).collect();
        let mut found = Vec::new();
        for read in &self.queue_reads[queue] {
            let shown: HashSet<u32> = read.iter().copied().collect();
            // The earliest job of the final queue that this read shows.
            let Some(head) = read.iter().filter_map(|j| at.get(j)).min() else {
                continue;
            };
            if let Some(back) = last[..*head].iter().find(|j| !shown.contains(j)) {
                found.push(format!(
                    "dirty read: a read of {} showed j{back} popped (it showed j{}, pushed \
                     after it, but not j{back}), and j{back} is queued at the end",
                    queue_key(queue),
                    last[*head]
                ));
            }
        }
        self.count_n(
            "check: queue read against the end",
            self.queue_reads[queue].len() as u64,
        );
        self.report(found);
    }
}

impl History {
    /// The done lists at the end (one per tag): every job a BLMOVE acknowledged is there,
    /// and every job there was pushed, and is no longer queued.
    pub fn final_done(&mut self, done: &[Vec<Vec<u8>>], queued: &HashSet<u32>) {
        let mut found = Vec::new();
        let mut there = HashSet::new();
        for (t, items) in done.iter().enumerate() {
            for item in items {
                let j = parse_id(item, b'j').filter(|&j| j < self.jobs.len());
                let Some(j) = j.map(|j| j as u32) else {
                    found.push(format!(
                        "phantom: the final {} shows {:?}",
                        crate::keys::done_key(t),
                        String::from_utf8_lossy(item)
                    ));
                    continue;
                };
                if !there.insert(j) || queued.contains(&j) {
                    found.push(format!(
                        "duplicate: j{j} is in a done list twice, or queued too"
                    ));
                }
            }
        }
        for (j, job) in self.jobs.iter().enumerate() {
            if job.moved && !there.contains(&(j as u32)) {
                found.push(format!(
                    "lost acknowledged write: j{j}, moved by an acknowledged BLMOVE, is not in \
                     its done list"
                ));
            }
        }
        self.count("check: done lists");
        self.report(found);
    }
}
