//! Where the storage's statements run: on a pool that reaches PostgreSQL directly (a session per
//! connection), or on one that goes through a transaction-mode pooler, such as PgBouncer with
//! `pool_mode = transaction`, which hands each transaction to whichever server connection is free.
//!
//! Behind such a pooler, two things sqlx does by default break:
//! - it names and caches prepared statements; a named statement lives on one server connection,
//!   and the next transaction may run on another (where it is missing) or on one where another
//!   client already prepared the same name;
//! - it prepares (Parse, Describe, Sync) and executes (Bind, Execute, Sync) in two exchanges;
//!   outside a transaction the pooler may send the second to a server that never saw the first.
//!
//! So in pooler mode every statement is sent unnamed (never cached) and runs inside a transaction:
//! the caller's, or one of its own (`PoolStatements`). That costs a BEGIN and a COMMIT round trip
//! per statement, which is why it is a mode and not the default. Statements without parameters may
//! go as a simple query (one exchange), which needs neither.

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::Describe;
use sqlx::{Either, Execute, Executor, PgConnection, PgPool, Postgres};

/// How a pool reaches PostgreSQL.
#[derive(Clone, Debug, Default)]
pub(crate) enum Pooling {
    /// Directly: each pooled connection is a server session.
    #[default]
    Direct,
    /// Through a transaction-mode pooler. `session` reaches the server directly, for what needs a
    /// session of its own (LISTEN, the maintenance leader's lock); none means those are off.
    TransactionPooler { session: Option<PgPool> },
}

/// A statement sent unnamed: prepared for this one execution, never cached on the connection.
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(&self) -> &'q str {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement<'q>> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

/// The storage's pool as an executor: behind a transaction pooler, each statement runs unnamed in
/// a transaction of its own (its rows are collected before the commit).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolStatements<'p> {
    pub(crate) pool: &'p PgPool,
    pub(crate) pooler: bool,
}

impl<'p> Executor<'p> for PoolStatements<'p> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooler {
            return self.pool.fetch_many(query);
        }
        let pool = self.pool;
        stream::once(async move {
            let mut tx = pool.begin().await?;
            let items: Vec<_> = (&mut *tx).fetch_many(Unnamed(query)).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(stream::iter(items.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooler {
            return self.pool.fetch_optional(query);
        }
        let pool = self.pool;
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let row = (&mut *tx).fetch_optional(Unnamed(query)).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'p: 'e,
    {
        if self.pooler {
            return Box::pin(async { Err(named_statement_refused()) });
        }
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        if self.pooler {
            return Box::pin(async { Err(named_statement_refused()) });
        }
        self.pool.describe(sql)
    }
}

/// The storage never prepares a statement to keep: behind a transaction pooler it would be
/// prepared on one server connection, outside any transaction, and looked up on another.
fn named_statement_refused() -> sqlx::Error {
    sqlx::Error::Configuration(
        "behind a transaction pooler, ringwork runs no prepared statement outside a transaction"
            .into(),
    )
}

/// A caller's connection as an executor: behind a transaction pooler, statements go unnamed. The
/// caller keeps them inside a transaction: the storage's insert checks and opens one if needed;
/// the other calls that take a connection (`pending_jobs`, `complete_on`, the test kit's
/// `enqueued`) say so. (Opening one here could commit a transaction the caller began with a raw
/// `BEGIN`, which sqlx does not see.)
#[derive(Debug)]
pub(crate) struct ConnStatements<'c> {
    pub(crate) conn: &'c mut PgConnection,
    pub(crate) pooler: bool,
}

impl<'c> Executor<'c> for ConnStatements<'c> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if self.pooler {
            self.conn.fetch_many(Unnamed(query))
        } else {
            self.conn.fetch_many(query)
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if self.pooler {
            self.conn.fetch_optional(Unnamed(query))
        } else {
            self.conn.fetch_optional(query)
        }
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.conn.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.conn.describe(sql)
    }
}
