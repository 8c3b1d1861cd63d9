//! Benchmarks: see docs/benchmarks.md.

fn main() {}
