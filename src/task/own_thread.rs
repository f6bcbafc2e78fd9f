//! A tokio runtime on a thread of its own, for background work that must not take the
//! proxy's workers (by default one: `proxy.worker_threads`).

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// A current-thread runtime on its own named thread. Tasks spawned on [`OwnThread::handle`]
/// run there, and so do the connections and timers they start. [`OwnThread::stop`] ends it
/// once its blocking work is done; dropped instead, it ends without being waited for.
pub struct OwnThread {
    handle: Handle,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl OwnThread {
    pub async fn start(name: &str) -> std::io::Result<OwnThread> {
        let (built, handle) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread_name = name.to_string();
        // The runtime is built and dropped on its thread: a runtime dropped on the caller's
        // (should the spawn fail) would panic there, inside the proxy's runtime.
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let rt = match Builder::new_current_thread()
                    .enable_all()
                    .thread_name(thread_name)
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = built.send(Err(e));
                        return;
                    }
                };
                let _ = built.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stopped.await;
                });
                // Dropping the runtime here waits for its blocking tasks.
            })?;
        let handle = handle.await.map_err(|_| {
            std::io::Error::other("the thread ended before its runtime was built")
        })??;
        Ok(OwnThread {
            handle,
            stop,
            thread,
        })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Ends the thread: its tasks are dropped, its blocking work (a file being written, the
    /// journal being read) runs to its end, then the thread is joined.
    pub async fn stop(self) {
        let OwnThread { stop, thread, .. } = self;
        drop(stop);
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_task_runs_on_the_named_thread_and_ends_with_it() {
        let own = OwnThread::start("walrus-test-own").await.unwrap();
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

    #[tokio::test]
    async fn stop_returns_after_the_threads_blocking_work() {
        let own = OwnThread::start("walrus-test-stop").await.unwrap();
        // The blocking work can end only once the thread's tasks are dropped, which `stop`
        // starts: a `stop` that did not wait for it would return before it ended.
        struct Release(std::sync::mpsc::Sender<()>);
        impl Drop for Release {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let (release, go) = std::sync::mpsc::channel::<()>();
        let guard = Release(release);
        own.handle().spawn(async move {
            let _held = guard;
            std::future::pending::<()>().await
        });
        let finished = Arc::new(AtomicBool::new(false));
        let f = finished.clone();
        own.handle().spawn_blocking(move || {
            let _ = go.recv();
            f.store(true, Ordering::SeqCst);
        });
        own.stop().await;
        assert!(finished.load(Ordering::SeqCst));
    }
}
