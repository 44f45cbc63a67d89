#!/usr/bin/env bash
# Runs the local stack (docker-compose.yml in the repository's root; docs/stack.md) with
# docker-compose (Compose v1) or, where that is what is installed, the docker compose plugin.
#
#   deploy/stack.sh up        start (images must exist: go tool task images) and wait until healthy
#   deploy/stack.sh wait      wait until every container runs and is healthy (STACK_WAIT seconds, 180)
#   deploy/stack.sh down      stop and remove containers, networks and volumes
#   deploy/stack.sh logs ARGS docker-compose logs ARGS (e.g. -f scheduler-1)
#   deploy/stack.sh ps        docker-compose ps
#
# CLUSTER=1 adds docker-compose.cluster.yml (three NATS servers, R3 streams) to up; wait,
# down, logs and ps add it by themselves when the project has cluster nodes or their volumes.
# The project name comes from COMPOSE_PROJECT_NAME (.env sets jetfleet).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

if command -v docker-compose >/dev/null 2>&1; then
	COMPOSE=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
	COMPOSE=(docker compose)
else
	echo "error: neither docker-compose nor the docker compose plugin is installed" >&2
	exit 1
fi

FILES=(-f docker-compose.yml)
ALL_FILES=(-f docker-compose.yml -f docker-compose.cluster.yml)
if [ -n "${CLUSTER:-}" ] && [ "${CLUSTER}" != 0 ]; then
	FILES=("${ALL_FILES[@]}")
fi

compose() { "${COMPOSE[@]}" "$@"; }

# For a stack that may already run: both files when it has a cluster node (or the
# volume of one) left.
detect_cluster() {
	local project=${COMPOSE_PROJECT_NAME:-$(sed -n 's/^COMPOSE_PROJECT_NAME=//p' .env 2>/dev/null)}
	project=${project:-$(basename "$ROOT" | tr '[:upper:]' '[:lower:]')}
	if [ -n "$(docker ps -aq --filter "label=com.docker.compose.project=$project" --filter label=com.docker.compose.service=nats-2)" ] ||
		docker volume inspect "${project}_nats-2-data" >/dev/null 2>&1; then
		FILES=("${ALL_FILES[@]}")
	fi
}

# wait_healthy: every container of the project running, and healthy where it has a
# health check (the official Jaeger image has none).
wait_healthy() {
	local deadline=$((SECONDS + ${STACK_WAIT:-180})) ids status name state health waiting
	while :; do
		ids=$(compose "${FILES[@]}" ps -q)
		[ -n "$ids" ] || { echo "error: the stack has no containers" >&2; exit 1; }
		# shellcheck disable=SC2086 # one id per word
		status=$(docker inspect --format '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' $ids)
		waiting=()
		while read -r name state health; do
			name=${name#/}
			case $state in
			exited | dead)
				compose "${FILES[@]}" ps >&2
				echo "error: container $name $state; its last log lines:" >&2
				docker logs --tail 30 "$name" >&2 || true
				exit 1
				;;
			esac
			if [ "$state" != running ] || { [ "$health" != healthy ] && [ "$health" != none ]; }; then
				waiting+=("$name:$state/$health")
			fi
		done <<<"$status"
		if [ ${#waiting[@]} -eq 0 ]; then
			echo "every container of the stack is up and healthy ($(wc -l <<<"$status") containers)"
			return
		fi
		if [ $SECONDS -ge "$deadline" ]; then
			compose "${FILES[@]}" ps >&2
			echo "error: not healthy after ${STACK_WAIT:-180}s: ${waiting[*]}" >&2
			exit 1
		fi
		sleep 1
	done
}

[ $# -ge 1 ] || { echo "usage: $0 up|wait|down|logs|ps [args]" >&2; exit 2; }
what=$1
shift
case $what in
up)
	compose "${FILES[@]}" up --detach --no-build "$@"
	wait_healthy
	cat <<EOF

jetfleet stack is running (docs/stack.md):
  NATS        nats://127.0.0.1:${NATS_PORT:-4222}   (users in config/nats/accounts.conf, dev passwords in .env)
  monitoring  http://127.0.0.1:${NATS_MONITOR_PORT:-8222}/
  Jaeger      http://127.0.0.1:${JAEGER_UI_PORT:-16686}/
  dashboard   http://127.0.0.1:${DASHBOARD_PORT:-8080}/   (logins DASHBOARD_USERS in .env)
  metrics     http://127.0.0.1:${SCHEDULER_1_PORT:-9102}/metrics scheduler-1, :${SCHEDULER_2_PORT:-9112} scheduler-2, :${SUPERVISOR_PORT:-9103} supervisor, :${AGENT_1_PORT:-9101} agent-1, :${AGENT_2_PORT:-9111} agent-2, :${DASHBOARD_METRICS_PORT:-9104} dashboard
EOF
	;;
wait)
	detect_cluster
	wait_healthy
	;;
down)
	detect_cluster
	compose "${FILES[@]}" down --volumes --remove-orphans "$@"
	;;
logs)
	detect_cluster
	compose "${FILES[@]}" logs "$@"
	;;
ps)
	detect_cluster
	compose "${FILES[@]}" ps "$@"
	;;
*)
	echo "unknown command $what (want up, wait, down, logs or ps)" >&2
	exit 2
	;;
esac
