#!/usr/bin/env bash
# fencelock's quorum against npm `redlock` 5 (ioredis) on the same local masters:
#
#   benches/peers/run.sh [KEY=VALUE ...]      (e.g. U=2000 D_MS=4000)
#
# Installs redlock and ioredis into target/peers (or $PEERS_DIR) when they are missing, then runs
# the `peers` benchmark (benches/locks/peers.rs), which starts its own redis-servers. Needs
# Node.js (20 or later) with npm, and redis-server.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${PEERS_DIR:-$root/target/peers}
export PEERS_DIR=$dir

command -v node >/dev/null 2>&1 || { echo "node is not installed" >&2; exit 1; }
if [ ! -d "$dir/node_modules/redlock" ] || [ ! -d "$dir/node_modules/ioredis" ]; then
    mkdir -p "$dir"
    [ -f "$dir/package.json" ] || echo '{"private": true}' > "$dir/package.json"
    # redlock 5 is published as a beta only (5.0.0-beta.2, built on ioredis 5).
    (cd "$dir" && npm install --no-audit --no-fund redlock@5.0.0-beta.2 ioredis@5)
fi
cd "$root"
exec cargo bench --bench locks -- peers "$@"
