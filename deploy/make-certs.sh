#!/usr/bin/env bash
# Makes a private CA and the certificates kforge's TLS needs, with the
# openssl CLI:
#   DIR/ca.crt, ca.key          the CA (kept if DIR already has one)
#   DIR/server.crt, server.key  for kforge-server, valid for localhost,
#                               127.0.0.1 and every NAME given
#   DIR/client.crt, client.key  a client certificate for mTLS (workers, CLI)
#
#   deploy/make-certs.sh DIR [NAME|IP ...]
#   deploy/make-certs.sh /etc/kforge/tls kforge-server kforge-server.kforge.svc 10.0.0.5
#
# Keys are created mode 600. Certificates last KFORGE_CERT_DAYS (default
# 825) days. For a real deployment a CA you already run (or cert-manager on
# Kubernetes) is better; this is for a first setup and for the tests, which
# make a throwaway CA with it at test time.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME|IP ...]" >&2
  exit 2
fi
dir=$1
shift
days=${KFORGE_CERT_DAYS:-825}
umask 077
mkdir -p "$dir"
cd "$dir"

san="DNS:localhost,IP:127.0.0.1,IP:::1"
for name in "$@"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -f ca.key ] || [ ! -f ca.crt ]; then
  key ca.key
  openssl req -x509 -new -key ca.key -out ca.crt -days "$days" -subj "/CN=kforge private CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
fi

# sign NAME SUBJECT EXTENSIONS: NAME.key and NAME.crt signed by the CA.
sign() {
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "$2"
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
    -days "$days" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
sign server "/CN=kforge-server" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=$san"
sign client "/CN=kforge-client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
# Certificates are public; the keys stay 600.
chmod 644 ca.crt server.crt client.crt
echo "make-certs: $dir: ca.crt, server.crt (${san}), client.crt"
