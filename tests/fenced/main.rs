//! Fenced storage: writes with a token lower than one already accepted are refused, on Redis
//! (`FencedRedis`) and on PostgreSQL (the pattern of `examples/fenced_postgres.rs`).

#[path = "../support/mod.rs"]
mod support;

mod on_postgres;
mod on_redis;
mod takeover;
