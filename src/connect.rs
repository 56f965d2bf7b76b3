//! How pgtenant opens connections of its own (the lease session, the pooler probe, the default
//! data-path pool, cancel requests): without TLS by default, or with the application's TLS
//! connector ([`RouterOptions::tls`](crate::RouterOptions::tls)). The connector's type is erased
//! here so that the options and the router stay free of type parameters.

use std::sync::Arc;
use std::task::{Context, Poll};

use deadpool_postgres::{Manager, ManagerConfig};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config, Socket};

use crate::handle::BoxFuture;

/// Drives a connection and yields its notices and notifications; `None` once it ended.
pub(crate) type Messages = Box<
    dyn FnMut(&mut Context<'_>) -> Poll<Option<Result<AsyncMessage, tokio_postgres::Error>>> + Send,
>;

type Connect = dyn Fn(Config) -> BoxFuture<'static, Result<(Client, Messages), tokio_postgres::Error>>
    + Send
    + Sync;
type MakeManager = dyn Fn(Config, ManagerConfig) -> Manager + Send + Sync;
type Cancel =
    dyn Fn(CancelToken) -> BoxFuture<'static, Result<(), tokio_postgres::Error>> + Send + Sync;

/// One TLS setting, for every connection pgtenant opens.
#[derive(Clone)]
pub(crate) struct Connector {
    connect: Arc<Connect>,
    manager: Arc<MakeManager>,
    cancel: Arc<Cancel>,
    /// For `Debug`: the connector's type name.
    name: &'static str,
}

impl Connector {
    pub(crate) fn new<T>(tls: T) -> Connector
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + Sync + 'static,
        T::TlsConnect: Send + Sync,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let for_connect = tls.clone();
        let for_manager = tls.clone();
        Connector {
            connect: Arc::new(move |config: Config| {
                let tls = for_connect.clone();
                Box::pin(async move {
                    let (client, mut connection) = config.connect(tls).await?;
                    let messages: Messages = Box::new(move |cx| connection.poll_message(cx));
                    Ok((client, messages))
                })
            }),
            manager: Arc::new(move |config, manager_config| {
                Manager::from_config(config, for_manager.clone(), manager_config)
            }),
            cancel: Arc::new(move |token: CancelToken| {
                let tls = tls.clone();
                Box::pin(async move { token.cancel_query(tls).await })
            }),
            name: std::any::type_name::<T>(),
        }
    }

    /// Connects; the caller must drive the returned [`Messages`] until it yields `None`.
    pub(crate) async fn connect(
        &self,
        config: Config,
    ) -> Result<(Client, Messages), tokio_postgres::Error> {
        (self.connect)(config).await
    }

    /// A deadpool manager whose connections use this TLS setting.
    pub(crate) fn manager(&self, config: Config, manager_config: ManagerConfig) -> Manager {
        (self.manager)(config, manager_config)
    }

    /// Sends a cancel request for the query running on `token`'s connection.
    pub(crate) async fn cancel(&self, token: CancelToken) -> Result<(), tokio_postgres::Error> {
        (self.cancel)(token).await
    }
}

impl Default for Connector {
    fn default() -> Connector {
        Connector::new(tokio_postgres::NoTls)
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Drives `messages` to the end, dropping what it yields (for connections that LISTEN to
/// nothing).
pub(crate) async fn drive(mut messages: Messages) {
    while std::future::poll_fn(|cx| messages(cx)).await.is_some() {}
}
