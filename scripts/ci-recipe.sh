#!/bin/sh
# docs/ci.md's recipe, run here: the steps of one image job (linux/amd64, profile metal) in a fresh
# Debian 12 root, as a hosted CI service would run them in a privileged debian:12 container.
#
#   scripts/ci-recipe.sh [ARTIFACTS_DIR]     (default: _ci-recipe/ in the repository, git-ignored)
#
# 1. checkout: `git clone` of this repository at HEAD (full history and tags, like a CI checkout
#    with fetch-depth 0; uncommitted changes are not in it);
# 2. seed: this host's Kiln builds what the image needs (nothing when the store is warm) and
#    `kiln cache push`es it to the registry: what an earlier CI run's --cache-to left there;
# 3. root: debootstrap --variant=minbase bookworm from deb.debian.org into a temporary directory,
#    `docker import`ed as kiln-ci/debian:12-<pid> (no registry is needed: nothing is pulled);
# 4. job: `docker run --privileged --network host` of that image with the checkout as its
#    workspace, running the recipe's steps: apt-get install git make sudo ca-certificates,
#    make setup-image, kiln build --cache-from/--cache-to the registry, kiln image metal, the
#    checks (artifact names, `sha256sum -c SHA256SUMS`, pulled and not built);
# 5. upload: _out/ copied to ARTIFACTS_DIR.
# Every phase prints its time, then the total. The container, the image, the root and the
# checkout are removed on exit, whatever happens.
#
# Needs root, Docker and the registry (scripts/ci-services.sh), debootstrap, and Kiln on this host
# ($KILN, else .venv/bin/kiln, else `kiln` on PATH). The downloads are kept between runs under
# $KILN_CACHE/ci-recipe/ (default ~/.cache/kiln/ci-recipe/): debootstrap's .debs, the container's
# apt archives and lists, pip's wheels. Environment: KILN_CI_REGISTRY (default 127.0.0.1:5000),
# KILN_CI_CACHE_REPO (default kiln-ci-recipe/store), KILN_VERSION (passed to both sides if set).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ARTIFACTS=$(mkdir -p "${1:-$ROOT/_ci-recipe}" && cd "${1:-$ROOT/_ci-recipe}" && pwd)
REGISTRY=${KILN_CI_REGISTRY:-127.0.0.1:5000}
CACHE_REF=oci://$REGISTRY/${KILN_CI_CACHE_REPO:-kiln-ci-recipe/store}
PROFILE=metal
PLATFORM=linux/amd64
ARCH=amd64
# What `kiln image metal` builds (Profile.packages_to_build of profiles/metal.yaml on amd64).
PACKAGES="kernel init fhs ca-certificates util-linux e2fsprogs dosfstools kmod machined"
DOWNLOADS=${KILN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/ci-recipe
IMAGE=kiln-ci/debian:12-$$
CONTAINER=kiln-ci-recipe-$$
if [ -n "${KILN:-}" ]; then :
elif [ -x "$ROOT/.venv/bin/kiln" ]; then KILN=$ROOT/.venv/bin/kiln
else KILN=kiln
fi

say() { echo "ci-recipe: $*"; }
now() { date +%s; }
START=$(now)
PHASE_START=$START
PHASE=""
TIMES=""
phase() {  # phase NAME: ends the running phase (printing its time) and starts NAME
    t=$(now)
    if [ -n "$PHASE" ]; then
        say "phase $PHASE took $((t - PHASE_START)) s"
        TIMES="$TIMES $PHASE=$((t - PHASE_START))s"
    fi
    PHASE=$1
    PHASE_START=$t
    [ -z "$PHASE" ] || say "== phase $PHASE"
}

WORK=$(mktemp -d /tmp/kiln-ci-recipe.XXXXXX)
cleanup() {
    status=$?
    set +e
    if docker container inspect "$CONTAINER" >/dev/null 2>&1; then
        say "removing container $CONTAINER"
        docker rm -f "$CONTAINER" >/dev/null
    fi
    if docker image inspect "$IMAGE" >/dev/null 2>&1; then
        say "removing image $IMAGE"
        docker rmi -f "$IMAGE" >/dev/null
    fi
    say "removing $WORK (root, checkout)"
    rm -rf --one-file-system "$WORK"
    if [ "$status" -ne 0 ]; then
        say "FAILED (exit $status) in phase ${PHASE:-?} after $(($(now) - START)) s" >&2
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

phase preflight
[ "$(id -u)" -eq 0 ] || { say "needs root (debootstrap, docker)" >&2; exit 1; }
docker version --format 'ci-recipe: docker {{.Server.Version}}' || {
    say "no Docker engine: run scripts/ci-services.sh" >&2; exit 1; }
python3 -c "import urllib.request; urllib.request.urlopen('http://$REGISTRY/v2/', timeout=5)" || {
    say "no registry at $REGISTRY: run scripts/ci-services.sh" >&2; exit 1; }
command -v debootstrap >/dev/null || { say "debootstrap is not installed" >&2; exit 1; }
say "kiln: $KILN; registry cache: $CACHE_REF; downloads kept in $DOWNLOADS; artifacts to $ARTIFACTS"
mkdir -p "$DOWNLOADS/debootstrap" "$DOWNLOADS/apt-archives/partial" "$DOWNLOADS/apt-lists/partial" "$DOWNLOADS/pip"

phase checkout
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]; then
    say "warning: $ROOT has uncommitted changes; the job runs HEAD ($(git -C "$ROOT" rev-parse --short HEAD)) without them" >&2
fi
git clone -q "$ROOT" "$WORK/checkout"
git -C "$WORK/checkout" checkout -q --detach "$(git -C "$ROOT" rev-parse HEAD)"
say "checkout $(git -C "$WORK/checkout" describe --tags --always) in $WORK/checkout"

phase seed
# What an earlier run's --cache-to pushed: the closure of the image's packages, built here if the
# host's store lacks them, then pushed (only what the registry lacks is sent).
say "kiln build $PACKAGES (on this host, in the checkout)"
(cd "$WORK/checkout" && $KILN build --progress plain --platform "$PLATFORM" --json $PACKAGES) >"$WORK/seed.json"
KEYS=$(python3 -c 'import json, sys; print(" ".join(p["key"] for p in json.load(open(sys.argv[1]))["packages"].values()))' "$WORK/seed.json")
VERSION=$(cd "$WORK/checkout" && $KILN eval fhs '{{ kiln_version }}')
say "release version $VERSION; kiln cache push $CACHE_REF ($(echo "$KEYS" | wc -w) entries)"
$KILN cache push "$CACHE_REF" $KEYS

phase root
say "debootstrap --variant=minbase bookworm $WORK/root http://deb.debian.org/debian (.debs kept in $DOWNLOADS/debootstrap)"
debootstrap --variant=minbase --cache-dir="$DOWNLOADS/debootstrap" bookworm "$WORK/root" http://deb.debian.org/debian \
    >"$WORK/debootstrap.log" 2>&1 || { tail -n 30 "$WORK/debootstrap.log" >&2; exit 1; }
rm -rf "$WORK/root/var/cache/apt/archives/"*.deb "$WORK/root/var/lib/apt/lists/"*
# A machine behind a TLS-inspecting proxy trusts its CA through /usr/local/share/ca-certificates;
# so does the root (the job's ca-certificates install adds it), and pip is told to use that bundle.
CA_ENV=""
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    say "adding this host's local CA certificates to the root: $(cd /usr/local/share/ca-certificates && echo *.crt)"
    mkdir -p "$WORK/root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$WORK/root/usr/local/share/ca-certificates/"
    CA_ENV=PIP_CERT=/etc/ssl/certs/ca-certificates.crt
fi
say "docker import as $IMAGE"
tar -C "$WORK/root" --numeric-owner -c . | docker import - "$IMAGE" >/dev/null
rm -rf --one-file-system "$WORK/root"

phase job
# The recipe's steps (docs/ci.md), in the workspace as a CI job sees it; the store lives on a
# bind mount, as on a hosted runner (build sandboxes cannot put overlayfs on the container's root).
mkdir -p "$WORK/kiln-cache"
cat >"$WORK/job.sh" <<JOB
set -eu
t=\$(date +%s)
step() { n=\$(date +%s); echo "ci-recipe job: [\$((n - t)) s] \$*"; t=\$n; }
export DEBIAN_FRONTEND=noninteractive
step "apt-get install git make sudo ca-certificates"
apt-get update -qq
apt-get install -y -qq --no-install-recommends git make sudo ca-certificates >/dev/null
git config --global --add safe.directory /workspace
step "make setup-image"
make setup-image
step "kiln build $PACKAGES --cache-from $CACHE_REF --cache-to $CACHE_REF"
.venv/bin/kiln build --progress plain --platform $PLATFORM --cache-from $CACHE_REF --cache-to $CACHE_REF $PACKAGES
step "kiln image $PROFILE --platform $PLATFORM --out _out"
.venv/bin/kiln image $PROFILE --platform $PLATFORM --progress plain --out _out
step "checks"
test -f _out/$PROFILE/$PROFILE-$ARCH.raw.zst
test -f _out/$PROFILE/manifest.json
(cd _out && sha256sum -c SHA256SUMS)
step "done"
JOB
# --privileged asks for every capability; where dockerd itself lacks one (this project's development
# VMs run without CAP_SYS_RESOURCE) runc refuses, and the job runs with every other capability, no
# seccomp filter and every block device instead (as tests/integration/test_installer.py does).
set -- --privileged
if ! docker run --rm --privileged --network host "$IMAGE" true 2>"$WORK/probe.err"; then
    grep -q "unable to apply caps: operation not permitted" "$WORK/probe.err" || { cat "$WORK/probe.err" >&2; exit 1; }
    say "warning: this Docker engine cannot run --privileged (it lacks a capability): using --cap-add ALL minus SYS_RESOURCE" >&2
    set -- --cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
        --security-opt systempaths=unconfined --device-cgroup-rule "b *:* rwm"
fi
say "docker run $* --network host $IMAGE (workspace $WORK/checkout)"
set -- "$@" -e KILN_PROGRESS=plain -e PYTHONUNBUFFERED=1
[ -z "$CA_ENV" ] || set -- "$@" -e "$CA_ENV"
[ -z "${KILN_VERSION:-}" ] || set -- "$@" -e "KILN_VERSION=$KILN_VERSION"
docker run --name "$CONTAINER" --network host "$@" \
    -v "$WORK/checkout:/workspace" -w /workspace -v "$WORK/job.sh:/ci-job.sh:ro" \
    -v "$WORK/kiln-cache:/root/.cache/kiln" \
    -v "$DOWNLOADS/apt-archives:/var/cache/apt/archives" \
    -v "$DOWNLOADS/apt-lists:/var/lib/apt/lists" \
    -v "$DOWNLOADS/pip:/root/.cache/pip" \
    "$IMAGE" sh /ci-job.sh 2>&1 | tee "$WORK/job.log"
docker wait "$CONTAINER" >"$WORK/job.status"
[ "$(cat "$WORK/job.status")" = 0 ] || { say "the job failed (exit $(cat "$WORK/job.status"))" >&2; exit 1; }
# What the shared cache is for: every entry pulled, nothing built in the container.
grep -q "^kiln: pulled [0-9]* entr.* from $CACHE_REF" "$WORK/job.log" || { say "the job pulled nothing from $CACHE_REF" >&2; exit 1; }
grep -q "^done: built 0, " "$WORK/job.log" || { say "the job built packages instead of pulling them" >&2; exit 1; }
if grep -q "^stage0: debootstrap" "$WORK/job.log"; then say "the job made a stage0 seed it did not need" >&2; exit 1; fi
manifest_version=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["profile"]["version"])' "$WORK/checkout/_out/$PROFILE/manifest.json")
[ "$manifest_version" = "$VERSION" ] || { say "the job's release version $manifest_version is not the host's $VERSION" >&2; exit 1; }

phase upload
rm -rf "$ARTIFACTS/_out"
cp -a "$WORK/checkout/_out" "$ARTIFACTS/_out"
cp "$WORK/job.log" "$ARTIFACTS/job.log"
(cd "$ARTIFACTS/_out" && find . -type f | sort | sed 's/^/ci-recipe: uploaded _out\//')

phase ""
say "OK in $(($(now) - START)) s:$TIMES"
