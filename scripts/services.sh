#!/usr/bin/env bash
# Start the local PostgreSQL, RabbitMQ and Redis that bento's tests use, if
# they are down, and wait until they accept connections. Does nothing for a
# service whose test address (BENTO_TEST_POSTGRES_DSN / BENTO_TEST_AMQP_URL /
# BENTO_TEST_REDIS_ADDR) is set. Redis serves examples/redisbus.
set -euo pipefail

log() { echo "services: $*" >&2; }

# port_open: something accepts TCP connections on the port, within 5 s (a
# broker out of file descriptors leaves connections hanging).
port_open() { timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

wait_for() { # name port seconds
	local i
	for ((i = 0; i < $3; i++)); do
		if port_open "$2"; then return 0; fi
		sleep 1
	done
	log "$1 did not open 127.0.0.1:$2 within $3s"
	return 1
}

# pg_connections is the max_connections the suite needs (see below).
readonly pg_connections=300

if [[ -z "${BENTO_TEST_POSTGRES_DSN:-}" ]]; then
	if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
		log "starting PostgreSQL"
		pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
	fi
	wait_for PostgreSQL 5432 60
	for ((i = 0; i < 60; i++)); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
	if ! psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" postgres | grep -q 1; then
		log "creating database test"
		createdb -h 127.0.0.1 -U postgres test
	fi
	# The suite runs packages side by side, each with parallel tests that
	# hold connection pools (databases, buses, consumers): PostgreSQL's
	# common default of 100 connections runs out under load ("too many
	# clients"). Raise it once; the setting needs a restart.
	max_conns=$(psql -h 127.0.0.1 -U postgres -tAc "SHOW max_connections" postgres)
	if ((max_conns < pg_connections)); then
		log "PostgreSQL allows $max_conns connections; restarting it with $pg_connections"
		psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET max_connections = $pg_connections" postgres
		pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main restart
		wait_for PostgreSQL 5432 60
		for ((i = 0; i < 60; i++)); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
	fi
	log "PostgreSQL ready on 127.0.0.1:5432"
fi

# amqp_answers: the broker on 5672 answers an AMQP 0-9-1 protocol header
# with a frame (Connection.Start) within 10 s. An open port alone is not
# enough: a broker that has wedged still accepts TCP connections.
amqp_answers() {
	[[ "$(timeout 10 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672; printf "AMQP\x00\x00\x09\x01" >&3; head -c 1 <&3 | od -An -tx1' 2>/dev/null | tr -d ' ')" == 01 ]]
}

# rabbitmq_ready: answers AMQP and, through the CLI (bounded, as the CLI
# itself hangs on a wedged node), has the consistent-hash exchange enabled.
# Partitioned consumers need that plugin, shipped with RabbitMQ but not
# enabled by default; enabling is idempotent and needs no restart.
rabbitmq_ready() {
	amqp_answers &&
		timeout 60 rabbitmqctl -q await_startup >/dev/null 2>&1 &&
		timeout 60 rabbitmq-plugins enable --quiet rabbitmq_consistent_hash_exchange >/dev/null 2>&1
}

# RabbitMQ needs a file descriptor per connection and per queue file: the
# suite opens hundreds of each at once (parallel packages, worker
# processes, quorum partition queues). With the common default of 1024 the
# broker runs out, stops accepting, and wedges with its sockets in
# CLOSE-WAIT; so it runs with this many.
readonly rabbitmq_files=65536

# start_rabbitmq starts the broker with rabbitmq_files descriptors (or the
# hard limit, if lower). Debian's rabbitmq-server switches to the rabbitmq
# user with su, whose PAM session puts the soft limit back to 1024, so as
# root it starts the broker's own script with setpriv, which keeps it.
start_rabbitmq() {
	local hard
	hard=$(ulimit -Hn)
	if [[ "$hard" == unlimited ]] || ((hard > rabbitmq_files)); then hard=$rabbitmq_files; fi
	if [[ $(id -u) == 0 && -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] && command -v setpriv >/dev/null &&
		id rabbitmq >/dev/null 2>&1; then
		(ulimit -n "$hard" && cd /var/lib/rabbitmq && HOME=/var/lib/rabbitmq \
			setpriv --reuid rabbitmq --regid rabbitmq --init-groups /usr/lib/rabbitmq/bin/rabbitmq-server -detached)
	else
		(ulimit -n "$hard" && rabbitmq-server -detached)
	fi
}

# rabbitmq_files_ok: the running broker may open rabbitmq_files descriptors
# (or as many as this shell may).
rabbitmq_files_ok() {
	local pid soft want
	pid=$(pgrep -u rabbitmq -f beam.smp | head -n1) || return 0 # not ours to inspect
	soft=$(awk '/^Max open files/ {print $4}' "/proc/$pid/limits" 2>/dev/null) || return 0
	want=$(ulimit -Hn)
	if [[ "$want" == unlimited ]] || ((want > rabbitmq_files)); then want=$rabbitmq_files; fi
	[[ "$soft" == unlimited ]] || ((soft >= want))
}

restart_rabbitmq() {
	timeout 30 rabbitmqctl -q stop >/dev/null 2>&1 || true
	pkill -KILL -u rabbitmq -f beam.smp 2>/dev/null || true
	for ((i = 0; i < 30; i++)); do port_open 5672 || break; sleep 1; done
	start_rabbitmq
}

if [[ -z "${BENTO_TEST_AMQP_URL:-}" ]]; then
	if ! port_open 5672 && pgrep -u rabbitmq -f beam.smp >/dev/null; then
		log "RabbitMQ runs but does not accept connections on 127.0.0.1:5672; restarting it"
		restart_rabbitmq
	elif ! port_open 5672; then
		log "starting RabbitMQ"
		start_rabbitmq
	elif ! rabbitmq_files_ok; then
		log "RabbitMQ may open too few files for the suite; restarting it with $rabbitmq_files"
		restart_rabbitmq
	fi
	wait_for RabbitMQ 5672 180
	if ! rabbitmq_ready; then
		log "RabbitMQ on 127.0.0.1:5672 does not answer; restarting it"
		restart_rabbitmq
		wait_for RabbitMQ 5672 180
		for ((i = 0; i < 12; i++)); do rabbitmq_ready && break; sleep 5; done
		if ! rabbitmq_ready; then
			log "RabbitMQ did not become ready after a restart"
			exit 1
		fi
	fi
	log "RabbitMQ ready on 127.0.0.1:5672"
fi

if [[ -z "${BENTO_TEST_REDIS_ADDR:-}" ]]; then
	if ! port_open 6379; then
		log "starting Redis"
		mkdir -p /var/lib/redis /var/log/redis
		redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
			--dir /var/lib/redis --logfile /var/log/redis/ci.log
	fi
	wait_for Redis 6379 30
	log "Redis ready on 127.0.0.1:6379"
fi
