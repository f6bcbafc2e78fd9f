//! The replies the gate holds, and the one count of their bytes.
//!
//! Write replies wait in batches keyed by the replication offset that must become durable;
//! read replies wait keyed by the write generation ([`super::dirty`]) that must settle. Every
//! way in and out goes through this type, so `bytes` is adjusted in one place: each change
//! is checked arithmetic, and debug builds recount after every change.

use super::marks::WriteMark;
use super::output::ReplyTx;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::time::Instant;

/// A reply waiting for durability.
#[derive(Debug)]
pub struct Held {
    pub tx: ReplyTx,
    pub reply: Bytes,
    /// When Valkey's reply arrived: the hold time starts here.
    arrived: Instant,
}

impl Held {
    pub fn new(tx: ReplyTx, reply: Bytes) -> Held {
        Held {
            tx,
            reply,
            arrived: Instant::now(),
        }
    }

    /// Releases a reply the gate held (counted in `walrus_ack_hold_seconds`).
    pub(super) fn release(self) {
        crate::metrics::ACK_HOLD.observe(self.arrived.elapsed().as_secs_f64());
        self.pass();
    }

    /// Releases a read that never had to wait.
    pub(super) fn pass(self) {
        self.tx.send(self.reply);
    }

    pub(super) fn fail(self, why: &Bytes) {
        self.tx.send(why.clone());
    }
}

/// A settled batch: its write replies and the dirty-key marks they clear once durable.
pub type Batch = (Vec<Held>, Vec<WriteMark>);

#[derive(Debug, Default)]
pub struct HeldQueue {
    batches: BTreeMap<u64, Vec<Batch>>,
    reads: BTreeMap<u64, Vec<Held>>,
    /// Bytes of every reply held, writes and reads.
    bytes: u64,
}

fn bytes_of<'a>(replies: impl IntoIterator<Item = &'a Held>) -> u64 {
    replies.into_iter().map(|h| h.reply.len() as u64).sum()
}

impl HeldQueue {
    /// Bytes of every reply held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// How many replies are held.
    pub fn len(&self) -> usize {
        self.batches
            .values()
            .flatten()
            .map(|(r, _)| r.len())
            .sum::<usize>()
            + self.reads.values().map(Vec::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.reads.is_empty()
    }

    /// The lowest offset a held batch waits for.
    pub fn first_batch_offset(&self) -> Option<u64> {
        self.batches.keys().next().copied()
    }

    /// Holds a batch until `offset` is durable.
    pub fn hold_batch(&mut self, offset: u64, replies: Vec<Held>, marks: Vec<WriteMark>) {
        self.add(bytes_of(&replies));
        self.batches
            .entry(offset)
            .or_default()
            .push((replies, marks));
        self.check();
    }

    /// Holds a read until every write up to `generation` is durable.
    pub fn hold_read(&mut self, generation: u64, read: Held) {
        self.add(read.reply.len() as u64);
        self.reads.entry(generation).or_default().push(read);
        self.check();
    }

    /// Takes the batches waiting for offsets up to `offset`.
    pub fn batches_through(&mut self, offset: u64) -> Vec<Batch> {
        let later = self.batches.split_off(&offset.saturating_add(1));
        let done: Vec<Batch> = std::mem::replace(&mut self.batches, later)
            .into_values()
            .flatten()
            .collect();
        self.sub(done.iter().map(|(r, _)| bytes_of(r)).sum());
        self.check();
        done
    }

    /// Takes the reads waiting for generations up to `generation`.
    pub fn reads_through(&mut self, generation: u64) -> Vec<Held> {
        let later = self.reads.split_off(&generation.saturating_add(1));
        let ready = std::mem::replace(&mut self.reads, later);
        self.take_reads(ready)
    }

    /// Takes the reads waiting for generations from `generation` on.
    pub fn reads_from(&mut self, generation: u64) -> Vec<Held> {
        let later = self.reads.split_off(&generation);
        self.take_reads(later)
    }

    /// Takes every reply that arrived at or before `cutoff`, writes and reads apart. A batch
    /// keeps its marks (its writes' keys stay dirty) when its replies are taken.
    pub fn take_arrived_by(&mut self, cutoff: Instant) -> (Vec<Held>, Vec<Held>) {
        let take_old = |held: &mut Vec<Held>, out: &mut Vec<Held>| {
            let (gone, kept): (Vec<Held>, Vec<Held>) = std::mem::take(held)
                .into_iter()
                .partition(|h| h.arrived <= cutoff);
            *held = kept;
            out.extend(gone);
        };
        let mut writes = Vec::new();
        for (replies, _marks) in self.batches.values_mut().flatten() {
            take_old(replies, &mut writes);
        }
        let mut reads = Vec::new();
        for held in self.reads.values_mut() {
            take_old(held, &mut reads);
        }
        self.reads.retain(|_, held| !held.is_empty());
        self.sub(bytes_of(writes.iter().chain(&reads)));
        self.check();
        (writes, reads)
    }

    /// Takes everything held.
    pub fn take_all(&mut self) -> (Vec<Batch>, Vec<Held>) {
        let batches = std::mem::take(&mut self.batches)
            .into_values()
            .flatten()
            .collect();
        let reads = std::mem::take(&mut self.reads)
            .into_values()
            .flatten()
            .collect();
        self.bytes = 0;
        (batches, reads)
    }

    fn take_reads(&mut self, reads: BTreeMap<u64, Vec<Held>>) -> Vec<Held> {
        let out: Vec<Held> = reads.into_values().flatten().collect();
        self.sub(bytes_of(&out));
        self.check();
        out
    }

    fn add(&mut self, n: u64) {
        self.bytes = self.bytes.checked_add(n).expect("held bytes overflow");
    }

    fn sub(&mut self, n: u64) {
        self.bytes = self
            .bytes
            .checked_sub(n)
            .expect("held bytes below zero: a reply left the queue twice");
    }

    /// Debug builds: the count is the sum of what is held. Only while the queue is small:
    /// a recount after every change is quadratic, and the integration tests run a debug
    /// walrus under load.
    fn check(&self) {
        const RECOUNT_MAX_KEYS: usize = 64;
        if cfg!(debug_assertions) && self.batches.len() + self.reads.len() <= RECOUNT_MAX_KEYS {
            let counted = self
                .batches
                .values()
                .flatten()
                .map(|(r, _)| bytes_of(r))
                .sum::<u64>()
                + self.reads.values().map(bytes_of).sum::<u64>();
            assert_eq!(self.bytes, counted, "held bytes drifted from what is held");
        }
    }
}
