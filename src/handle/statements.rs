//! The statements of work run through a handle (DESIGN §5 "Fenced transaction", G7): the
//! driver's statement methods on [`Tx`] and [`TenantTransaction`], returning pgtenant's
//! [`Error`], so that an application's error type needs one conversion, `From<pgtenant::Error>`,
//! for everything it meets (`tx.execute(…).await?`, `TenantId::new(…)?`, `router.open(…)?`).
//!
//! Inherent methods win over those reached through `Deref`, so `tx.execute(…)` is this one
//! and the driver's own stays reachable as `(*tx).execute(…)`. Each runs the driver's method
//! unchanged and converts its error into [`Error::Database`] (context "tenant work"), whose
//! Display carries the server's SQLSTATE, message, detail and hint and whose
//! [`Error::sqlstate`] tells a unique violation (`23505`) from the rest. The streaming methods
//! (`query_raw`, `query_typed_raw`, `query_portal_raw`, `copy_in`, `copy_out`) are the
//! driver's, through `Deref`: their streams yield the driver's error
//! (`.map_err(pgtenant::Error::from)` converts it).

use tokio_postgres::types::{BorrowToSql, ToSql, Type};
use tokio_postgres::{Portal, Row, SimpleQueryMessage, Statement, ToStatement};

use crate::error::{Error, Result};
use crate::protocol::fenced_transaction::{TenantTransaction, Tx};

/// The driver's statement methods, each with its error converted; `$ty` derefs to the driver's
/// `Transaction`.
macro_rules! statements {
    ($ty:ty) => {
        impl $ty {
            /// The driver's `prepare`, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn prepare(&self, query: &str) -> Result<Statement> {
                (**self).prepare(query).await.map_err(Error::from)
            }

            /// The driver's `prepare_typed`, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn prepare_typed(&self, query: &str, types: &[Type]) -> Result<Statement> {
                (**self)
                    .prepare_typed(query, types)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `query`: every row, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn query<T>(
                &self,
                statement: &T,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Vec<Row>>
            where
                T: ?Sized + ToStatement,
            {
                (**self).query(statement, params).await.map_err(Error::from)
            }

            /// The driver's `query_one`: exactly one row, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`], also when the statement returned no row or several.
            pub async fn query_one<T>(
                &self,
                statement: &T,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Row>
            where
                T: ?Sized + ToStatement,
            {
                (**self)
                    .query_one(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `query_opt`: at most one row, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`], also when the statement returned several rows.
            pub async fn query_opt<T>(
                &self,
                statement: &T,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Option<Row>>
            where
                T: ?Sized + ToStatement,
            {
                (**self)
                    .query_opt(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `query_typed`: parameters with explicit types, no prepare round
            /// trip; with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn query_typed(
                &self,
                statement: &str,
                params: &[(&(dyn ToSql + Sync), Type)],
            ) -> Result<Vec<Row>> {
                (**self)
                    .query_typed(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `query_typed_one`, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`], also when the statement returned no row or several.
            pub async fn query_typed_one(
                &self,
                statement: &str,
                params: &[(&(dyn ToSql + Sync), Type)],
            ) -> Result<Row> {
                (**self)
                    .query_typed_one(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `query_typed_opt`, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`], also when the statement returned several rows.
            pub async fn query_typed_opt(
                &self,
                statement: &str,
                params: &[(&(dyn ToSql + Sync), Type)],
            ) -> Result<Option<Row>> {
                (**self)
                    .query_typed_opt(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `execute`: the number of rows affected, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn execute<T>(
                &self,
                statement: &T,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<u64>
            where
                T: ?Sized + ToStatement,
            {
                (**self)
                    .execute(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `execute_typed`, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn execute_typed(
                &self,
                statement: &str,
                params: &[(&(dyn ToSql + Sync), Type)],
            ) -> Result<u64> {
                (**self)
                    .execute_typed(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `execute_raw`, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn execute_raw<P, I, T>(&self, statement: &T, params: I) -> Result<u64>
            where
                T: ?Sized + ToStatement,
                P: BorrowToSql,
                I: IntoIterator<Item = P>,
                I::IntoIter: ExactSizeIterator,
            {
                (**self)
                    .execute_raw(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `bind`: a portal to read incrementally with
            /// [`query_portal`](Self::query_portal); with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn bind<T>(
                &self,
                statement: &T,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Portal>
            where
                T: ?Sized + ToStatement,
            {
                (**self).bind(statement, params).await.map_err(Error::from)
            }

            /// The driver's `bind_raw`, with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn bind_raw<P, T, I>(&self, statement: &T, params: I) -> Result<Portal>
            where
                T: ?Sized + ToStatement,
                P: BorrowToSql,
                I: IntoIterator<Item = P>,
                I::IntoIter: ExactSizeIterator,
            {
                (**self)
                    .bind_raw(statement, params)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `query_portal`: up to `max_rows` more rows of a portal (all of
            /// them for 0 or less), with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn query_portal(&self, portal: &Portal, max_rows: i32) -> Result<Vec<Row>> {
                (**self)
                    .query_portal(portal, max_rows)
                    .await
                    .map_err(Error::from)
            }

            /// The driver's `simple_query` (text protocol, several statements), with
            /// pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn simple_query(&self, query: &str) -> Result<Vec<SimpleQueryMessage>> {
                (**self).simple_query(query).await.map_err(Error::from)
            }

            /// The driver's `batch_execute` (several statements, no parameters, no rows),
            /// with pgtenant's error.
            ///
            /// # Errors
            /// [`Error::Database`] with the server's SQLSTATE, message, detail and hint.
            pub async fn batch_execute(&self, query: &str) -> Result<()> {
                (**self).batch_execute(query).await.map_err(Error::from)
            }
        }
    };
}

statements!(Tx<'_, '_>);
statements!(TenantTransaction<'_>);
