#!/usr/bin/env bash
# A Sentinel deployment for a first try, on loopback only: a master, two replicas and three
# sentinels, in a fresh temporary directory. Not for production: no passwords, no persistence
# across a restart of this script.
#
#   examples/local-sentinel/start.sh [BASE_PORT]
#
# Ports: the master on BASE_PORT (16380 unless given), the replicas on the next two, the
# sentinels on BASE_PORT+10, +11, +12. Prints, on standard output, two lines that a shell can
# eval:
#
#   FENCELOCK_URL=redis+sentinel://127.0.0.1:16390,127.0.0.1:16391,127.0.0.1:16392/mymaster
#   FENCELOCK_STOP=/tmp/fencelock-sentinel.XXXXXX/stop
#
# and returns once the sentinels agree on the master and both replicas. Run "$FENCELOCK_STOP" to
# stop every process it started and remove the directory. Uses redis-server and redis-cli from
# PATH, or REDIS_SERVER_BIN and REDIS_CLI_BIN.
set -euo pipefail

base=${1:-16380}
case $base in
'' | *[!0-9]*) echo "usage: $0 [BASE_PORT]" >&2; exit 2 ;;
esac
if [ "$base" -lt 1024 ] || [ "$base" -gt 65520 ]; then
    echo "BASE_PORT must be between 1024 and 65520" >&2
    exit 2
fi
server=${REDIS_SERVER_BIN:-redis-server}
cli=${REDIS_CLI_BIN:-redis-cli}
master=$base
replicas="$((base + 1)) $((base + 2))"
sentinels="$((base + 10)) $((base + 11)) $((base + 12))"

dir=$(mktemp -d "${TMPDIR:-/tmp}/fencelock-sentinel.XXXXXX")

# The stop script: SIGTERM to each process this run started (its pid file), SIGKILL after 5 s,
# then the directory goes. A pid is signalled only while it is still a redis-server.
cat >"$dir/stop" <<STOP
#!/usr/bin/env bash
dir='$dir'
for f in "\$dir"/*/pid; do
    [ -f "\$f" ] || continue
    pid=\$(cat "\$f")
    case "\$(ps -o comm= -p "\$pid" 2>/dev/null)" in redis-server* | redis-sentinel*) kill "\$pid" 2>/dev/null ;; esac
done
for f in "\$dir"/*/pid; do
    [ -f "\$f" ] || continue
    pid=\$(cat "\$f")
    for _ in \$(seq 1 50); do
        # Gone, or a zombie that only its parent's reaping keeps listed.
        case "\$(ps -o stat= -p "\$pid" 2>/dev/null)" in '' | Z*) break ;; esac
        sleep 0.1
    done
    case "\$(ps -o comm= -p "\$pid" 2>/dev/null)" in redis-server* | redis-sentinel*) kill -9 "\$pid" 2>/dev/null ;; esac
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

start_server() { # port, extra arguments...
    local port=$1
    shift
    mkdir -p "$dir/$port"
    # min-replicas-to-write 1: the master refuses writes unless a replica is with it, which
    # bounds what a failover can lose (see the README's Sentinel section); max-lag below a third
    # of the default 30 s lease.
    "$server" --port "$port" --bind 127.0.0.1 --dir "$dir/$port" \
        --appendonly yes --save '' \
        --min-replicas-to-write 1 --min-replicas-max-lag 5 \
        --daemonize yes --pidfile "$dir/$port/pid" --logfile "$dir/$port/log" "$@"
}

start_server "$master"
for port in $replicas; do
    start_server "$port" --replicaof 127.0.0.1 "$master"
done
for port in $master $replicas; do
    await "redis-server on $port" "$cli" -p "$port" ping
done
# The master takes writes once a replica is in sync and acknowledging (min-replicas-to-write).
await "the master to count both replicas as good" \
    sh -c "'$cli' -p $master info replication | grep -q min_slaves_good_slaves:2"

for port in $sentinels; do
    mkdir -p "$dir/$port"
    # Sentinel rewrites its configuration file: it lives in the temporary directory.
    cat >"$dir/$port/sentinel.conf" <<CONF
port $port
bind 127.0.0.1
dir $dir/$port
daemonize yes
pidfile $dir/$port/pid
logfile $dir/$port/log
sentinel monitor mymaster 127.0.0.1 $master 2
sentinel down-after-milliseconds mymaster 2000
sentinel failover-timeout mymaster 10000
sentinel parallel-syncs mymaster 1
CONF
    "$server" "$dir/$port/sentinel.conf" --sentinel
done

# Each sentinel knows the master, both replicas and the two other sentinels.
agreed() { # sentinel port
    "$cli" -p "$1" --raw sentinel master mymaster |
        awk 'prev == "num-slaves" { r = $0 } prev == "num-other-sentinels" { s = $0 } { prev = $0 }
             END { exit !(r == 2 && s == 2) }'
}
for port in $sentinels; do
    await "sentinel $port to see the master, 2 replicas and 2 other sentinels" agreed "$port"
done

hosts=$(for port in $sentinels; do printf '127.0.0.1:%s,' "$port"; done)
echo "FENCELOCK_URL=redis+sentinel://${hosts%,}/mymaster"
echo "FENCELOCK_STOP=$dir/stop"
echo "Sentinel is up in $dir: master 127.0.0.1:$master, replicas on $replicas, sentinels on $sentinels" >&2
echo "Try a failover: $cli -p $((base + 10)) sentinel failover mymaster" >&2
echo "Try it: REDIS_URL=\"\$FENCELOCK_URL\" cargo run --example quickstart; stop it: \"\$FENCELOCK_STOP\"" >&2
