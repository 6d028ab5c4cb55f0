#!/usr/bin/env bash
# Makes the folder deploy/compose.yaml runs from: the database, the secrets
# and TLS, and a compile cache per worker, all owned by the user who runs
# this (the containers run as that user, so a bind mount of a 600 file is
# readable inside and by nobody else outside).
#   deploy/compose-init.sh DIR [GPUS=2] [NAME ...]
#   KFORGE_HOME=DIR KFORGE_UID=$(id -u) KFORGE_GID=$(id -g) docker compose -f deploy/compose.yaml up -d
# NAMEs are extra names or IPs the server certificate is valid for (the
# host's name, for CLIs on other machines); kforge-server and localhost
# always are. Kept when they exist already: running it again adds nothing
# and rotates nothing.
set -euo pipefail
if [ $# -lt 1 ]; then echo "usage: $0 DIR [GPUS=2] [NAME ...]" >&2; exit 2; fi
home=$1; gpus=${2:-2}; shift $(( $# >= 2 ? 2 : 1 ))
here="$(cd "$(dirname "$0")" && pwd)"
umask 077
mkdir -p "$home/data" "$home/secrets"
for ((i = 0; i < gpus; i++)); do mkdir -p "$home/cache/worker-$i"; done
[ -f "$home/tls/server.crt" ] || "$here/make-certs.sh" "$home/tls" kforge-server "$@"
token() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
cd "$home/secrets"
[ -f client.tokens ] || token > client.tokens
# One host, one worker credential: its principal is the host (server/README.md).
if [ ! -f worker.token ]; then
  token > worker.token
  echo "$(hostname -s | tr -c 'A-Za-z0-9._\n-' '-'):$(cat worker.token)" > worker.tokens
fi
echo "compose-init: $home ready for $gpus worker(s); the CLI on this host:"
echo "  build/cli/kforge --server localhost:50051 --tls-ca $home/tls/ca.crt --token-file $home/secrets/client.tokens shapes"
