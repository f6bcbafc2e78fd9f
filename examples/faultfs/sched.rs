//! When replies go out: now, after the injected latency, or after `resume`.
//!
//! fuser reads requests on one thread. A delayed reply must not hold that thread (then
//! eight concurrent 1 ms writes would take 8 ms, and nothing else would be answered
//! meanwhile), so the completion of a request (making it durable, then replying) is a job
//! handed to this scheduler: jobs due now run on the caller's thread, later ones on the
//! timer thread, and while stalled every job is held until `resume`. fuser's reply
//! objects are Send, which is what makes replying from another thread possible.
//!
//! Jobs take the state lock themselves: never submit while holding it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

pub type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    /// (deadline, id) of the timed jobs, earliest first.
    timed: BinaryHeap<Reverse<(Instant, u64)>>,
    jobs: HashMap<u64, Job>,
    /// Jobs held by `stall`, with their deadlines.
    held: Vec<(Instant, Job)>,
    stalled: bool,
    /// `freeze`: metadata requests are held too.
    frozen: bool,
    next_id: u64,
}

#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<(Mutex<Queue>, Condvar)>,
}

impl Scheduler {
    /// Starts the timer thread (it lives as long as the process).
    pub fn start() -> Scheduler {
        let s = Scheduler {
            inner: Arc::default(),
        };
        let timer = s.clone();
        std::thread::Builder::new()
            .name("faultfs-timer".into())
            .spawn(move || timer.run())
            .expect("spawn the timer thread");
        s
    }

    /// Runs `job` at `deadline` (at once if it has passed), or holds it while stalled.
    pub fn submit(&self, deadline: Instant, job: Job) {
        let (lock, cv) = &*self.inner;
        let mut q = lock.lock().unwrap();
        if q.stalled {
            q.held.push((deadline, job));
            return;
        }
        if deadline <= Instant::now() {
            drop(q);
            job();
            return;
        }
        let id = q.next_id;
        q.next_id += 1;
        q.timed.push(Reverse((deadline, id)));
        q.jobs.insert(id, job);
        cv.notify_one();
    }

    /// `stall`: from now on every job is held.
    pub fn stall(&self) {
        self.inner.0.lock().unwrap().stalled = true;
    }

    /// `freeze`: a stall that holds metadata requests too ([`Scheduler::frozen`]).
    pub fn freeze(&self) {
        let mut q = self.inner.0.lock().unwrap();
        q.stalled = true;
        q.frozen = true;
    }

    /// Whether metadata requests are to be submitted as jobs (and so held) rather than
    /// answered at once. A `resume` between this answer and the submit runs the job at once.
    pub fn frozen(&self) -> bool {
        self.inner.0.lock().unwrap().frozen
    }

    /// `resume`: releases the held jobs (each still waits out its own deadline); returns
    /// how many there were.
    pub fn resume(&self) -> usize {
        let (lock, cv) = &*self.inner;
        let mut q = lock.lock().unwrap();
        q.stalled = false;
        q.frozen = false;
        let held = std::mem::take(&mut q.held);
        let n = held.len();
        for (deadline, job) in held {
            let id = q.next_id;
            q.next_id += 1;
            q.timed.push(Reverse((deadline, id)));
            q.jobs.insert(id, job);
        }
        cv.notify_one();
        n
    }

    /// A crash: ends the stall and runs every waiting job now, on this thread. The jobs
    /// see that a crash happened after their request arrived and fail it with EIO.
    pub fn run_all_now(&self) {
        let jobs: Vec<Job> = {
            let mut q = self.inner.0.lock().unwrap();
            q.stalled = false;
            q.frozen = false;
            q.timed.clear();
            let mut jobs: Vec<Job> = q.held.drain(..).map(|(_, j)| j).collect();
            jobs.extend(q.jobs.drain().map(|(_, j)| j));
            jobs
        };
        for job in jobs {
            job();
        }
    }

    /// (held by a stall, waiting for their deadline), for `status`.
    pub fn counts(&self) -> (usize, usize, bool) {
        let q = self.inner.0.lock().unwrap();
        (q.held.len(), q.jobs.len(), q.stalled)
    }

    fn run(&self) {
        let (lock, cv) = &*self.inner;
        let mut q = lock.lock().unwrap();
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            while let Some(Reverse((deadline, id))) = q.timed.peek().copied() {
                if deadline > now {
                    break;
                }
                q.timed.pop();
                // Gone when a crash ran it already.
                if let Some(job) = q.jobs.remove(&id) {
                    due.push(job);
                }
            }
            if !due.is_empty() {
                drop(q);
                for job in due {
                    job();
                }
                q = lock.lock().unwrap();
                continue;
            }
            q = match q.timed.peek() {
                Some(Reverse((deadline, _))) => {
                    let wait = deadline.saturating_duration_since(now);
                    cv.wait_timeout(q, wait).unwrap().0
                }
                None => cv.wait(q).unwrap(),
            };
        }
    }
}
