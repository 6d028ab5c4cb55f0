#!/usr/bin/env bash
# Makes the env file a local kforge keeps its tokens in (deploy/run.sh, and
# the README's `. ./kforge-local.env`): created mode 600, with a client and a
# worker token of 64 hex digits each (kforge refuses tokens under 32
# characters), and KFORGE_TOKEN for the CLI. An existing file is kept, and
# its mode tightened to 600 if it was looser.
#   deploy/local-env.sh [FILE=kforge-local.env]
set -euo pipefail
file="${1:-kforge-local.env}"
token() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
if [ ! -e "$file" ]; then
  # umask in a subshell: the file is private from its first byte, and the
  # caller's umask is left as it was.
  (
    umask 077
    {
      echo "# kforge tokens for this machine (deploy/local-env.sh); keep this file mode 600"
      echo "export KFORGE_CLIENT_TOKEN=$(token)"
      echo "export KFORGE_WORKER_TOKEN=$(token)"
      echo 'export KFORGE_TOKEN=$KFORGE_CLIENT_TOKEN'
    } > "$file"
  )
  echo "local-env: made $file (mode 600)"
elif [ -n "$(find "$file" -perm /077)" ]; then
  chmod 600 "$file"
  echo "local-env: $file was readable by others; now mode 600"
fi
