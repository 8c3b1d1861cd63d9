//! Moving money between accounts: each transfer locks both accounts at once with `lock_all`,
//! and writes each balance through `FencedRedis` with that account's own fencing token. Four
//! workers transfer between random pairs, naming them in whatever order the transfer has them;
//! `lock_all` takes them in one order, so no two transfers wait for each other in a cycle. At
//! the end the total is what it was.
//!
//! Uses `REDIS_URL` when set; otherwise starts a throwaway `redis-server` on a free port and
//! stops it at the end.
//!
//!     cargo run --example transfer

#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;

use std::thread;
use std::time::Duration;

use fencelock::{Error, FencedRedis, LockClient};

const ACCOUNTS: [&str; 5] = ["acct:1", "acct:2", "acct:3", "acct:4", "acct:5"];
const OPENING: i64 = 100;

/// Moves `amount` from `from` to `to`, if `from` has it; whether it did.
fn transfer(
    client: &LockClient,
    store: &FencedRedis,
    from: &str,
    to: &str,
    amount: i64,
) -> Result<bool, Error> {
    let accounts = client.lock_all(&[from, to])?;
    let token = |key| {
        accounts.token(key).ok_or(Error::LockLost {
            key: key.to_owned(),
        })
    };
    let (from_token, to_token) = (token(from)?, token(to)?);
    // Claim before reading: once the claim is in, a stalled earlier holder of `from` can no
    // longer write, so the balance read is the one the debit applies to.
    store.claim(from, from_token)?;
    if store.get_i64(from)?.unwrap_or(0) < amount {
        accounts.unlock()?;
        return Ok(false);
    }
    store.incr_by(from, from_token, -amount)?;
    store.incr_by(to, to_token, amount)?;
    // Released only if both were still ours; otherwise the error says which was lost.
    accounts.unlock()?;
    Ok(true)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = throwaway_redis::redis_url()?;
    println!("using {url}");
    let client = LockClient::builder(url.as_str())
        .namespace("transfer-example")
        .lease(Duration::from_secs(5))
        .build()?;
    let store = FencedRedis::from(&client);

    // Opening balances, under one lock of every account.
    let all = client.lock_all(&ACCOUNTS)?;
    for account in ACCOUNTS {
        let token = all.token(account).ok_or("every account is locked")?;
        store.set(account, token, OPENING.to_string())?;
    }
    all.unlock()?;

    let workers: Vec<_> = (0..4_usize)
        .map(|worker| {
            let (client, store) = (client.clone(), store.clone());
            thread::spawn(move || -> Result<(usize, usize), Error> {
                let (mut done, mut refused) = (0, 0);
                let mut n = worker * 7 + 3;
                for _ in 0..25 {
                    n = (n * 31 + 11) % 1_000;
                    let from = ACCOUNTS[n % ACCOUNTS.len()];
                    let to = ACCOUNTS[(n / 5) % ACCOUNTS.len()];
                    let amount = i64::try_from(n % 40).unwrap_or(1) + 1;
                    // A transfer from an account to itself locks it once, and changes nothing.
                    if transfer(&client, &store, from, to, amount)? {
                        done += 1;
                    } else {
                        refused += 1;
                    }
                }
                Ok((done, refused))
            })
        })
        .collect();
    for (worker, handle) in workers.into_iter().enumerate() {
        let (done, refused) = handle.join().map_err(|_| "a worker panicked")??;
        println!("worker {worker}: {done} transfers, {refused} refused for lack of funds");
    }

    let mut total = 0;
    for account in ACCOUNTS {
        let balance = store.get_i64(account)?.unwrap_or(0);
        let highest = store.highest_token(account)?.ok_or("written above")?;
        println!("{account}: {balance:>4} (last written with token {highest})");
        total += balance;
    }
    let expected = OPENING * i64::try_from(ACCOUNTS.len())?;
    println!("total {total}, as opened: {expected}");
    if total != expected {
        return Err("money was created or lost".into());
    }
    Ok(())
}
