# Sourced (`. scripts/node-env.sh`), not run: when the shell's `node` is older than 24 and
# scripts/install-node.sh put a Node 24 in .node/, puts .node/bin first on PATH, so npm, its
# install scripts and everything after run under Node 24, and points node-gyp at .node's headers
# (a machine-wide `nodedir`, e.g. /usr for a distribution's Node 20, would build usocket for the
# wrong ABI). Does nothing when the shell's node is already 24 or newer.
_infera_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 24 ? 0 : 1)' 2>/dev/null \
  && [ -x "$_infera_root/.node/bin/node" ]; then
  export PATH="$_infera_root/.node/bin:$PATH"
  export npm_config_nodedir="$_infera_root/.node"
  echo "node-env: using $_infera_root/.node/bin/node ($(node -v)) for this shell" >&2
fi
unset _infera_root
