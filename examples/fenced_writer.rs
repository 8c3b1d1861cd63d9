//! Takes a lock, then writes one value under its fencing token when told to: a writer to pause.
//!
//!     REDIS_URL=redis://127.0.0.1:6379/ cargo run --example fenced_writer -- redis KEY [LEASE_MS]
//!     DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!         cargo run --example fenced_writer -- postgres KEY [LEASE_MS]
//!
//! Locks `KEY` (lease 30 s unless given), prints `token N`, then waits for one line on standard
//! input and writes that line with token N: to the `FencedRedis` resource `KEY`, or to the `body`
//! of row `KEY` in the table `FENCED_TABLE` (default `fenced_documents`, as made by the
//! `fenced_postgres` example) with the conditional `UPDATE` of that example. Prints `accepted`,
//! or `rejected: ...` with both tokens. `FENCELOCK_NAMESPACE` sets the namespace of the lock and
//! of the Redis store.
//!
//! It does not look at `is_held()` before writing, on purpose: it stands for a writer that
//! passed that check and then stalled. Stop it with SIGSTOP (`kill -STOP`) after `token N`, let
//! another process take the lock and write, resume it (`kill -CONT`), enter a line: the storage
//! refuses the stale write. The test suite does exactly this.

use std::io::BufRead;
use std::time::Duration;

use fencelock::{FencedRedis, FencingToken, LockClient};

const USAGE: &str = "usage: fenced_writer redis|postgres KEY [LEASE_MS]";

enum Store {
    Redis(FencedRedis),
    Postgres {
        db: Box<postgres::Client>,
        table: String,
    },
}

impl Store {
    /// Writes `value` under `token`: `Ok(None)` if accepted, `Ok(Some(why))` if refused.
    fn write(
        &mut self,
        key: &str,
        token: FencingToken,
        value: &str,
    ) -> Result<Option<String>, Box<dyn std::error::Error>> {
        match self {
            Store::Redis(store) => match store.set(key, token, value) {
                Ok(()) => Ok(None),
                Err(e) if e.is_stale_token() => Ok(Some(e.to_string())),
                Err(e) => Err(e.into()),
            },
            Store::Postgres { db, table } => {
                let fence = token.as_i64()?;
                let update = format!(
                    "UPDATE {table} SET body = $1, fence = $2 WHERE id = $3 AND fence <= $2"
                );
                if db.execute(&update, &[&value, &fence, &key])? == 1 {
                    return Ok(None);
                }
                let select = format!("SELECT fence FROM {table} WHERE id = $1");
                Ok(Some(match db.query_opt(&select, &[&key])? {
                    Some(row) => format!(
                        "stale fencing token {token} for row {key:?}: its fence is {}",
                        row.get::<_, i64>(0)
                    ),
                    None => format!("no row {key:?} in {table}"),
                }))
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let kind = args.next().ok_or(USAGE)?;
    let key = args.next().ok_or(USAGE)?;
    let lease_ms: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(30_000);
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let namespace = std::env::var("FENCELOCK_NAMESPACE").unwrap_or_else(|_| "fencelock".into());

    let mut store = match kind.as_str() {
        "redis" => Store::Redis(FencedRedis::open(&redis_url)?.with_namespace(&namespace)?),
        "postgres" => {
            let url = std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            let table = std::env::var("FENCED_TABLE").unwrap_or_else(|_| "fenced_documents".into());
            let plain_name = table.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && table
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !plain_name {
                return Err(format!("FENCED_TABLE {table:?} is not a plain table name").into());
            }
            let db = postgres::Client::connect(&url, postgres::NoTls).map_err(|e| {
                let cause =
                    std::error::Error::source(&e).map_or_else(String::new, |c| format!(": {c}"));
                format!("cannot connect to PostgreSQL at {url}: {e}{cause}")
            })?;
            Store::Postgres {
                db: Box::new(db),
                table,
            }
        }
        _ => return Err(USAGE.into()),
    };

    let locks = LockClient::builder(redis_url)
        .namespace(namespace)
        .lease(Duration::from_millis(lease_ms))
        .build()?;
    let guard = locks.lock(&key)?;
    let token = guard.token();
    println!("token {token}");

    let Some(line) = std::io::stdin().lock().lines().next().transpose()? else {
        return Ok(()); // standard input closed: nothing to write
    };
    match store.write(&key, token, &line)? {
        None => println!("accepted"),
        Some(why) => println!("rejected: {why}"),
    }
    match guard.unlock() {
        Ok(()) => println!("released"),
        Err(e) if e.is_lock_lost() => println!("lost"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
