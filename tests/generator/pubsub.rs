//! The history of Pub/Sub: every message published, and what each subscription received.

use crate::history::{parse_id, History, NEVER};
use std::collections::{BTreeMap, HashSet};

pub struct Msg {
    pub publisher: usize,
    /// When its PUBLISH's reply was stamped.
    pub reply_ts: u64,
}

impl History {
    pub fn new_msg(&mut self, publisher: usize) -> u32 {
        self.msgs.push(Msg {
            publisher,
            reply_ts: NEVER,
        });
        (self.msgs.len() - 1) as u32
    }

    pub fn published(&mut self, m: u32) {
        self.msgs[m as usize].reply_ts = self.tick();
        self.count("ack: publish");
    }

    /// What one subscription, whose SUBSCRIBE was sent at `sub_ts`, received: never a
    /// message whose PUBLISH was acknowledged before that (a replay), each at most once,
    /// and each publisher's in the order it published them. Replays are reported once per
    /// subscription: a restore replays them by the hundred.
    pub fn subscription(&mut self, sub_ts: u64, payloads: &[Vec<u8>]) {
        self.count("check: subscription");
        self.count_n("check: message received", payloads.len() as u64);
        let mut once = HashSet::new();
        let mut last: BTreeMap<usize, u32> = BTreeMap::new();
        let mut replayed = Vec::new();
        let mut found = Vec::new();
        for p in payloads {
            let Some(m) = parse_id(p, b'm').filter(|&m| m < self.msgs.len()) else {
                found.push(format!(
                    "phantom: a subscriber received {:?}, which nobody published",
                    String::from_utf8_lossy(p)
                ));
                continue;
            };
            let m = m as u32;
            let msg = &self.msgs[m as usize];
            if msg.reply_ts < sub_ts {
                replayed.push(format!("m{m} (acknowledged at t={})", msg.reply_ts));
            }
            if !once.insert(m) {
                found.push(format!("duplicate: a subscriber received m{m} twice"));
            }
            if let Some(prev) = last.insert(msg.publisher, m).filter(|&prev| prev > m) {
                found.push(format!(
                    "message order: a subscriber received m{m} after m{prev}, which the same \
                     publisher sent later"
                ));
            }
        }
        if !replayed.is_empty() {
            let n = replayed.len();
            replayed.truncate(5);
            found.push(format!(
                "replayed messages: a subscriber whose SUBSCRIBE was sent at t={sub_ts} received \
                 {n} message(s) whose PUBLISH was acknowledged before: {}{}",
                replayed.join(", "),
                if n > 5 { ", ..." } else { "" }
            ));
        }
        self.report(found);
    }
}
