#!/usr/bin/python3
"""many_conns.py - psd's metrics port with more than 1,024 descriptors open
in psd (tests/it_hostile.sh): opens N idle TCP connections to psd's gRPC
port (loopback only, N bounded), then fetches /metrics and /healthz several
times. libmicrohttpd on select() cannot take descriptors past FD_SETSIZE
(1024) and resets those connections.

  many_conns.py GRPC_PORT METRICS_PORT N
"""
import resource
import socket
import sys
import time
import urllib.request


def main():
    gport, mport, n = int(sys.argv[1]), int(sys.argv[2]), min(int(sys.argv[3]), 3000)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
    conns = []
    for _ in range(n):
        conns.append(socket.create_connection(("127.0.0.1", gport), timeout=5))
    time.sleep(1.0)  # psd accepts them
    ok = 0
    errors = []
    for i in range(10):
        for path in ("/metrics", "/healthz"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{mport}{path}", timeout=10) as r:
                    body = r.read()
                    ok += r.status == 200 and len(body) > 0
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                errors.append(f"{path}: {e}")
    for c in conns:
        c.close()
    print(f"{n} idle gRPC connections open: {ok}/20 metrics/health requests answered"
          + (f"; errors: {errors[:2]}" if errors else ""))
    sys.exit(0 if ok == 20 else 1)


if __name__ == "__main__":
    main()
