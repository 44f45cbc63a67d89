#!/usr/bin/env bash
# Builds jetfleet's container images offline. Every image is FROM scratch and only
# receives static binaries (CGO_ENABLED=0) built here on the host, so nothing is ever
# pulled from a registry. Each docker build gets a fresh temporary directory as its
# context holding only the files that image needs (binary, probe, empty dirs).
#
#   deploy/images.sh jaeger       jetfleet/jaeger:<version in deploy/jaeger/go.mod>  (cached)
#   deploy/images.sh nats         jetfleet/nats-server:<version pkg/go.mod requires>, :latest
#   deploy/images.sh services     jetfleet/{jetfleet,scheduler,agent,supervisor,dashboard}:$IMAGE_TAG
#                                 from bin/ (go tool task build); IMAGE_TAG defaults to latest
#   deploy/images.sh jaeger-tidy  refresh deploy/jaeger/go.sum after editing its go.mod
#
# Jaeger cache (a cold build takes ~10 minutes on 2 cores): the image carries the label
# org.jetfleet.build-hash, a hash of deploy/jaeger/{go.mod,go.sum,Dockerfile}, the probe's
# source and the build recipe (Go version, flags). When an image with that label exists the
# build is skipped. Otherwise the binary is taken from
# ${XDG_CACHE_HOME:-$HOME/.cache}/jetfleet/jaeger-<binhash>/jaeger (binhash: recipe, go.mod
# and go.sum only) when present, and only compiled when both are missing. Both caches live
# outside the repository, so they survive the fresh clone of every CI run.
# JAEGER_FORCE=1 rebuilds regardless.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPLOY=$ROOT/deploy
BIN=${BIN:-$ROOT/bin}
CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/jetfleet
SERVICES=(jetfleet scheduler agent supervisor dashboard)

# Modules whose checksums sum.golang.org answers 404 for (seen for Jaeger v1.76.0's
# OpenTelemetry collector dependencies). Only jaeger-tidy uses this: it writes their hashes,
# as served by the module proxy, into deploy/jaeger/go.sum. Builds run with -mod=readonly and
# verify every module against that committed go.sum, with the checksum database untouched.
JAEGER_NOSUMDB=go.opentelemetry.io/collector,github.com/open-telemetry/opentelemetry-collector-contrib

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

sha256() { sha256sum | cut -d' ' -f1; }

