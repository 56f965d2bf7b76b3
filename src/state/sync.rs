//! Small concurrency tools every layer uses (DESIGN §5, all protocols): a std mutex that
//! survives poisoning, and joining futures on one task.

use std::sync::Mutex;

/// Locks a std mutex, recovering the data if a panicking thread poisoned it: the maps it guards
/// are consistent after every single operation.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs futures concurrently on this task and waits for all (no extra dependency for it).
pub(crate) async fn join_all<F: std::future::Future<Output = ()>>(
    futures: impl Iterator<Item = F>,
) {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}
