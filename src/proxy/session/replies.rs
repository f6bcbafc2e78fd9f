//! The session's reply FIFO: one entry owed per request, in request order, each metered
//! (`walrus_commands_total`, `walrus_command_duration_seconds`) as it leaves.

use super::*;

/// A reply owed to the client, in request order. Every one comes through a channel, even
/// one walrus gives itself ([`Session::queue`]), so that each counts against the client's
/// output limit the same way.
pub(super) struct Owed {
    pub(super) reply: oneshot::Receiver<Bytes>,
    pub(super) meter: Option<Meter>,
    /// The reply of a command that may block (BLPOP, XREAD ... BLOCK, WAIT): what the
    /// session sends after it on the same connection runs only once it is served.
    pub(super) blocking: bool,
    /// The reply of `INFO`: its Persistence section is walrus's ([`crate::proxy::info`]).
    pub(super) info: Option<Arc<crate::proxy::info::Persistence>>,
}

impl Owed {
    /// The reply as the client gets it.
    fn finish(&self, reply: Bytes) -> Bytes {
        match &self.info {
            Some(p) => p.rewrite(reply),
            None => reply,
        }
    }
}

/// Counts a command's reply in `walrus_commands_total` and its latency in
/// `walrus_command_duration_seconds`; atomics only.
#[derive(Clone)]
pub(super) struct Meter {
    /// The request's entry in the command table, looked up once for metering, routing and
    /// the durability gate.
    pub(super) command: Option<Arc<crate::commands::CommandInfo>>,
    arrived: std::time::Instant,
}

impl Meter {
    pub(super) fn new(command: Option<Arc<crate::commands::CommandInfo>>) -> Meter {
        Meter {
            command,
            arrived: std::time::Instant::now(),
        }
    }

    fn done(&self, reply: &[u8]) {
        if reply.is_empty() {
            return; // dropped past the client's output limit: the client is closed unanswered
        }
        let counters = match &self.command {
            Some(info) => &info.counters,
            None => &*metrics::OTHER_COMMANDS,
        };
        counters.count(reply);
        counters.observe(self.arrived.elapsed().as_secs_f64());
    }
}

pub(super) async fn next_reply(pending: &mut VecDeque<Owed>, output: &ClientOutput) -> Bytes {
    let front = pending
        .front_mut()
        .expect("guarded by the select condition");
    received(output, (&mut front.reply).await)
}

/// A reply out of its channel, no longer counted as waiting there; or, for one that will
/// never come (its upstream connection broke), the error that says so.
pub(super) fn received<E>(output: &ClientOutput, reply: Result<Bytes, E>) -> Bytes {
    match reply {
        Ok(b) => {
            output.taken(b.len());
            b
        }
        Err(_) => pipeline::lost_reply(),
    }
}

impl Session {
    /// Pops the front reply if it has already arrived.
    pub(super) fn ready_front(&mut self) -> Option<Bytes> {
        let r = match self.pending.front_mut()?.reply.try_recv() {
            Err(oneshot::error::TryRecvError::Empty) => return None,
            r => received(&self.output, r),
        };
        Some(self.settled(r))
    }

    /// The front reply is ready: it leaves the queue, metered, and widens the client's
    /// window while its output keeps up. Returns it as the client gets it.
    pub(super) fn settled(&mut self, reply: Bytes) -> Bytes {
        if self.out.len() < OUTPUT_PAUSE_BYTES {
            self.window = (self.window + 1).min(self.shared.max_pipeline_requests);
        }
        self.largest_reply = reply
            .len()
            .max(self.largest_reply - self.largest_reply / 64);
        let Some(owed) = self.pending.pop_front() else {
            return reply;
        };
        if let Some(meter) = &owed.meter {
            meter.done(&reply);
        }
        owed.finish(reply)
    }

    /// A reply owed to a command that may still be blocked (BLPOP q 0): what follows it on
    /// the same connection waits until it is served.
    pub(super) fn behind_blocking(&self) -> bool {
        self.pending.iter().any(|o| o.blocking)
    }

    /// Queues a reply for the request being handled.
    pub(super) fn owe(&mut self, reply: Pending) {
        self.queue(reply, self.meter.clone(), self.blocking_request);
        if self.command().is_some_and(|c| c.name == "info") {
            let owed = self.pending.back_mut().expect("queued");
            owed.info = self.shared.persistence.clone();
        }
    }

    /// Queues a reply. One walrus gives itself goes through a channel too, so that it counts
    /// against the client's output limit as Valkey's replies do (`CLIENT GETNAME` can be as
    /// long as a name).
    pub(super) fn queue(&mut self, reply: Pending, meter: Option<Meter>, blocking: bool) {
        let reply = match reply {
            Pending::Ready(b) => {
                let (tx, rx) = self.reply_channel();
                tx.send(b);
                rx
            }
            Pending::Wait(rx) => rx,
        };
        self.pending.push_back(Owed {
            reply,
            meter,
            blocking,
            info: None,
        });
    }

    /// Waits for a reply the session itself needs (a barrier's, a probe's).
    pub(super) async fn wait(&self, reply: Pending) -> Bytes {
        match reply {
            Pending::Ready(b) => b,
            Pending::Wait(rx) => received(&self.output, rx.await),
        }
    }

    /// Moves the replies that have arrived, in order, to the client's output, and writes
    /// what its socket takes now. Stops at the client's output limit: the session then
    /// closes the client.
    pub(super) fn take_ready(&mut self) -> std::io::Result<()> {
        while self.output.unwritten(self.out.len()) {
            let Some(r) = self.ready_front() else { break };
            self.out.extend_from_slice(&r);
        }
        self.write_ready()
    }

    /// Writes what the client's socket takes now, without waiting; the rest waits for the
    /// socket to be writable. Once nothing is left or owed, the buffer is released.
    pub(super) fn write_ready(&mut self) -> std::io::Result<()> {
        let written = loop {
            if self.out.is_empty() {
                break Ok(());
            }
            match self.wr.try_write(&self.out) {
                Ok(n) => bytes::Buf::advance(&mut self.out, n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        // Released when nothing is left to write, and a buffer a burst grew large is not
        // kept for what comes next.
        if self.out.is_empty()
            && (self.pending.is_empty() || self.out.capacity() > OUTPUT_PAUSE_BYTES)
        {
            self.out = BytesMut::new();
        }
        self.output.unwritten(self.out.len());
        written
    }

    pub(super) async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() || self.wr.unflushed() {
            self.wr.send_all(&self.out).await?;
            self.out.clear();
            self.output.unwritten(0);
        }
        Ok(())
    }

    /// Waits for every pending reply and takes it into the client's output: the barrier
    /// before anything that changes which upstream connection the client's next command runs
    /// on (it must run after them). It waits for Valkey and the journal, never for the
    /// client, who may be sending more before it reads: replies are written as its socket
    /// takes them, here and then by the session's loop, within its output limit (past it,
    /// this fails and the session closes the client).
    pub(super) async fn drain(&mut self) -> std::io::Result<()> {
        while let Some(mut owed) = self.pending.pop_front() {
            let reply = received(&self.output, (&mut owed.reply).await);
            if let Some(meter) = &owed.meter {
                meter.done(&reply);
            }
            let reply = owed.finish(reply);
            self.out.extend_from_slice(&reply);
            self.write_ready()?;
            if self.output.over() {
                return Err(std::io::Error::other("over proxy.max_output_bytes"));
            }
        }
        Ok(())
    }
}
