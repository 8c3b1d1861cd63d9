//! The lock API on one server: options, validation, tokens, the call variants, sets of keys
//! (`lock_all`), reentrancy, guards that move between threads, status, force_unlock, idle keys,
//! misconfiguration, and mutual exclusion under many threads.
//!
//! `validation` also builds and passes without any feature (CI runs it so: what a build without
//! `tls` does with a `rediss://` URL).
//!
//! Tests share this process: none of them sets process-wide state (a logger, a signal handler,
//! environment variables) or counts the process' threads. Those that do have binaries of their
//! own (`api_acl`, `api_logging`, `api_threads`).

#[path = "../support/mod.rs"]
mod support;

mod force_unlock;
mod idle_keys;
mod lock_all;
mod misconfigured;
mod moved_guards;
mod mutual_exclusion;
mod options;
mod reentrant;
mod status;
mod tokens;
mod try_lock;
mod validation;
mod with_lock;
