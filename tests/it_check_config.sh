#!/usr/bin/env bash
# Integration: `psd --check-config` runs every check start-up makes (it used
# to pass configs that start-up then refused), without binding or writing:
#  - the shipped configs/psd.yaml (the systemd unit's) passes and starts;
#  - a world-readable tokens file, a missing certificate, a checkpoint_dir
#    that is a file, plaintext on 0.0.0.0 are refused, naming the problem;
#    so are a log file in a missing directory, a metrics port on the gRPC
#    port, addresses not of this machine or without a port, a unix socket in
#    a missing directory, and a key that
#    is not its certificate's (gRPC TLS and the metrics port's HTTPS), a
#    checkpoint_dir it may not create or whose checkpoints all fail to load
#    - and start-up names the certificate and key instead of "address in use";
#  - a checkpoint_dir where access() says yes but mkdir or creat fails (root
#    under /proc) is refused (a probe, removed again); a server.address
#    trainers cannot dial (psd --check-config and ps-train), a stop_metric
#    that is no scalar name and a timeout below a millisecond are refused
#    naming the key; a stop_metric no shipped trainer reports only warns;
#  - a busy port is only a warning (psd itself may be running);
#  - one server per checkpoint directory: a second psd on the running one's
#    directory is refused (its lock file), --check-config only warns about
#    itself; a cluster config with two servers in one directory, and a
#    server on a directory another server's lock file names, are refused;
#  - several PS nodes: the shipped cluster configs pass and print what each
#    server hosts; sync across servers, an unknown --name, a cluster config
#    without --name are refused with their messages; psd --name binds the
#    chosen server's address.
. "$(dirname "$0")/lib.sh" it_check_config
psd() { "$BUILD/bin/psd" "$@"; }
port=$(free_port)

