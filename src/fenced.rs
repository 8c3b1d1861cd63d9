//! Fenced storage on Redis: writes that a stale fencing token cannot apply.
