#!/usr/bin/env bash
# RabbitMQ and PostgreSQL for the demo, the tests and CI: `make services`, `make demo`,
# `make test` and .ci/run all come through here.
#
#   scripts/services.sh up              bring them up whichever way this machine can (below)
#   scripts/services.sh up --installed  only start the services installed here (CI)
#
# Each service is looked for at the host and port of its URL (RABBITRETRY_AMQP_URL,
# RABBITRETRY_DATABASE_URL; by default 127.0.0.1:5672 and 127.0.0.1:5432). One that answers is
# left alone, and one on another machine is never started from here. A missing local one is
# started, in this order of preference:
#   1. with Docker (a daemon that answers): docker compose up -d --wait SERVICE;
#   2. installed on this machine: PostgreSQL with pg_ctlcluster, RabbitMQ with rabbitmq-server
#      (or rabbitmqctl start_app when the node runs with its application stopped);
#   3. otherwise: print the command that installs them, and exit 1.
# URLs are never printed (they may hold passwords): only host and port.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: $0 up [--installed]" >&2
    exit 2
}
[[ ${1:-} == up ]] || usage
mode=${2:-auto}
case $mode in auto | --installed) ;; *) usage ;; esac

say() { echo "services: $*"; }

# "HOST PORT" of a URL such as amqp://user:secret@host:5672/vhost (PORT: $2 if it has none).
endpoint() {
    local rest=${1#*://}
    rest=${rest%%[/?#]*}
    rest=${rest##*@}
    if [[ $rest == \[* ]]; then # [::1]:5672
        local host=${rest%%]*}
        host=${host#[}
        local port=${rest#*]}
        port=${port#:}
        echo "$host ${port:-$2}"
    elif [[ $rest == *:* ]]; then
        echo "${rest%%:*} ${rest##*:}"
    else
        echo "${rest:-127.0.0.1} $2"
    fi
}

is_local() { [[ $1 == 127.0.0.1 || $1 == localhost || $1 == ::1 ]]; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_port() {
    local name=$1 host=$2 port=$3
    for _ in $(seq 1 60); do
        port_open "$host" "$port" && return 0
        sleep 1
    done
    say "$name did not come up on $host:$port" >&2
    return 1
}

docker_usable() {
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 \
        && docker compose version >/dev/null 2>&1
}

postgres_installed() {
    command -v pg_ctlcluster >/dev/null 2>&1 && [[ -n $(ls /etc/postgresql 2>/dev/null) ]]
}

rabbitmq_installed() { command -v rabbitmq-server >/dev/null 2>&1; }

start_postgres() {
    say "starting PostgreSQL (pg_ctlcluster)"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
}

start_rabbitmq() {
    if rabbitmqctl -q status >/dev/null 2>&1; then
        # The node runs but its application was stopped (an interrupted broker-restart drill).
        say "starting RabbitMQ's application (rabbitmqctl start_app)"
        rabbitmqctl -q start_app
    else
        say "starting RabbitMQ (rabbitmq-server -detached)"
        rabbitmq-server -detached
    fi
}

# The AMQP port opens before the broker finishes booting; wait until it answers.
wait_rabbitmq_booted() {
    command -v rabbitmq-diagnostics >/dev/null 2>&1 || return 0
    for _ in $(seq 1 60); do
        rabbitmq-diagnostics -q check_running >/dev/null 2>&1 && return 0
        sleep 1
    done
}

# $1: "postgres", "rabbitmq" or "postgres rabbitmq", the services neither Docker nor this
# machine can provide.
install_hint() {
    local names=${1/postgres/PostgreSQL} apt=${1/postgres/postgresql} brew=${1/postgres/postgresql@16}
    names=${names/rabbitmq/RabbitMQ}
    apt=${apt/rabbitmq/rabbitmq-server}
    local verb=is
    [[ $1 == *" "* ]] && verb=are
    say "there is no Docker, and ${names/ / and } $verb not installed here. Install with:" >&2
    if command -v apt-get >/dev/null 2>&1; then
        echo "    sudo apt-get install -y $apt" >&2
        [[ $1 == *postgres* ]] && echo "  and let PostgreSQL accept passwordless connections" \
            "from 127.0.0.1 (host all all 127.0.0.1/32 trust in pg_hba.conf), or set" \
            "RABBITRETRY_DATABASE_URL with a password." >&2
    elif command -v brew >/dev/null 2>&1; then
        echo "    brew install $brew && brew services start ${brew// / \&\& brew services start }" >&2
    else
        echo "    Docker (https://docs.docker.com/get-docker/), then: make services" >&2
    fi
    echo "  Or point RABBITRETRY_AMQP_URL and RABBITRETRY_DATABASE_URL at running services." >&2
}

read -r pg_host pg_port < <(endpoint "${RABBITRETRY_DATABASE_URL:-postgresql://127.0.0.1}" 5432)
read -r mq_host mq_port < <(endpoint "${RABBITRETRY_AMQP_URL:-amqp://127.0.0.1}" 5672)

# Which services are missing here, by their docker-compose.yml names.
missing=()
for service in postgres rabbitmq; do
    if [[ $service == postgres ]]; then host=$pg_host port=$pg_port name=PostgreSQL; else
        host=$mq_host port=$mq_port name=RabbitMQ
    fi
    if ! is_local "$host"; then
        say "$name is expected at $host:$port (not this machine): not started from here"
    elif port_open "$host" "$port"; then
        say "$name is running on $host:$port"
    else
        missing+=("$service")
    fi
done

if [[ $mode == --installed ]]; then
    # CI: the services are installed on this machine; start what is not running.
    for service in "${missing[@]}"; do
        if [[ $service == postgres ]]; then start_postgres; else start_rabbitmq; fi
    done
    if is_local "$pg_host"; then wait_port PostgreSQL "$pg_host" "$pg_port"; fi
    if is_local "$mq_host"; then
        wait_port RabbitMQ "$mq_host" "$mq_port"
        wait_rabbitmq_booted
    fi
    exit 0
fi

((${#missing[@]})) || exit 0

if docker_usable; then
    say "starting ${missing[*]} with Docker (docker-compose.yml)"
    docker compose up -d --wait "${missing[@]}"
    exit 0
fi

absent=()
for service in "${missing[@]}"; do
    if [[ $service == postgres ]]; then postgres_installed || absent+=(postgres); fi
    if [[ $service == rabbitmq ]]; then rabbitmq_installed || absent+=(rabbitmq); fi
done
if ((${#absent[@]})); then
    install_hint "${absent[*]}"
    exit 1
fi
for service in "${missing[@]}"; do
    if [[ $service == postgres ]]; then
        start_postgres
        wait_port PostgreSQL "$pg_host" "$pg_port"
    else
        start_rabbitmq
        wait_port RabbitMQ "$mq_host" "$mq_port"
        wait_rabbitmq_booted
    fi
done
