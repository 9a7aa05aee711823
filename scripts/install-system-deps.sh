#!/usr/bin/env bash
# Debian packages the tests and benchmarks use: a real etcd, a real nats-server, nginx (bench only),
# redis-server (kvd L4), chromium (the dashboard's headless browser test), podman + mmdebstrap + runc
# (the container image test), openssl (test certificates).
set -euo pipefail
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] || need+=(nats-server)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)  # kvd L4 tests (test/kvd/remote.test.ts)
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # dashboard browser tests (test/server/dashboard-browser.test.ts)
command -v openssl >/dev/null 2>&1 || need+=(openssl)  # test certificates (test/helpers/etcd.ts makeTlsFiles)
python3 -c "import numpy" >/dev/null 2>&1 || need+=(python3-numpy)  # kvd connector test (test/kvd/python.test.ts)
# The image build test (test/deploy/image.test.ts, scripts/build-image.sh): podman builds from a
# Debian base made with mmdebstrap; runc because crun 1.8 refuses hybrid cgroup hosts.
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v runc >/dev/null 2>&1 || need+=(runc)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
