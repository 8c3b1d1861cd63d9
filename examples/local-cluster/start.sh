#!/usr/bin/env bash
# A Redis Cluster for a first try, on loopback only: three masters, each with one replica
# (REPLICAS=0 for masters only), in a fresh temporary directory. Not for production: no
# passwords, no persistence across a restart of this script.
#
#   examples/local-cluster/start.sh [BASE_PORT]
#
# Ports: the nodes on BASE_PORT (7000 unless given) and up, their cluster bus 10000 above each.
# Prints, on standard output, two lines that a shell can eval:
#
#   FENCELOCK_URL=redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
#   FENCELOCK_STOP=/tmp/fencelock-cluster.XXXXXX/stop
#
# and returns once every node says the cluster is ok and knows every other node. Run
# "$FENCELOCK_STOP" to stop every process it started and remove the directory. Uses
# redis-server and redis-cli (5.0 or later, for --cluster create) from PATH, or
# REDIS_SERVER_BIN and REDIS_CLI_BIN.
set -euo pipefail

base=${1:-7000}
replicas=${REPLICAS:-1}
case "$base:$replicas" in
*[!0-9:]* | :* | *:) echo "usage: [REPLICAS=0|1] $0 [BASE_PORT]" >&2; exit 2 ;;
esac
nodes=$((3 * (1 + replicas)))
if [ "$base" -lt 1024 ] || [ $((base + nodes + 10000)) -gt 65535 ]; then
    echo "BASE_PORT must be between 1024 and $((65535 - 10000 - nodes))" >&2
    exit 2
fi
server=${REDIS_SERVER_BIN:-redis-server}
cli=${REDIS_CLI_BIN:-redis-cli}
ports=$(seq "$base" $((base + nodes - 1)))

dir=$(mktemp -d "${TMPDIR:-/tmp}/fencelock-cluster.XXXXXX")

# The stop script: SIGTERM to each process this run started (its pid file), SIGKILL after 5 s,
# then the directory goes. A pid is signalled only while it is still a redis-server.
cat >"$dir/stop" <<STOP
#!/usr/bin/env bash
dir='$dir'
for f in "\$dir"/*/pid; do
    [ -f "\$f" ] || continue
    pid=\$(cat "\$f")
    case "\$(ps -o comm= -p "\$pid" 2>/dev/null)" in redis-server*) kill "\$pid" 2>/dev/null ;; esac
done
for f in "\$dir"/*/pid; do
    [ -f "\$f" ] || continue
    pid=\$(cat "\$f")
    for _ in \$(seq 1 50); do
        # Gone, or a zombie that only its parent's reaping keeps listed.
        case "\$(ps -o stat= -p "\$pid" 2>/dev/null)" in '' | Z*) break ;; esac
        sleep 0.1
    done
    case "\$(ps -o comm= -p "\$pid" 2>/dev/null)" in redis-server*) kill -9 "\$pid" 2>/dev/null ;; esac
done
rm -rf "\$dir"
echo "stopped; removed \$dir" >&2
STOP
chmod +x "$dir/stop"
# Anything failing below stops what was started.
trap 'status=$?; if [ $status -ne 0 ]; then echo "start failed; logs in $dir:" >&2; tail -n 5 "$dir"/*/log >&2 || true; "$dir/stop"; fi' EXIT

# Waits (at most 30 s) until "$@" succeeds.
await() {
    local what=$1
    shift
    for _ in $(seq 1 300); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for $what" >&2
    return 1
}

for port in $ports; do
    mkdir -p "$dir/$port"
    # cluster-node-timeout 2000: a master that stops answering is replaced by its replica within
    # a few seconds. min-replicas-to-write 1 (with replicas): a master refuses writes unless its
    # replica is with it, which bounds what a failover can lose (see the README's Cluster
    # section).
    extra=()
    if [ "$replicas" -gt 0 ]; then extra=(--min-replicas-to-write 1 --min-replicas-max-lag 5); fi
    "$server" --port "$port" --bind 127.0.0.1 --dir "$dir/$port" \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
        --appendonly yes --save '' ${extra[@]+"${extra[@]}"} \
        --daemonize yes --pidfile "$dir/$port/pid" --logfile "$dir/$port/log"
done
for port in $ports; do
    await "redis-server on $port" "$cli" -p "$port" ping
done

addresses=$(for port in $ports; do printf '127.0.0.1:%s ' "$port"; done)
# shellcheck disable=SC2086 # one argument per address
"$cli" --cluster create $addresses --cluster-replicas "$replicas" --cluster-yes >"$dir/create.log" 2>&1 ||
    { cat "$dir/create.log" >&2; exit 1; }

settled() { # port
    local info
    info=$("$cli" -p "$1" cluster info)
    grep -q 'cluster_state:ok' <<<"$info" && grep -q "cluster_known_nodes:$nodes" <<<"$info"
}
for port in $ports; do
    await "node $port to say cluster_state:ok and know $nodes nodes" settled "$port"
done
# With replicas, a master takes writes once its replica is in sync and acknowledging.
writable() { # port
    local info
    info=$("$cli" -p "$1" info replication)
    grep -q 'role:slave' <<<"$info" || grep -q 'min_slaves_good_slaves:1' <<<"$info"
}
if [ "$replicas" -gt 0 ]; then
    for port in $ports; do
        await "node $port to take writes (its replica in sync)" writable "$port"
    done
fi

seeds=$(for port in $(seq "$base" $((base + 2))); do printf '127.0.0.1:%s,' "$port"; done)
echo "FENCELOCK_URL=redis+cluster://${seeds%,}"
echo "FENCELOCK_STOP=$dir/stop"
echo "Cluster is up in $dir: nodes on $(echo $ports)" >&2
echo "Try it: REDIS_URL=\"\$FENCELOCK_URL\" cargo run --example quickstart; stop it: \"\$FENCELOCK_STOP\"" >&2
