//! The fencing pattern for SQL, on PostgreSQL: a `fence` column and a conditional `UPDATE`.
//!
//! Holder A takes the lock and stalls before writing; B takes the lock over, with a higher
//! fencing token, and writes the row; then A wakes up and writes with its old token. The
//! `UPDATE` matches zero rows for A, so B's row stays.
//!
//! Connects to `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and works in a
//! temporary table, `fenced_documents`, which it drops at the end; PostgreSQL drops it anyway
//! when the connection closes, however the example ends, so nothing is left behind. Takes its
//! locks on `REDIS_URL` when set; otherwise it starts a throwaway `redis-server`.
//!
//!     cargo run --example fenced_postgres

#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;

use std::time::Duration;

use fencelock::{FencingToken, LockClient};
use postgres::{Client, NoTls};

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Every guarded table gets a `fence` column: the highest token that wrote the row. (`TEMP`
/// only because this is a demonstration: the table lives as long as this connection, and no
/// other session sees it. A real table is created the same way without it.)
const SCHEMA: &str = "
    CREATE TEMP TABLE fenced_documents (
        id    text   PRIMARY KEY,
        body  text   NOT NULL,
        fence bigint NOT NULL DEFAULT 0
    );
    INSERT INTO fenced_documents (id, body) VALUES ('report', 'draft');
";

/// What became of one fenced write.
enum Write {
    Accepted,
    /// A newer holder has written the row: its fence is higher than our token.
    Stale {
        fence: i64,
    },
}

/// The pattern to copy: the row takes the write, and the token, only if no higher token wrote
/// it. The check and the write are one statement, so nothing can come in between; under READ
/// COMMITTED a concurrent writer's `UPDATE` waits for the row lock and then re-checks `fence`
/// against the row as that writer left it.
fn fenced_update(
    db: &mut Client,
    id: &str,
    body: &str,
    token: FencingToken,
) -> Result<Write, Box<dyn std::error::Error>> {
    // Every granted token fits a bigint: fence counters are Redis integers, signed 64-bit.
    let token = token.as_i64()?;
    let updated = db.execute(
        "UPDATE fenced_documents SET body = $1, fence = $2 WHERE id = $3 AND fence <= $2",
        &[&body, &token, &id],
    )?;
    if updated == 1 {
        return Ok(Write::Accepted);
    }
    // Zero rows: a newer token wrote the row, or there is no such row. They call for different
    // fixes, so look.
    match db.query_opt("SELECT fence FROM fenced_documents WHERE id = $1", &[&id])? {
        Some(row) => Ok(Write::Stale { fence: row.get(0) }),
        None => Err(format!("no row {id:?} in fenced_documents").into()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned());
    let mut db = Client::connect(&database_url, NoTls).map_err(|e| {
        let cause = std::error::Error::source(&e).map_or_else(String::new, |c| format!(": {c}"));
        format!(
            "cannot connect to PostgreSQL at {database_url} ({e}{cause}); \
             start it or set DATABASE_URL"
        )
    })?;
    db.batch_execute(SCHEMA)?;
    println!("using {database_url}: created temporary table fenced_documents with row 'report'");
    let outcome = demonstrate(&mut db);
    // On success and on error alike; if the process dies first, closing the connection does it.
    let dropped = db.batch_execute("DROP TABLE IF EXISTS fenced_documents");
    outcome?;
    dropped?;
    println!("dropped table fenced_documents");
    Ok(())
}

/// A and B take turns on the lock; A's late write is refused.
fn demonstrate(db: &mut Client) -> Result<(), Box<dyn std::error::Error>> {
    let (redis_url, _server) = throwaway_redis::redis_url()?;
    let locks = LockClient::builder(redis_url.as_str())
        .namespace("fenced-example")
        .lease(Duration::from_secs(5))
        .build()?;

    let a = locks.lock("report")?;
    let token_a = a.token();
    println!("A holds 'report' with token {token_a}, and stalls before writing");
    // A real stall outlives the lease and Redis expires the lock; releasing it here has the same
    // effect without the wait.
    a.unlock()?;

    let b = locks.lock("report")?;
    let token_b = b.token();
    for body in ["final, by B", "final and signed, by B"] {
        match fenced_update(db, "report", body, token_b)? {
            Write::Accepted => println!("B writes {body:?} with token {token_b}: accepted"),
            Write::Stale { fence } => println!("B's write: rejected, fence is {fence}"),
        }
    }
    b.unlock()?;

    println!("A wakes up and writes with its old token {token_a}");
    match fenced_update(db, "report", "final, by A", token_a)? {
        Write::Accepted => return Err("the stale write was accepted".into()),
        // What the application does: give up this piece of work. Retrying with the same token
        // can never succeed; if the work still has to happen, take the lock again (a new token),
        // re-read the row and start over.
        Write::Stale { fence } => println!(
            "A's write: rejected: token {token_a} is lower than the row's fence {fence}; \
             A drops its work"
        ),
    }

    let row = db.query_one(
        "SELECT body, fence FROM fenced_documents WHERE id = 'report'",
        &[],
    )?;
    let (body, fence): (String, i64) = (row.get(0), row.get(1));
    println!("stored: {body:?} at fence {fence}");
    Ok(())
}
