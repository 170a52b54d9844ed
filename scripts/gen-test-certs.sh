#!/usr/bin/env bash
# Throw-away certificates for the TLS tests (and for trying TLS by hand):
#   scripts/gen-test-certs.sh DIR
# writes into DIR (created, mode 700):
#   ca.pem ca.key                 a test CA
#   server.pem server.key         psd's certificate, signed by the CA; names
#                                 localhost, psd.test, 127.0.0.1, ::1 and the
#                                 namespace test's 10.200.1.1 / 10.200.2.1
#   client.pem client.key         a trainer certificate (mutual TLS), CN trainer1
#   ps0.pem ps0.key .. ps2.*      one certificate per server of a cluster (several
#                                 PS nodes), same CA; psK names psK.test,
#                                 localhost, 127.0.0.1 and 10.201.0.(K+1)
#   rogue-ca.pem                  an unrelated CA, and a server and a client
#   rogue-server.pem/.key         certificate signed by it (must be refused)
#   rogue-client.pem/.key
# EC P-256 keys, valid for 2 days. Never use these for anything real.
set -euo pipefail
dir=${1:?usage: gen-test-certs.sh DIR}
command -v openssl >/dev/null || { echo "gen-test-certs: openssl not found (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
chmod 700 "$dir"
cd "$dir"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)

ca() {  # name CN
  openssl req -x509 "${ec[@]}" -keyout "$1.key" -out "$1.pem" -days 2 -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}
leaf() {  # name CN ca extensions
  openssl req "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  printf '%s\n' "$4" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
server_ext='subjectAltName=DNS:localhost,DNS:psd.test,IP:127.0.0.1,IP:::1,IP:10.200.1.1,IP:10.200.2.1
extendedKeyUsage=serverAuth
basicConstraints=CA:FALSE'
client_ext='extendedKeyUsage=clientAuth
basicConstraints=CA:FALSE'

ca ca "psd test CA"
leaf server psd ca "$server_ext"
leaf client trainer1 ca "$client_ext"
for k in 0 1 2; do
  leaf "ps$k" "ps$k.test" ca "subjectAltName=DNS:ps$k.test,DNS:localhost,IP:127.0.0.1,IP:10.201.0.$((k + 1))
extendedKeyUsage=serverAuth
basicConstraints=CA:FALSE"
done
ca rogue-ca "rogue CA"
leaf rogue-server psd rogue-ca "$server_ext"
leaf rogue-client trainer1 rogue-ca "$client_ext"
rm -f ./*.srl
chmod 600 ./*.key
echo "gen-test-certs: wrote $(ls | tr '\n' ' ')into $dir"
