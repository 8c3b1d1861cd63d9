//! Fencing on PostgreSQL, the pattern of `examples/fenced_postgres.rs`: a `fence` column and
//! `UPDATE ... SET ..., fence = $token WHERE id = $id AND fence <= $token`.
//!
//! Needs PostgreSQL at `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`); each
//! test makes its own tables and drops them.

use std::sync::atomic::{AtomicU64, Ordering};

use fencelock::FencingToken;

use crate::support;
use crate::support::{database_url, lock_client, RedisServer};
use crate::takeover::{
    assert_never_decreasing, assert_only_late_writes_refused, run_writers, Takeover,
};

fn connect() -> postgres::Client {
    let url = database_url();
    postgres::Client::connect(&url, postgres::NoTls).unwrap_or_else(|e| {
        // postgres::Error's text leaves the cause (refused, auth, no database) to `source()`.
        let cause = std::error::Error::source(&e).map_or_else(String::new, |c| format!(": {c}"));
        panic!(
            "PostgreSQL is not reachable at {url}: {e}{cause}\n\
             These tests need it. Start it with \
             `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
             (`.ci/run` does, and installs it if missing), or set DATABASE_URL to one that runs."
        )
    })
}

/// A table `<name>` of fenced documents with one row `'doc'` at fence 0, and `<name>_history`
/// of the writes it accepted, in order; both dropped on drop.
struct Tables {
    name: String,
}

impl Tables {
    fn create(db: &mut postgres::Client) -> Tables {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "fenced_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        db.batch_execute(&format!(
            "CREATE TABLE {name} (
                 id    text   PRIMARY KEY,
                 body  text   NOT NULL,
                 fence bigint NOT NULL DEFAULT 0
             );
             CREATE TABLE {name}_history (
                 seq   bigserial PRIMARY KEY,
                 token bigint    NOT NULL,
                 body  text      NOT NULL
             );
             INSERT INTO {name} (id, body) VALUES ('doc', 'initial');"
        ))
        .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        Tables { name }
    }

    /// The fenced write, recording an accepted one in the history in the same statement, so the
    /// history's order is the order in which the row took the writes. Returns whether the row
    /// took it.
    fn write(&self, db: &mut postgres::Client, body: &str, token: FencingToken) -> bool {
        let name = &self.name;
        let token = token.as_i64().unwrap();
        let rows = db
            .execute(
                &format!(
                    "WITH accepted AS (
                         UPDATE {name} SET body = $1, fence = $2
                         WHERE id = 'doc' AND fence <= $2
                         RETURNING fence, body
                     )
                     INSERT INTO {name}_history (token, body) SELECT fence, body FROM accepted"
                ),
                &[&body, &token],
            )
            .unwrap_or_else(|e| panic!("fenced write to {name}: {e}"));
        assert!(rows <= 1, "{rows} rows for one id");
        rows == 1
    }

    /// The row's body and fence.
    fn row(&self, db: &mut postgres::Client) -> (String, u64) {
        let row = db
            .query_one(
                &format!("SELECT body, fence FROM {} WHERE id = 'doc'", self.name),
                &[],
            )
            .unwrap();
        (row.get(0), u64::try_from(row.get::<_, i64>(1)).unwrap())
    }
}

impl Drop for Tables {
    fn drop(&mut self) {
        let name = &self.name;
        if let Ok(mut db) = postgres::Client::connect(&database_url(), postgres::NoTls) {
            let _ = db.batch_execute(&format!("DROP TABLE IF EXISTS {name}, {name}_history"));
        }
    }
}

#[test]
fn a_holder_frozen_past_its_lease_cannot_overwrite_the_next_holder() {
    let mut db = connect();
    let tables = Tables::create(&mut db);
    let server = RedisServer::start();
    let url = database_url();
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("FENCED_TABLE", &tables.name),
    ];
    let takeover = Takeover::start(&server, "postgres", "doc", &env);
    let (token_a, token_b) = (takeover.token_a, takeover.b.token());
    assert!(tables.write(&mut db, "by B", token_b), "B's write refused");

    let outcome = takeover.resume_a_and_write("by A");
    assert_eq!(
        outcome,
        format!("rejected: stale fencing token {token_a} for row \"doc\": its fence is {token_b}"),
        "A's stale write went through"
    );
    assert_eq!(tables.row(&mut db), ("by B".to_owned(), token_b.as_u64()));
}

#[test]
fn many_writers_never_see_an_older_token_accepted_after_a_newer_one() {
    let mut db = connect();
    let tables = Tables::create(&mut db);
    let server = RedisServer::start();
    let clients = [lock_client(&server, 5_000), lock_client(&server, 5_000)];
    let connections = (0..8).map(|_| connect()).collect();

    let writes = run_writers(&clients, "doc", connections, |db, value, token| {
        tables.write(db, value, token)
    });

    // The checker runs over the table's own history, in the order the row took the writes.
    let name = &tables.name;
    let history: Vec<(u64, String)> = db
        .query(
            &format!("SELECT token, body FROM {name}_history ORDER BY seq"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (u64::try_from(row.get::<_, i64>(0)).unwrap(), row.get(1)))
        .collect();
    let tokens: Vec<u64> = history.iter().map(|(token, _)| *token).collect();
    assert_never_decreasing(&tokens);
    let accepted = writes.iter().filter(|w| w.outcome).count();
    assert_eq!(
        history.len(),
        accepted,
        "the history and the writers disagree"
    );
    let (last, last_body) = history.last().cloned().expect("no write was accepted");
    assert_eq!(
        tables.row(&mut db),
        (last_body, last),
        "the row is not the last accepted write"
    );
    for w in writes.iter().filter(|w| !w.outcome) {
        assert!(w.token < last, "{w:?} refused, yet the highest is {last}");
    }
    assert_only_late_writes_refused(&writes, |&accepted| accepted);
}

/// The tables of any schema named like the example's, as `schema.name`.
fn example_tables(db: &mut postgres::Client) -> Vec<String> {
    db.query(
        "SELECT schemaname || '.' || tablename FROM pg_tables \
         WHERE tablename LIKE 'fenced_documents%' ORDER BY 1",
        &[],
    )
    .unwrap()
    .iter()
    .map(|row| row.get(0))
    .collect()
}

#[test]
fn the_fenced_postgres_example_rejects_the_stale_write_and_leaves_no_table() {
    let mut db = connect();
    let before = example_tables(&mut db);
    let server = RedisServer::start();
    let mut cmd = std::process::Command::new(support::example_bin("fenced_postgres"));
    cmd.env("DATABASE_URL", database_url())
        .env("REDIS_URL", server.url());
    let mut example = support::Child::spawn(cmd);
    example.expect_line("A's write: rejected", std::time::Duration::from_secs(20));
    let status = example
        .wait_exit(std::time::Duration::from_secs(20))
        .expect("the example did not exit");
    assert!(status.success(), "the example failed: {status}");
    assert_eq!(
        example_tables(&mut db),
        before,
        "the example left a table behind"
    );
}