out=$(psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck" 2>&1) || fail "configs/psd.yaml: $out"
echo "ok: configs/psd.yaml passes --check-config"
"$BUILD/bin/psd" --config configs/psd.yaml --listen "127.0.0.1:$port" --set server.metrics_listen="127.0.0.1:$((port + 1))" \
  --set server.checkpoint_dir="$tmp/ck" 2>"$tmp/psd.log" &
psdpid=$!; pids+=($psdpid)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
(exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null || { cat "$tmp/psd.log"; fail "configs/psd.yaml does not start"; }
echo "ok: configs/psd.yaml starts (listens on loopback)"

refused() {  # what needle args...
  local what=$1 needle=$2; shift 2
  if psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck2" "$@" >"$tmp/out" 2>&1; then
    cat "$tmp/out"; fail "--check-config passed $what"; fi
  grep -q -- "$needle" "$tmp/out" || { cat "$tmp/out"; fail "$what: expected '$needle'"; }
  echo "ok: --check-config refuses $what: $(grep -o -- "$needle.\{0,50\}" "$tmp/out" | head -n 1)"
}
printf 'a trainer %s\n' "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$tmp/tokens"; chmod 644 "$tmp/tokens"
refused "a world-readable tokens file" "chmod 600" --set security.tokens_file="$tmp/tokens"
refused "a missing certificate" "$tmp/nope.pem" --set security.tls=true --set security.cert="$tmp/nope.pem" \
  --set security.key="$tmp/nope.key"
touch "$tmp/file"
refused "a checkpoint_dir that is a file" "not a directory" --set server.checkpoint_dir="$tmp/file"
refused "plaintext on 0.0.0.0" "only allowed on loopback" --listen "0.0.0.0:$port"
# what start-up refuses beyond the files above: each of these once passed --check-config
refused "a log file in a missing directory" "server.log_file: log file $tmp/nodir/psd.log: directory $tmp/nodir" \
  --set server.log_file="$tmp/nodir/psd.log"
refused "the metrics port on the gRPC port" \
  "server.metrics_listen: '0.0.0.0:$((port + 9))' is where server.listen binds too ('127.0.0.1:$((port + 9))')" \
  --listen "127.0.0.1:$((port + 9))" --set server.metrics_listen="0.0.0.0:$((port + 9))"
# 192.0.2.1: TEST-NET-1, never an address of this machine
refused "a metrics address not of this machine" "server.metrics_listen 192.0.2.1:$port: cannot listen there" \
  --set server.metrics_listen="192.0.2.1:$port"
refused "a listen address not of this machine" "server.listen 192.0.2.1:$port: cannot listen there" \
  --listen "192.0.2.1:$port" --set security.allow_insecure=true
refused "a listen address without a port" "server.listen localhost: cannot listen there: 'localhost' is not HOST:PORT" \
  --listen localhost
refused "a unix socket in a missing directory" \
  "server.listen unix:$tmp/nodir/psd.sock: cannot listen there: cannot create the socket $tmp/nodir/psd.sock" \
  --listen "unix:$tmp/nodir/psd.sock"
long="$tmp/$(printf 's%.0s' $(seq 110)).sock"
refused "a unix socket path longer than sun_path" \
  "server.listen unix:$long: cannot listen there: the socket path $tmp/s*\.\.\. is 1[0-9][0-9] bytes; a unix socket path holds at most 107" \
  --listen "unix:$long"
# a certificate and a key that is not its: PEM files both, refused only once gRPC's (or the metrics
# port's) TLS pairs them
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=localhost)
openssl req -x509 "${ec[@]}" -keyout "$tmp/a.key" -out "$tmp/a.pem" 2>/dev/null
openssl req -x509 "${ec[@]}" -keyout "$tmp/b.key" -out "$tmp/b.pem" 2>/dev/null
refused "a key that is not the certificate's" "TLS: gRPC refused the server certificate $tmp/a.pem with key $tmp/b.key" \
  --set security.tls=true --set security.cert="$tmp/a.pem" --set security.key="$tmp/b.key"
refused "metrics HTTPS with a key that is not the certificate's" \
  "server.metrics_tls: libmicrohttpd could not start with TLS (does security.key match security.cert?)" \
  --set server.metrics_tls=true --set security.cert="$tmp/a.pem" --set security.key="$tmp/b.key"
refused "metrics HTTPS with a missing certificate" "server.metrics_tls: security.cert $tmp/nope.pem" \
  --set server.metrics_tls=true --set security.cert="$tmp/nope.pem" --set security.key="$tmp/a.key"
# a checkpoint_dir whose only checkpoint does not load (as one of another model or optimizer would not)
mkdir "$tmp/ckbad"; echo "not safetensors" >"$tmp/ckbad/ckpt-000000000007.safetensors"
refused "a checkpoint_dir whose checkpoints cannot be used" \
  "server.checkpoint_dir: $tmp/ckbad: none of the 1 checkpoints can be used" --set server.checkpoint_dir="$tmp/ckbad"
[ -f "$tmp/ckbad/ckpt-000000000007.safetensors" ] || fail "--check-config renamed a refused checkpoint"
# a checkpoint_dir to be created where this user may not create it (root may anywhere: as nobody)
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  chmod 755 "$tmp"; mkdir -m 755 "$tmp/ro"
  if setpriv --reuid=65534 --regid=65534 --clear-groups "$BUILD/bin/psd" --check-config configs/psd.yaml \
       --set server.metrics_listen= --set server.checkpoint_dir="$tmp/ro/ck" >"$tmp/out" 2>&1; then
    cat "$tmp/out"; fail "--check-config passed a checkpoint_dir it may not create"; fi
  grep -q "server.checkpoint_dir: checkpoint dir $tmp/ro/ck: cannot create it in $tmp/ro: Permission denied" "$tmp/out" ||
    { cat "$tmp/out"; fail "a checkpoint_dir it may not create: no message naming it"; }
  chmod 700 "$tmp"
  echo "ok: --check-config refuses a checkpoint_dir it may not create (as nobody)"
else
  echo "skip: a checkpoint_dir it may not create (needs root and setpriv)"
fi
# where access() says writable but mkdir or creat fails (root under /proc): --check-config tries it
if [ "$(id -u)" = 0 ] && [ -d /proc/self ]; then
  refused "a checkpoint_dir to be created under /proc" \
    "server.checkpoint_dir: checkpoint dir /proc/psd-ck/a: cannot create it in /proc:" --set server.checkpoint_dir=/proc/psd-ck/a
  refused "/proc as the checkpoint_dir" "server.checkpoint_dir: checkpoint dir /proc: cannot create files in it:" \
    --set server.checkpoint_dir=/proc
else
  echo "skip: a checkpoint_dir under /proc (access() refuses it already unless root)"
fi
mkdir -p "$tmp/ckprobe"
psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ckprobe" --set server.metrics_listen= \
  >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "an empty writable checkpoint_dir failed --check-config"; }
psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ckprobe/new/dir" --set server.metrics_listen= \
  >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "a checkpoint_dir to be created failed --check-config"; }
[ -z "$(ls -A "$tmp/ckprobe")" ] || fail "--check-config left its probe behind: $(ls -A "$tmp/ckprobe")"
echo "ok: --check-config's checkpoint_dir probes leave nothing behind"
# values start-up (or the trainers) would refuse, named by key at --check-config
refused "a server.address trainers cannot dial" \
  "server.address: '127.0.0.1:99999' is not HOST:PORT (HOST an IPv4 address, .IPv6 address. or a host name; PORT 1..65535), unix:PATH nor local:PATH" \
  --set server.address=127.0.0.1:99999
if "$BUILD/bin/ps-train" --server bogus --max-batches 1 >"$tmp/out" 2>&1; then fail "ps-train took --server bogus"; fi
grep -q "ps-train: command line: server.address: 'bogus' is not HOST:PORT" "$tmp/out" ||
  { cat "$tmp/out"; fail "ps-train --server bogus: no message naming server.address"; }
echo "ok: ps-train refuses a server.address it cannot dial: $(head -c 90 "$tmp/out")"
refused "a stop_metric that is no scalar name" "server.stop_metric: 'running reward' is not a scalar name" \
  --set server.stop_metric="running reward"
refused "a recv_timeout_s below the rpc server's millisecond" "server.recv_timeout_s: '0.0005' is out of range .0.001, 3600." \
  --set server.recv_timeout_s=0.0005
out=$(psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck2" --set server.metrics_listen= \
  --set server.stop_metric=accuracy 2>&1) || fail "a stop_metric of one's own failed --check-config: $out"
[[ "$out" == *"psd: warning: server.stop_metric: no shipped trainer reports a scalar 'accuracy' (they report: reward, loss)"* ]] ||
  fail "no warning about a stop_metric no shipped trainer reports: $out"
out=$(psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck2" --set server.metrics_listen= \
  --set server.stop_metric=reward 2>&1) || fail "stop_metric reward failed --check-config: $out"
[[ "$out" != *"server.stop_metric"* ]] || fail "a warning about stop_metric reward: $out"
echo "ok: a stop_metric no shipped trainer reports is a warning only (reward is none)"
psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck2" --set security.tls=true \
  --set security.cert="$tmp/a.pem" --set security.key="$tmp/a.key" --set server.metrics_tls=true >"$tmp/out" 2>&1 ||
  { cat "$tmp/out"; fail "a matching certificate and key (gRPC and metrics TLS) failed --check-config"; }
if psd --config configs/psd.yaml --listen "127.0.0.1:$((port + 7))" --set server.metrics_listen= --set security.tls=true \
     --set server.checkpoint_dir="$tmp/ck3" \
     --set security.cert="$tmp/a.pem" --set security.key="$tmp/b.key" >"$tmp/out" 2>&1; then
  fail "psd started with a key that is not its certificate's"; fi
grep -q "TLS: gRPC refused the server certificate $tmp/a.pem with key $tmp/b.key" "$tmp/out" ||
  { cat "$tmp/out"; fail "start-up with a key that is not the certificate's: no message naming them"; }
echo "ok: start-up with a key that is not the certificate's names both files (not 'address in use')"
out=$(psd --check-config configs/psd.yaml --set server.checkpoint_dir="$tmp/ck" --listen "127.0.0.1:$port" 2>&1) ||
  fail "a busy port failed --check-config: $out"
[[ "$out" == *"already in use"* ]] || fail "no warning about the busy port: $out"
echo "ok: a busy port is a warning only"
[[ "$out" == *"server.checkpoint_dir: checkpoint dir $tmp/ck is in use by a running psd"* ]] ||
  fail "no warning about the running psd's checkpoint dir: $out"
grep -q "^cluster psd$" "$tmp/ck/psd.lock" && grep -q "^server $" "$tmp/ck/psd.lock" ||
  fail "the lock file does not name the server: $(cat "$tmp/ck/psd.lock")"
if "$BUILD/bin/psd" --config configs/psd.yaml --listen "127.0.0.1:$((port + 5))" --set server.checkpoint_dir="$tmp/ck" \
     >"$tmp/out" 2>&1; then fail "a second psd started on the running one's checkpoint dir"; fi
grep -q "checkpoint dir $tmp/ck is in use by a running psd (server (single-server form) of cluster psd, " "$tmp/out" ||
  { cat "$tmp/out"; fail "no clear refusal of a held checkpoint dir"; }
echo "ok: a second psd on a held checkpoint dir is refused: $(grep -o 'checkpoint dir .*' "$tmp/out" | head -n 1)"
# ---- several PS nodes (servers.*) ----
out=$(psd --check-config configs/cluster-lm.yaml 2>&1) || fail "configs/cluster-lm.yaml: $out"
for want in "ps0 (127.0.0.1:50071) hosts: emb rows [0, 5000) of 10000" "ps1 (127.0.0.1:50072) hosts: emb rows [5000, 10000)" \
            "ps2 (127.0.0.1:50073) hosts: decoder on cpu, rnn on cpu"; do
  [[ "$out" == *"$want"* ]] || fail "cluster-lm --check-config lacks '$want': $out"
done
echo "ok: configs/cluster-lm.yaml (emb sharded over ps0, ps1; decoder, rnn on ps2) passes --check-config"
out=$(psd --check-config configs/cluster-mnist.yaml --name ps1 2>&1) || fail "cluster-mnist --name ps1: $out"
[[ "$out" == *"configuration OK for ps1 of cluster mnist-2"* && "$out" == *"ps1 (127.0.0.1:50062) hosts: fc on cpu"* &&
   "$out" != *"ps0 ("* ]] || fail "cluster-mnist --name ps1: $out"
echo "ok: --check-config --name ps1 prints what ps1 hosts: $(grep -o 'ps1 (.*' <<<"$out")"
refused_cluster() {  # what needle args...
  local what=$1 needle=$2; shift 2
  if psd "$@" >"$tmp/out" 2>&1; then cat "$tmp/out"; fail "psd $* passed $what"; fi
  grep -qF -- "$needle" "$tmp/out" || { cat "$tmp/out"; fail "$what: expected '$needle'"; }
  echo "ok: psd refuses $what: $(grep -oF -- "$needle" "$tmp/out" | head -n 1)"
}
refused_cluster "sync across servers" \
  "server.consistency: sync needs one server: stages span ps0, ps1, ps2; use hogwild until a cross-server round exists" \
  --check-config configs/cluster-lm.yaml --set server.consistency=sync
refused_cluster "an unknown --name" "--name ps9: not a server of this config (servers: ps0, ps1, ps2)" \
  --check-config configs/cluster-lm.yaml --name ps9
refused_cluster "a cluster config without --name" \
  "this config describes servers ps0, ps1: start one with --name NAME" --config configs/cluster-mnist.yaml
refused_cluster "a stage on an undefined server" "model.placement.fc: server 'ps3' is not in servers (ps0, ps1)" \
  --check-config configs/cluster-mnist.yaml --set model.placement.fc=ps3
refused_cluster "two servers on one address" "servers.ps1.address: '127.0.0.1:50061' is also servers.ps0's address" \
  --check-config configs/cluster-mnist.yaml --set servers.ps1.address=127.0.0.1:50061
refused_cluster "two servers in one checkpoint_dir" \
  "servers.ps1.checkpoint_dir: '$tmp/cd' is servers.ps0's checkpoint directory too" \
  --check-config configs/cluster-mnist.yaml --set servers.ps0.checkpoint_dir="$tmp/cd" \
  --set servers.ps1.checkpoint_dir="$tmp/cd/"
refused_cluster "a server on another server's checkpoint dir (--check-config)" \
  "checkpoint dir $tmp/ck belongs to server (single-server form) of cluster psd" \
  --check-config configs/cluster-mnist.yaml --name ps1 --set servers.ps1.checkpoint_dir="$tmp/ck"
refused_cluster "a server on another server's checkpoint dir" \
  "checkpoint dir $tmp/ck belongs to server (single-server form) of cluster psd" \
  --config configs/cluster-mnist.yaml --name ps1 --set servers.ps1.checkpoint_dir="$tmp/ck" \
  --set servers.ps1.address="127.0.0.1:$((port + 6))"
refused_cluster "a server's metrics port on its gRPC port" \
  "servers.ps0.metrics_listen: '127.0.0.1:50061' is where servers.ps0.listen binds too ('127.0.0.1:50061')" \
  --check-config configs/cluster-mnist.yaml --set servers.ps0.metrics_listen=127.0.0.1:50061
refused_cluster "--listen with --name" "--listen does not apply with --name" \
  --check-config configs/cluster-mnist.yaml --name ps0 --listen 127.0.0.1:1
# psd --name ps1 binds servers.ps1's address, not server.listen
cport=$(( port + 2 ))
"$BUILD/bin/psd" --config configs/cluster-mnist.yaml --name ps1 --set servers.ps1.address="127.0.0.1:$cport" \
  --set server.listen="127.0.0.1:$port" 2>"$tmp/ps1.log" &
ps1pid=$!; pids+=($ps1pid)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$cport) 2>/dev/null && break; sleep 0.1; done
(exec 3<>/dev/tcp/127.0.0.1/$cport) 2>/dev/null || { cat "$tmp/ps1.log"; fail "psd --name ps1 does not listen on servers.ps1.address"; }
kill -TERM $ps1pid; wait $ps1pid || { cat "$tmp/ps1.log"; fail "psd --name ps1 did not stop cleanly"; }
echo "ok: psd --name ps1 listens on servers.ps1.address (127.0.0.1:$cport)"

kill -TERM $psdpid; wait $psdpid || { cat "$tmp/psd.log"; fail "psd with configs/psd.yaml did not stop cleanly"; }
echo "it_check_config: --check-config runs every start-up check; the shipped config starts: OK"
