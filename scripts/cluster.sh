#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this machine, from the installed rabbitmq-server (no Docker),
# for the cluster tests and the cluster drill: `make cluster`, `make cluster-stop`.
#
#   scripts/cluster.sh up      start rr1..rr3@localhost (AMQP 127.0.0.1:5701-5703), join 2 and 3
#                              to 1, wait until all three answer; nodes already running are kept
#   scripts/cluster.sh down    stop the three nodes and remove their data
#   scripts/cluster.sh status  exit 0 when all three nodes run their application
#   scripts/cluster.sh urls    print the three AMQP URLs, comma-separated
#
# Each node has a config file of its own under the scratch directory: the system's
# /etc/rabbitmq/rabbitmq.conf pins the listener to 5672, so RABBITMQ_NODE_PORT alone would
# collide with the shared broker. Distribution ports are 25701-25703. The broker on 5672 (node
# rabbit@localhost) is never stopped, restarted or reconfigured from here.
#
# RABBITRETRY_CLUSTER_DIR (default /tmp/rabbitretry-cluster) holds the nodes' configs, data and
# logs, owned by the rabbitmq user that the broker's scripts run as.
set -euo pipefail

dir=${RABBITRETRY_CLUSTER_DIR:-/tmp/rabbitretry-cluster}
nodes=(1 2 3)

say() { echo "cluster: $*"; }

node() { echo "rr$1@localhost"; }
amqp_port() { echo $((5700 + $1)); }
dist_port() { echo $((25700 + $1)); }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Run a command with the environment the broker's scripts read for node N (they run as the
# rabbitmq user and keep these variables).
with_node_env() {
    local n=$1 base=$dir/rr$1
    shift
    env RABBITMQ_NODENAME="$(node "$n")" \
        RABBITMQ_CONFIG_FILE="$base/rabbitmq.conf" \
        RABBITMQ_DIST_PORT="$(dist_port "$n")" \
        RABBITMQ_MNESIA_BASE="$base/mnesia" \
        RABBITMQ_LOG_BASE="$base/log" \
        RABBITMQ_PID_FILE="$base/rabbitmq.pid" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$base/enabled_plugins" \
        "$@"
}

ctl() {
    local n=$1
    shift
    rabbitmqctl -q -n "$(node "$n")" "$@"
}

running() { ctl "$1" await_startup --timeout 1 >/dev/null 2>&1; }
alive() { ctl "$1" status >/dev/null 2>&1; }

write_config() {
    local n=$1 base=$dir/rr$1
    mkdir -p "$base/mnesia" "$base/log"
    cat >"$base/rabbitmq.conf" <<EOF
listeners.tcp.local = 127.0.0.1:$(amqp_port "$n")
EOF
    echo "[]." >"$base/enabled_plugins"
}

start_node() {
    local n=$1
    if alive "$n"; then
        # Left with its application stopped (an interrupted cluster drill): start it again.
        running "$n" || ctl "$n" start_app
        say "$(node "$n") is running"
        return
    fi
    if port_open "$(amqp_port "$n")" || port_open "$(dist_port "$n")"; then
        say "port $(amqp_port "$n") or $(dist_port "$n") is taken by something else" >&2
        exit 1
    fi
    write_config "$n"
    chown -R rabbitmq:rabbitmq "$dir"
    say "starting $(node "$n") on 127.0.0.1:$(amqp_port "$n")"
    with_node_env "$n" rabbitmq-server -detached
}

wait_node() {
    local n=$1
    for _ in $(seq 1 90); do
        running "$n" && port_open "$(amqp_port "$n")" && return 0
        sleep 1
    done
    say "$(node "$n") did not start; see $dir/rr$n/log" >&2
    exit 1
}

# The nodes node 1 sees running in its cluster, one a line.
running_members() {
    ctl 1 cluster_status --formatter json 2>/dev/null |
        python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin)["running_nodes"]))'
}

join() {
    local n=$1
    if running_members | grep -qx "$(node "$n")"; then
        return
    fi
    say "joining $(node "$n") to $(node 1)"
    ctl "$n" stop_app
    ctl "$n" join_cluster "$(node 1)"
    ctl "$n" start_app
    wait_node "$n"
}

up() {
    command -v rabbitmq-server >/dev/null || {
        say "rabbitmq-server is not installed here (sudo apt-get install -y rabbitmq-server)" >&2
        exit 1
    }
    mkdir -p "$dir"
    for n in "${nodes[@]}"; do start_node "$n"; done
    for n in "${nodes[@]}"; do wait_node "$n"; done
    for n in 2 3; do join "$n"; done
    say "3 nodes running: $(urls)"
}

down() {
    for n in "${nodes[@]}"; do
        if alive "$n"; then
            say "stopping $(node "$n")"
            ctl "$n" stop || true
        fi
    done
    for n in "${nodes[@]}"; do
        for _ in $(seq 1 30); do
            port_open "$(dist_port "$n")" || port_open "$(amqp_port "$n")" || break
            sleep 1
        done
    done
    # Only what this script created: the per-node directories and the scratch directory.
    for n in "${nodes[@]}"; do rm -rf "${dir:?}/rr$n"; done
    rmdir "$dir" 2>/dev/null || true
}

status() {
    for n in "${nodes[@]}"; do
        running "$n" || {
            say "$(node "$n") is not running"
            exit 1
        }
    done
    say "3 nodes running"
}

urls() {
    local list=()
    for n in "${nodes[@]}"; do list+=("amqp://guest:guest@127.0.0.1:$(amqp_port "$n")/"); done
    (
        IFS=,
        echo "${list[*]}"
    )
}

case ${1:-} in
    up) up ;;
    down) down ;;
    status) status ;;
    urls) urls ;;
    *)
        echo "usage: $0 up|down|status|urls" >&2
        exit 2
        ;;
esac
