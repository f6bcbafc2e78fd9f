//! What walrus's tasks share: a guard that ends a helper task with its owner
//! ([`AbortOnDrop`]), the waits between retries ([`backoff::Backoff`]), a runtime on a
//! thread of its own for background work ([`own_thread::OwnThread`]), and file-system work
//! kept off the proxy's threads ([`off_worker`]). A leaf: it imports nothing of walrus.

pub mod backoff;
pub mod own_thread;

/// Aborts a helper task when its owner is done, however it ends.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `f` on tokio's blocking threads and waits for it there. For file-system calls made
/// while walrus serves: on a volume that stops answering (a network file system whose server
/// went away) even a `stat`, an `unlink` or a path's lookup waits, and on the proxy's worker
/// (one on two cores) it would stop every client, `/healthz` and the stop with it. A panic in
/// `f` comes back as an error.
pub async fn off_worker<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)?
}
