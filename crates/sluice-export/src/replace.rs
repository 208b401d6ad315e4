//! Getting a new direct queue after one failed (the NBD run-to-completion
//! connections and the io_uring FUSE ring): a task tries again and again,
//! pausing [`PAUSE_FIRST`] and doubling up to [`PAUSE_MAX`] (a target that
//! restarted gives one once the controller has reconnected), hands what it
//! got to its owner through a channel and wakes it. It gives up when the
//! owner is gone.

use std::future::Future;
use std::sync::{mpsc, Weak};
use std::time::Duration;

pub(crate) const PAUSE_FIRST: Duration = Duration::from_millis(50);
pub(crate) const PAUSE_MAX: Duration = Duration::from_secs(2);

/// Spawns the task on `rt`. `attempt` returns `None` for "not yet";
/// `owner` is the owner's wake-up, called through `wake` once the value is
/// in the channel; the task ends when `owner` is dropped.
pub(crate) fn spawn<T, W, F, Fut>(
    rt: &tokio::runtime::Handle,
    owner: Weak<W>,
    wake: fn(&W),
    mut attempt: F,
) -> mpsc::Receiver<T>
where
    T: Send + 'static,
    W: Send + Sync + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Option<T>> + Send,
{
    let (tx, rx) = mpsc::channel();
    rt.spawn(async move {
        let mut pause = PAUSE_FIRST;
        loop {
            tokio::time::sleep(pause).await;
            if owner.strong_count() == 0 {
                return;
            }
            if let Some(v) = attempt().await {
                if tx.send(v).is_ok() {
                    if let Some(w) = owner.upgrade() {
                        wake(&w);
                    }
                }
                return;
            }
            pause = (pause * 2).min(PAUSE_MAX);
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn it_retries_with_growing_pauses_then_hands_over_and_wakes() {
        let woken = Arc::new(AtomicU32::new(0));
        let tries = Arc::new(AtomicU32::new(0));
        let t = tries.clone();
        let rx = spawn(
            &tokio::runtime::Handle::current(),
            Arc::downgrade(&woken),
            |w| {
                w.fetch_add(1, Ordering::Relaxed);
            },
            move || {
                let n = t.fetch_add(1, Ordering::Relaxed) + 1;
                async move { (n == 4).then_some(n) }
            },
        );
        let start = tokio::time::Instant::now();
        while woken.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(rx.try_recv(), Ok(4));
        // 50 + 100 + 200 + 400 ms of pauses before the fourth attempt.
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(750) && waited < Duration::from_millis(800),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn it_gives_up_when_the_owner_is_gone() {
        let owner = Arc::new(());
        let tries = Arc::new(AtomicU32::new(0));
        let t = tries.clone();
        let rx = spawn(
            &tokio::runtime::Handle::current(),
            Arc::downgrade(&owner),
            |_| {},
            move || {
                t.fetch_add(1, Ordering::Relaxed);
                async { None::<u32> }
            },
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(owner);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let n = tries.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            tries.load(Ordering::Relaxed),
            n,
            "no attempts after the owner left"
        );
        assert!(rx.try_recv().is_err());
    }
}
