#!/bin/sh
# Services the docker/buildkit runner and registry-cache tests need: Debian's docker.io (dockerd, plus the
# 20.10 client whose BuildKit builds work without buildx) and docker-registry (a real OCI registry).
# Installs what is missing, then starts dockerd and a registry on 127.0.0.1:5000 unless they answer.
# Idempotent; called by .ci/run. No image is ever pulled: Kiln imports its seed with `docker import`.
set -eu
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
LOGS=/var/log/kiln-ci
STATE=/var/lib/kiln-ci

missing=""
for p in docker.io docker-registry iproute2; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "ci-services: installing$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
$SUDO mkdir -p "$LOGS" "$STATE"

wait_for() {  # wait_for WHAT COMMAND...: up to 60 s
    what=$1; shift
    i=0
    until "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ "$i" -gt 120 ]; then
            echo "ci-services: $what did not start; its log:" >&2
            tail -n 40 "$LOGS/$what.log" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    echo "ci-services: $what is up"
}

if ! /usr/bin/docker version >/dev/null 2>&1; then
    echo "ci-services: starting dockerd (log $LOGS/dockerd.log)"
    $SUDO sh -c "nohup dockerd >$LOGS/dockerd.log 2>&1 &"
    wait_for dockerd /usr/bin/docker version
fi

registry_up() {
    python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:5000/v2/", timeout=2)'
}
if ! registry_up 2>/dev/null; then
    # Debian's /etc/docker/registry/config.yml asks for htpasswd auth; this one is open, on loopback only.
    $SUDO sh -c "cat > $STATE/registry.yml" <<CONFIG
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $STATE/registry}, delete: {enabled: true}}
http: {addr: '127.0.0.1:5000'}
CONFIG
    echo "ci-services: starting docker-registry on 127.0.0.1:5000 (log $LOGS/docker-registry.log)"
    $SUDO sh -c "nohup docker-registry serve $STATE/registry.yml >$LOGS/docker-registry.log 2>&1 &"
    wait_for docker-registry registry_up
fi
