// npm `redlock` 5 (on ioredis), driven by the `peers` benchmark (benches/locks/peers.rs) on the
// masters it started. One process, as a Node.js service would run it. Prints a line per figure:
// its name, then its numbers, space-separated.
//
//   node redlock.mjs MODULES PORTS uncontended N
//       N times: a parallel round (a no-op EVALSHA written to every master, timed to the
//       majority's reply, in this client), then acquire + release of a fresh key; the samples
//       in µs.
//   node redlock.mjs MODULES PORTS contention MS WORKERS HOLD_US THINK_US
//       WORKERS async workers on one key for MS: acquire (retrying), hold, release, think; each
//       acquire's wait in µs and each worker's count.
//
// MODULES is the directory whose node_modules holds redlock and ioredis (benches/peers/run.sh
// installs them); PORTS the masters' ports on 127.0.0.1, comma-separated.

import { createRequire } from "node:module";
import path from "node:path";

const [modules, ports, mode, ...rest] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "package.json"));
const Redis = require("ioredis");
const Redlock = require("redlock").default;

const clients = ports.split(",").map((port) => new Redis({ host: "127.0.0.1", port: Number(port) }));
const quorum = Math.floor(clients.length / 2) + 1;
const now = () => process.hrtime.bigint();
const micros = (t0) => Number(now() - t0) / 1000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const NOOP = "return 1";
const noopSha = await clients[0].script("LOAD", NOOP);
await Promise.all(clients.map((c) => c.script("LOAD", NOOP)));

// A no-op EVALSHA to every master; resolves at the majority's reply.
function parallelRound() {
  return new Promise((resolve, reject) => {
    let replies = 0;
    for (const c of clients) {
      c.evalsha(noopSha, 0).then(() => {
        replies += 1;
        if (replies === quorum) resolve();
      }, reject);
    }
  });
}

// A lease of 30 s as fencelock's default; the retry settings are redlock's defaults for the
// uncontended runs. Under contention a 200 ms retry delay leaves the lock idle most of the
// time, so the workers retry after 10 ms ± 10 ms, still without end.
const LEASE = 30000;
let out;
if (mode === "uncontended") {
  const n = Number(rest[0]);
  const redlock = new Redlock(clients, { retryCount: 0 });
  const pr = [];
  const lu = [];
  for (let i = 0; i < 200; i++) {
    await parallelRound();
    const lock = await redlock.acquire([`peer-warm:${process.pid}:${i}`], LEASE);
    await lock.release();
  }
  for (let i = 0; i < n; i++) {
    let t0 = now();
    await parallelRound();
    pr.push(micros(t0));
    t0 = now();
    const lock = await redlock.acquire([`peer-u:${process.pid}:${i}`], LEASE);
    await lock.release();
    lu.push(micros(t0));
  }
  out = { pr, lu };
} else if (mode === "contention") {
  const [ms, workers, holdUs, thinkUs] = rest.map(Number);
  const redlock = new Redlock(clients, { retryCount: -1, retryDelay: 10, retryJitter: 10 });
  const waits = [];
  const counts = new Array(workers).fill(0);
  const key = `peer-c:${process.pid}`;
  const end = now() + BigInt(ms) * 1000000n;
  await Promise.all(
    counts.map(async (_, w) => {
      while (now() < end) {
        const t0 = now();
        const lock = await redlock.acquire([key], LEASE);
        waits.push(micros(t0));
        counts[w] += 1;
        if (holdUs > 0) await sleep(holdUs / 1000);
        await lock.release();
        if (thinkUs > 0) await sleep(thinkUs / 1000);
      }
    }),
  );
  out = { waits, counts };
} else {
  throw new Error(`unknown mode ${mode}`);
}
for (const [name, values] of Object.entries(out)) {
  console.log(`${name} ${values.map((v) => v.toFixed(1)).join(" ")}`);
}
await Promise.all(clients.map((c) => c.quit()));
