//! What walrus's tasks share: a guard that ends a helper task with its owner
//! ([`AbortOnDrop`]), the waits between retries ([`backoff::Backoff`]), and a runtime on a
//! thread of its own for background work ([`own_thread::OwnThread`]). A leaf: it imports
//! nothing of walrus.

pub mod backoff;
pub mod own_thread;

/// Aborts a helper task when its owner is done, however it ends.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
