//! Orphaned write marks settled: a mark dropped before its write was settled
//! ([`super::marks`]) keeps its keys dirty until Valkey's replication offset, asked with
//! backoff, says where the write ran, if at all.

use super::marks::Orphan;
use super::Durability;
use crate::task::backoff::Backoff;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Settles orphaned marks for as long as `orphans` is open. `offset` asks Valkey's
/// replication offset now (walrus's control connection); every write an orphan stands for
/// was sent before the orphan was made, so it ran before that offset, if at all.
pub async fn resolve_orphans<F, Fut>(
    d: Arc<Durability>,
    mut orphans: mpsc::UnboundedReceiver<Orphan>,
    offset: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<u64>>,
{
    let orphans_tx = d.orphans.clone();
    while let Some(first) = orphans.recv().await {
        let mut pending = vec![first];
        let mut backoff = Backoff::default();
        loop {
            while let Ok(o) = orphans.try_recv() {
                pending.push(o);
            }
            let epoch = d.epoch();
            let (current, stale): (Vec<Orphan>, Vec<Orphan>) =
                pending.into_iter().partition(|o| o.epoch == epoch);
            d.cancel_write(
                stale
                    .into_iter()
                    .map(|o| o.into_mark(&orphans_tx))
                    .collect(),
            );
            if current.is_empty() {
                break;
            }
            match offset().await {
                Some(at) => {
                    let marks = current
                        .into_iter()
                        .map(|o| o.into_mark(&orphans_tx))
                        .collect();
                    // A restore in between makes the gate refuse this epoch: the marks clear.
                    d.settle_batch(at, epoch, Vec::new(), marks);
                    break;
                }
                None => {
                    tracing::warn!(
                        writes = current.len(),
                        "cannot learn Valkey's replication offset for writes whose outcome is unknown; their keys stay dirty, asking again in {:?}",
                        backoff.delay()
                    );
                    pending = current;
                    tokio::time::sleep(backoff.advance()).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::dirty::Scope;
    use crate::durability::Held;
    use bytes::Bytes;
    use std::sync::Mutex;

    fn key(k: &str) -> Scope {
        Scope::Keys {
            db: 0,
            keys: vec![Bytes::copy_from_slice(k.as_bytes())],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_orphan_stays_dirty_until_valkeys_offset_is_known_and_durable() {
        let d = Arc::new(Durability::new(1 << 20, 1 << 20));
        d.attach("p", 0, true, true, 0);
        // A request dropped with its mark (its connection broke): the write may have run.
        drop(d.begin_write(key("a")).unwrap());
        // Valkey's offset is unknown twice; the third answer settles the mark at 100.
        let answers = Arc::new(Mutex::new(vec![None, None, Some(100)]));
        let orphans = d.take_orphans().unwrap();
        tokio::spawn(resolve_orphans(d.clone(), orphans, move || {
            let a = answers.clone();
            async move { a.lock().unwrap().remove(0) }
        }));
        // Settling records the batch's offset as executed. (Time is paused: the resolver's
        // backoff sleeps pass as soon as every task waits.)
        while d.snapshot().1 != 100 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let (tx, mut rx) =
            crate::durability::reply_channel(&crate::durability::ClientOutput::unlimited());
        d.read_reply(
            &key("a"),
            d.epoch(),
            Held::new(tx, Bytes::from_static(b"$1\r\nv\r\n")),
        );
        assert!(
            rx.try_recv().is_err(),
            "held while the write may not be durable"
        );
        d.set_durable(99);
        assert!(rx.try_recv().is_err());
        d.set_durable(100);
        assert_eq!(&rx.try_recv().unwrap()[..], b"$1\r\nv\r\n");
    }
}
