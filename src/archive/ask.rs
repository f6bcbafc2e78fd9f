//! Asking the checkpointer for a checkpoint on the archive's behalf, one request at a time:
//! the checkpointer takes every request it is sent as a checkpoint of its own, so a request
//! is not sent again while the last one is unanswered.

use crate::checkpoint::{CheckpointError, Request};
use std::sync::Mutex;
use tokio::sync::{mpsc, oneshot};

pub struct Asker {
    requests: mpsc::Sender<Request>,
    pending: Mutex<Option<oneshot::Receiver<Result<String, CheckpointError>>>>,
}

impl Asker {
    pub fn new(requests: mpsc::Sender<Request>) -> Asker {
        Asker {
            requests,
            pending: Mutex::new(None),
        }
    }

    /// Asks for a checkpoint, without awaiting it (it shows as a new local one), unless one
    /// asked for before is not answered yet. `true`: a request was sent.
    pub fn ask(&self) -> bool {
        let mut pending = self.pending.lock().expect("checkpoint request lock");
        if let Some(rx) = pending.as_mut() {
            if let Err(oneshot::error::TryRecvError::Empty) = rx.try_recv() {
                return false;
            }
        }
        let (answer, rx) = oneshot::channel();
        if self.requests.try_send(answer).is_err() {
            return false;
        }
        *pending = Some(rx);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_not_sent_again_until_the_last_one_is_answered() {
        let (tx, mut rx) = mpsc::channel(4);
        let asker = Asker::new(tx);
        assert!(asker.ask());
        let first = rx.try_recv().expect("asked");
        assert!(!asker.ask());
        assert!(rx.try_recv().is_err(), "asked again while unanswered");
        let _ = first.send(Ok("done".into()));
        assert!(asker.ask());
        // A request the checkpointer dropped unanswered counts as answered.
        drop(rx.try_recv().expect("asked after the answer"));
        assert!(asker.ask());
    }
}
