use fencelock::{LockClient, Topology};
use std::time::Instant;
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(5);
    let iters: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(20000);
    let urls: Vec<String> = (0..n)
        .map(|i| format!("redis://127.0.0.1:{}", 27101 + i))
        .collect();
    let client = LockClient::builder(Topology::quorum(urls)).build().unwrap();
    for i in 0..200 {
        let g = client.lock(&format!("warm{i}")).unwrap();
        g.unlock().unwrap();
    }
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters {
        let t = Instant::now();
        let g = client.lock(&format!("k{i}")).unwrap();
        g.unlock().unwrap();
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "p50 {:?} p99 {:?}",
        times[iters / 2],
        times[iters * 99 / 100]
    );
}
