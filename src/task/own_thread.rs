//! A tokio runtime on a thread of its own, for background work that must not take the
//! proxy's workers (by default one: [`crate`]'s `proxy.worker_threads`).

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// A current-thread runtime on its own named thread. Tasks spawned on [`OwnThread::handle`]
/// run there, and so do the connections and timers they start. Dropping it ends the thread,
/// and with it any task still running there.
pub struct OwnThread {
    handle: Handle,
    _stop: oneshot::Sender<()>,
}

impl OwnThread {
    pub fn start(name: &str) -> std::io::Result<OwnThread> {
        let rt = Builder::new_current_thread()
            .enable_all()
            .thread_name(name)
            .build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Returns when the sender is dropped; the runtime drops its tasks after.
                rt.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(OwnThread {
            handle,
            _stop: stop,
        })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_runs_on_the_named_thread_and_ends_with_it() {
        let own = OwnThread::start("walrus-test-own").unwrap();
        let name = own
            .handle()
            .spawn(async { std::thread::current().name().map(str::to_owned) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("walrus-test-own"));
        let pending = own.handle().spawn(std::future::pending::<()>());
        drop(own);
        assert!(pending.await.unwrap_err().is_cancelled());
    }
}
