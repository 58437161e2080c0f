#!/bin/sh
# scripts/dev_ca.sh DIR: a development CA, certificates and tokens for fxdp-server
# with TLS (docs/security.md). For trying things out and for the tests, never for
# production: the CA key sits next to what it signed.
#
# Writes into DIR (created; existing files are replaced):
#   ca.pem, ca.key             the CA (10 years, EC P-256)
#   server.pem, server.key     CN=fxdp-server, SAN localhost, 127.0.0.1, ::1 and the
#                              names in $FXDP_DEV_SANS (e.g. "DNS:fxdp.lan,IP:10.0.0.5")
#   worker.pem, worker.key     CN=worker-1, O=fxdp:workers: a worker (mutual TLS)
#   client.pem, client.key     CN=alice: a client identity (mutual TLS)
#   admin.pem, admin.key       CN=root, O=fxdp:admins: an admin client
#   worker.token               the workers' join token (fxdp-server --worker-token-file)
#   alice.token, bob.token, admin.token and client-tokens (fxdp-server --client-tokens:
#                              "TOKEN IDENTITY [admin]" lines for alice, bob, root)
# Keys and tokens are mode 0600.
set -eu
dir=${1:?usage: scripts/dev_ca.sh DIR}
mkdir -p "$dir"
cd "$dir"
umask 077
days=3650

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# sign NAME SUBJECT EXTENSIONS: NAME.key + NAME.pem signed by the CA.
sign() {
  key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days $days \
    -sha256 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

key ca.key
openssl req -new -x509 -key ca.key -subj "/O=fxdp dev/CN=fxdp dev CA" -days $days -sha256 \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem

sans="DNS:localhost,IP:127.0.0.1,IP:::1${FXDP_DEV_SANS:+,$FXDP_DEV_SANS}"
sign server "/CN=fxdp-server" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$sans"
client_ext="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
sign worker "/O=fxdp:workers/CN=worker-1" "$client_ext"
sign client "/CN=alice" "$client_ext"
sign admin "/O=fxdp:admins/CN=root" "$client_ext"
rm -f ca.srl

token() { openssl rand -hex 24; }
token > worker.token
: > client-tokens
for who in alice bob admin; do
  t=$(token)
  printf '%s\n' "$t" > "$who.token"
  case $who in
    admin) printf '%s root admin\n' "$t" >> client-tokens ;;
    *) printf '%s %s\n' "$t" "$who" >> client-tokens ;;
  esac
done
chmod 0644 ca.pem server.pem worker.pem client.pem admin.pem
echo "dev_ca.sh: wrote the CA, certificates and tokens to $dir"