# mkctx: a fresh, empty build context; removed on exit.
CTXS=()
cleanup() { local d; for d in "${CTXS[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT
mkctx() {
	local d
	d=$(mktemp -d "${TMPDIR:-/tmp}/jetfleet-image.XXXXXX")
	CTXS+=("$d")
	echo "$d"
}

# The probe for compose health checks (there is no shell, curl or wget in the images).
build_healthcheck() {
	GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOOS=linux \
		go build -C "$DEPLOY/healthcheck" -trimpath -ldflags '-s -w' -o "$1/healthcheck" .
}

# require_static FILE: fail unless FILE is a Go binary built with CGO_ENABLED=0.
require_static() {
	go version -m "$1" | grep -q 'CGO_ENABLED=0' ||
		die "$1 is not a static Go binary; build it with CGO_ENABLED=0 (go tool task build)"
}

docker_build() { # docker_build DOCKERFILE CONTEXT TAG ARGS...
	local dockerfile=$1 ctx=$2 tag=$3 old new
	shift 3
	log "context $(du -sh "$ctx" | cut -f1): $(cd "$ctx" && find . -mindepth 1 -maxdepth 1 | sed 's|^\./||' | sort | tr '\n' ' ')"
	old=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
	new=$(docker build --quiet -f "$dockerfile" -t "$tag" "$@" "$ctx")
	# Drop the image this one replaces, so that repeated builds do not pile up dangling
	# images. docker rmi refuses while it is still tagged elsewhere or used by a container.
	if [ -n "$old" ] && [ "$old" != "$new" ]; then
		docker rmi "$old" >/dev/null 2>&1 || true
	fi
}

jaeger_version() {
	(cd "$DEPLOY/jaeger" && GOWORK=off GOFLAGS=-mod=readonly go list -m -f '{{.Version}}' github.com/jaegertracing/jaeger)
}

images_jaeger() {
	local version tag ldflags binhash hash have bindir bin ctx start
	start=$(date +%s)
	version=$(jaeger_version)
	tag=jetfleet/jaeger:${version#v}
	ldflags="-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$version"
	# binhash: everything the binary depends on; hash: everything the image depends on.
	binhash=$({
		echo "$(go version) GOOS=linux CGO_ENABLED=0 -trimpath -ldflags=$ldflags"
		cat "$DEPLOY/jaeger/go.mod" "$DEPLOY/jaeger/go.sum"
	} | sha256)
	binhash=${binhash:0:16}
	hash=$({
		echo "$binhash"
		cat "$DEPLOY/jaeger/Dockerfile" "$DEPLOY/healthcheck/go.mod" "$DEPLOY/healthcheck/main.go"
	} | sha256)
	hash=${hash:0:16}

	have=$(docker image inspect --format '{{ index .Config.Labels "org.jetfleet.build-hash" }}' "$tag" 2>/dev/null || true)
	if [ "$have" = "$hash" ] && [ "${JAEGER_FORCE:-0}" != 1 ]; then
		log "$tag is up to date (build-hash $hash); skipping the build"
		return
	fi

	bindir=$CACHE_DIR/jaeger-$binhash
	bin=$bindir/jaeger
	if [ -x "$bin" ] && [ "${JAEGER_FORCE:-0}" != 1 ]; then
		log "using cached binary $bin"
	else
		log "compiling Jaeger $version (about 10 minutes on a cold Go cache)"
		mkdir -p "$bindir"
		# -mod=readonly: every module is verified against the committed go.sum.
		(cd "$DEPLOY/jaeger" && GOWORK=off GOFLAGS='-mod=readonly -buildvcs=false' CGO_ENABLED=0 GOOS=linux \
			nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$bin.tmp.$$" github.com/jaegertracing/jaeger/cmd/jaeger) ||
			{ rm -f "$bin.tmp.$$"; die "building Jaeger failed"; }
		mv -f "$bin.tmp.$$" "$bin"
		# Keep only the binary of the current recipe.
		find "$CACHE_DIR" -maxdepth 1 -name 'jaeger-*' ! -name "jaeger-$binhash" -exec rm -rf {} +
	fi

	ctx=$(mkctx)
	cp "$bin" "$ctx/jaeger"
	build_healthcheck "$ctx"
	mkdir "$ctx/tmp"
	docker_build "$DEPLOY/jaeger/Dockerfile" "$ctx" "$tag" \
		--label "org.jetfleet.build-hash=$hash" \
		--label "org.opencontainers.image.version=$version"
	log "built $tag (build-hash $hash) in $(($(date +%s) - start))s"
}

images_nats() {
	local version ctx start
	start=$(date +%s)
	version=$(cd "$ROOT" && go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2)
	ctx=$(mkctx)
	log "compiling nats-server $version"
	(cd "$ROOT" && CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags '-s -w' -o "$ctx/nats-server" github.com/nats-io/nats-server/v2)
	build_healthcheck "$ctx"
	mkdir "$ctx/data"
	docker_build "$DEPLOY/nats/Dockerfile" "$ctx" "jetfleet/nats-server:${version#v}" \
		-t jetfleet/nats-server:latest \
		--label "org.opencontainers.image.version=$version"
	log "built jetfleet/nats-server:${version#v} (and :latest) in $(($(date +%s) - start))s"
}

images_services() {
	local name missing=() hcdir ctx tag=${IMAGE_TAG:-latest} zoneinfo
	for name in "${SERVICES[@]}"; do
		[ -f "$BIN/$name" ] || missing+=("$BIN/$name")
	done
	[ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}; run: go tool task build"
	zoneinfo=$(go env GOROOT)/lib/time/zoneinfo.zip
	[ -f "$zoneinfo" ] || die "$zoneinfo not found"
	hcdir=$(mkctx)
	build_healthcheck "$hcdir"
	for name in "${SERVICES[@]}"; do
		require_static "$BIN/$name"
		ctx=$(mkctx)
		cp "$BIN/$name" "$ctx/service"
		cp "$hcdir/healthcheck" "$zoneinfo" "$ctx/"
		mkdir "$ctx/data"
		docker_build "$DEPLOY/Dockerfile.service" "$ctx" "jetfleet/$name:$tag" --build-arg "SERVICE=$name"
		log "built jetfleet/$name:$tag"
	done
}

jaeger_tidy() {
	# The checksum database answers 404 for some OpenTelemetry collector modules, so for
	# those (and only those) the hashes come from the module proxy; see JAEGER_NOSUMDB.
	(cd "$DEPLOY/jaeger" && GOWORK=off GOFLAGS=-mod=mod GONOSUMDB=$JAEGER_NOSUMDB go mod tidy)
}

[ $# -ge 1 ] || die "usage: $0 jaeger|nats|services|jaeger-tidy ..."
for what in "$@"; do
	case $what in
	jaeger) images_jaeger ;;
	nats) images_nats ;;
	services) images_services ;;
	jaeger-tidy) jaeger_tidy ;;
	*) die "unknown target $what (want jaeger, nats, services or jaeger-tidy)" ;;
	esac
done
