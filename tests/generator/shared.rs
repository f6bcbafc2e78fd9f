//! What the client threads and the fault loop share: the history, where walrus listens now,
//! and the stop flag.

use crate::history::History;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where walrus listens now: a restarted walrus listens on a new port.
pub struct Target {
    addr: Mutex<String>,
    changed: Condvar,
}

impl Target {
    pub fn get(&self) -> String {
        self.addr.lock().unwrap().clone()
    }

    pub fn set(&self, addr: &str) {
        *self.addr.lock().unwrap() = addr.to_string();
        self.changed.notify_all();
    }

    /// Waits, at most `timeout`, for an address other than `seen` (walrus restarted).
    pub fn wait_change(&self, seen: &str, timeout: Duration) {
        let addr = self.addr.lock().unwrap();
        let _unused = self
            .changed
            .wait_timeout_while(addr, timeout, |a| a == seen)
            .unwrap();
    }
}

pub struct Ctx {
    hist: Mutex<History>,
    pub target: Target,
    /// Cluster mode: every walrus's address (each keeps its own across restarts), the only
    /// addresses a client may ever be redirected to. Empty otherwise.
    walruses: Vec<String>,
    stop: AtomicBool,
    /// When Valkey was frozen (`freeze.rs`): from, and until unless it still is.
    frozen: Mutex<Vec<(Instant, Option<Instant>)>>,
}

impl Ctx {
    pub fn new(hist: History, addr: &str, walruses: Vec<String>) -> Ctx {
        Ctx {
            hist: Mutex::new(hist),
            target: Target {
                addr: Mutex::new(addr.to_string()),
                changed: Condvar::new(),
            },
            walruses,
            stop: AtomicBool::new(false),
            frozen: Mutex::new(Vec::new()),
        }
    }

    /// Valkey is frozen from `since`, or (`None`) no longer.
    pub fn freeze(&self, since: Option<Instant>) {
        let mut frozen = self.frozen.lock().unwrap();
        match since {
            Some(t) => frozen.push((t, None)),
            None => {
                if let Some(last) = frozen.last_mut() {
                    last.1 = Some(Instant::now());
                }
            }
        }
    }

    /// A request sent at `sent` was answered at `answered`: if it was sent while Valkey was
    /// frozen, and Valkey was still frozen `FREEZE_BOUND` later, it waited too long.
    pub fn freeze_hang(&self, sent: Instant, answered: Instant) -> bool {
        let bound = crate::freeze::FREEZE_BOUND;
        answered.saturating_duration_since(sent) > bound
            && self
                .frozen
                .lock()
                .unwrap()
                .iter()
                .any(|&(from, until)| sent >= from && until.is_none_or(|u| sent + bound <= u))
    }

    /// Where keyless commands may go: any walrus of the cluster, else the one walrus.
    pub fn nodes(&self) -> Vec<String> {
        if self.walruses.is_empty() {
            vec![self.target.get()]
        } else {
            self.walruses.clone()
        }
    }

    /// Cluster mode: clients follow redirects, and there is only database 0.
    pub fn cluster(&self) -> bool {
        !self.walruses.is_empty()
    }

    pub fn is_walrus(&self, addr: &str) -> bool {
        self.walruses.iter().any(|w| w == addr)
    }

    /// The history; still usable after a client thread panicked while holding it.
    pub fn h(&self) -> MutexGuard<'_, History> {
        self.hist.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Tells every client to finish its current step, and wakes those waiting for walrus.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _held = self.target.addr.lock().unwrap();
        self.target.changed.notify_all();
    }
}

/// An independent seed for stream `stream` of a run seeded with `seed` (splitmix64), never
/// zero (xorshift stays at zero).
pub fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed.wrapping_add(stream.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// One of `table`'s items, each as likely as its weight.
pub fn pick<T: Copy>(rng: &mut crate::common::Rng, table: &[(T, u64)]) -> T {
    let total: u64 = table.iter().map(|t| t.1).sum();
    let mut r = rng.below(total);
    for &(item, weight) in table {
        if r < weight {
            return item;
        }
        r -= weight;
    }
    unreachable!("r < total")
}
