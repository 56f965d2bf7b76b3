//! Small concurrency tools every layer uses, the vocabulary's and the state's alike (DESIGN §5,
//! all protocols): a std mutex that
//! survives poisoning, joining futures on one task, and the identity of a live pooled
//! connection.

use std::sync::{Arc, Mutex, Weak};

/// A boxed, sendable future: what work passed to [`TenantHandle::run`](crate::TenantHandle::run)
/// returns (`|tx| Box::pin(async move { … })`).
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

use deadpool_postgres::{Object, StatementCache};

/// Which pooled connection an entry of per-connection bookkeeping belongs to: its statement
/// cache, which lives exactly as long as the connection (deadpool reuses object ids of
/// connections that went, so the id alone could name a newer one).
pub(crate) struct PooledConnection(Weak<StatementCache>);

impl PooledConnection {
    pub(crate) fn of(object: &Object) -> PooledConnection {
        PooledConnection(Arc::downgrade(&object.statement_cache))
    }

    /// Whether this is `object`'s connection, still open.
    pub(crate) fn is(&self, object: &Object) -> bool {
        self.0
            .upgrade()
            .is_some_and(|cache| Arc::ptr_eq(&cache, &object.statement_cache))
    }

    /// Whether the connection went (its entry can be forgotten).
    pub(crate) fn is_gone(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// Locks a std mutex, recovering the data if a panicking thread poisoned it: the maps it guards
/// are consistent after every single operation.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs futures concurrently on this task and waits for all (no extra dependency for it).
async fn join_all<F: std::future::Future<Output = ()>>(futures: impl Iterator<Item = F>) {
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

/// Runs `work` on each of `items`, `lanes` at a time, on this task: each lane takes the next
/// item when its last one is done (a slow item holds up one lane, not a whole batch).
pub(crate) async fn in_lanes<I, F, Fut>(items: I, lanes: usize, work: F)
where
    I: IntoIterator,
    F: Fn(I::Item) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let queue = Mutex::new(items.into_iter());
    let lane = || async {
        loop {
            let next = lock(&queue).next();
            let Some(item) = next else { return };
            work(item).await;
        }
    };
    join_all((0..lanes).map(|_| lane())).await;
}
