#!/usr/bin/env bash
# Smoke test for a Jaeger all-in-one: sends one span over OTLP/HTTP (JSON) and reads the
# trace back through the query API.
#
#   deploy/check-jaeger.sh                         check a running Jaeger (e.g. the compose stack)
#   deploy/check-jaeger.sh --image jetfleet/jaeger:1.76.0
#                                                  start that image (ports on 127.0.0.1, chosen by
#                                                  Docker), check it, remove the container
#
# Environment (without --image):
#   JAEGER_OTLP_HTTP  OTLP/HTTP base URL   (default http://127.0.0.1:4318)
#   JAEGER_QUERY      query API base URL   (default http://127.0.0.1:16686)
#   CHECK_TIMEOUT     seconds to wait for readiness and for the trace (default 60)
#
# Verifies, in order: the query API answers (GET /api/services); POST /v1/traces accepts the
# span (HTTP 200); GET /api/traces?service=<unique name> returns the trace, with its trace ID
# and operation name; GET /api/traces/<trace ID> returns it too; GET / serves a page (the UI,
# or the placeholder of a binary built without UI assets). Exits non-zero on the first failure.
set -euo pipefail

OTLP=${JAEGER_OTLP_HTTP:-http://127.0.0.1:4318}
QUERY=${JAEGER_QUERY:-http://127.0.0.1:16686}
TIMEOUT=${CHECK_TIMEOUT:-60}
IMAGE=
CONTAINER=

while [ $# -gt 0 ]; do
	case $1 in
	--image) IMAGE=${2:?--image needs an image name}; shift 2 ;;
	--image=*) IMAGE=${1#--image=}; shift ;;
	-h | --help) sed -n '2,19p' "$0"; exit 0 ;;
	*) echo "unknown argument $1" >&2; exit 2 ;;
	esac
done

log() { printf 'check-jaeger: %s\n' "$*" >&2; }
fail() {
	log "FAIL: $*"
	if [ -n "$CONTAINER" ]; then
		log "container logs (last 30 lines):"
		docker logs --tail 30 "$CONTAINER" >&2 2>&1 || true
	fi
	exit 1
}
cleanup() { if [ -n "$CONTAINER" ]; then docker rm -f -v "$CONTAINER" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT

if [ -n "$IMAGE" ]; then
	CONTAINER=$(docker run -d -p 127.0.0.1::4318 -p 127.0.0.1::16686 "$IMAGE")
	log "started $IMAGE as ${CONTAINER:0:12}"
	hostport() { docker port "$CONTAINER" "$1/tcp" | head -n1; }
	OTLP=http://$(hostport 4318)
	QUERY=http://$(hostport 16686)
fi
log "OTLP/HTTP $OTLP, query $QUERY"

hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }
trace_id=$(hex 16)
span_id=$(hex 8)
service=jetfleet-check-$(hex 4)
operation=check-jaeger-span
deadline=$((SECONDS + TIMEOUT))

# 1. Readiness: the query API answers.
until curl -fsS -o /dev/null "$QUERY/api/services" 2>/dev/null; do
	[ $SECONDS -lt $deadline ] || fail "query API $QUERY/api/services not ready after ${TIMEOUT}s"
	sleep 0.5
done
log "query API is up"

# 2. Send one span (OTLP/JSON: IDs in hex, times as strings of Unix nanoseconds).
end_ns=$(date +%s%N)
start_ns=$((end_ns - 25000000))
payload=$(
	cat <<EOF
{"resourceSpans":[{
  "resource":{"attributes":[{"key":"service.name","value":{"stringValue":"$service"}}]},
  "scopeSpans":[{
    "scope":{"name":"deploy/check-jaeger.sh"},
    "spans":[{
      "traceId":"$trace_id","spanId":"$span_id","name":"$operation","kind":1,
      "startTimeUnixNano":"$start_ns","endTimeUnixNano":"$end_ns",
      "attributes":[{"key":"jetfleet.check","value":{"boolValue":true}}],
      "status":{"code":1}
    }]
  }]
}]}
EOF
)
# The OTLP receiver may start a moment after the query API: retry refused connections.
code=
until code=$(curl -sS -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
	--data "$payload" "$OTLP/v1/traces" 2>/dev/null) && [ "$code" = 200 ]; do
	[ $SECONDS -lt $deadline ] || fail "POST $OTLP/v1/traces: HTTP ${code:-no answer}"
	sleep 0.5
done
log "sent span $span_id of trace $trace_id as service $service"

# 3. Read it back by service (spans are batched, so poll).
body=
until body=$(curl -fsS "$QUERY/api/traces?service=$service" 2>/dev/null) &&
	grep -q "\"traceID\":\"$trace_id\"" <<<"$body"; do
	[ $SECONDS -lt $deadline ] || fail "trace $trace_id not found via $QUERY/api/traces?service=$service; last answer: ${body:0:300}"
	sleep 0.5
done
grep -q "\"operationName\":\"$operation\"" <<<"$body" || fail "trace found but without operation $operation: ${body:0:300}"
grep -q "\"spanID\":\"$span_id\"" <<<"$body" || fail "trace found but without span $span_id: ${body:0:300}"
log "found via /api/traces?service=$service"

# 4. And by trace ID.
body=$(curl -fsS "$QUERY/api/traces/$trace_id") || fail "GET $QUERY/api/traces/$trace_id"
grep -q "\"traceID\":\"$trace_id\"" <<<"$body" || fail "GET /api/traces/$trace_id: ${body:0:300}"
log "found via /api/traces/$trace_id"

# 5. The root page (UI or placeholder) is served.
curl -fsS -o /dev/null "$QUERY/" || fail "GET $QUERY/"
log "GET / answers 200"

log "OK"
