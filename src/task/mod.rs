//! What walrus's tasks share: a guard that ends a helper task with its owner
//! ([`AbortOnDrop`]), and the waits between retries ([`backoff::Backoff`]). A leaf: it
//! imports nothing of walrus.

pub mod backoff;

/// Aborts a helper task when its owner is done, however it ends.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
