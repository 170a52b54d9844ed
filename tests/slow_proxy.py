#!/usr/bin/python3
"""slow_proxy.py - a TCP proxy on loopback that makes a well-behaved gRPC
client look slow to psd, for tests/it_busy.sh: the request messages (HTTP/2
DATA frames, client to server) of the first HOLD streams it sees are held
DELAY seconds after their first DATA frame before they go on, as if the
client had paused between a call's headers and its message (a GC pause, a
loaded host). Everything else - other streams' frames, SETTINGS, PINGs,
WINDOW_UPDATEs, and all that psd sends back - passes at once. Plaintext
HTTP/2 only; it reads frame headers, never HPACK.

  slow_proxy.py UPSTREAM_PORT HOLD DELAY [--on-signal] [--skip K] [--log]

With --on-signal nothing is held until SIGUSR1, then the next HOLD streams
(a client's set-up calls pass untouched); with --skip K the first K streams
with a message pass untouched, then HOLD are held. --log prints each
stream's first DATA frame (its number and length) to stderr. Prints the port it listens on (127.0.0.1) on its first line, then runs until
killed; on SIGTERM it prints how many streams it held.
"""
import heapq
import signal
import socket
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Held:
    """The streams whose DATA is held, over all connections."""

    def __init__(self, n, delay, skip=0, log=False):
        self.left = n
        self.delay = delay
        self.skip = skip
        self.log = log
        self.seen = 0
        self.mu = threading.Lock()
        self.count = 0

    def take(self, ln):
        with self.mu:
            self.seen += 1
            if self.log:
                print(f"slow_proxy: stream {self.seen}: first DATA frame of {ln} bytes", file=sys.stderr, flush=True)
            if self.skip > 0:
                self.skip -= 1
                return False
            if self.left <= 0:
                return False
            self.left -= 1
            self.count += 1
            return True


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        b = sock.recv(n - len(buf))
        if not b:
            return None
        buf += b
    return buf


def pipe_up(src, dst):
    """psd -> client, as it comes."""
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            dst.sendall(b)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Down:
    """client -> psd: frames in order, but the held streams' DATA frames
    DELAY s after their stream's first one (a sender thread keeps the
    timetable; writes are whole frames under one lock)."""

    def __init__(self, client, server, held):
        self.c, self.s, self.held = client, server, held
        self.mu = threading.Condition()
        self.due = []  # (time, n, frame)
        self.n = 0
        self.streams = {}  # stream id -> release time (None: not held)
        self.closed = False

    def send(self, data):
        with self.mu:
            self.s.sendall(data)

    def sender(self):
        while True:
            with self.mu:
                while not self.closed and (not self.due or self.due[0][0] > time.monotonic()):
                    self.mu.wait(0.02 if self.due else 0.5)
                if self.closed and not self.due:
                    return
                if self.due and self.due[0][0] <= time.monotonic():
                    _, _, data = heapq.heappop(self.due)
                    try:
                        self.s.sendall(data)
                    except OSError:
                        self.due.clear()

    def run(self):
        threading.Thread(target=self.sender, daemon=True).start()
        try:
            pre = recv_exact(self.c, len(PREFACE))
            if pre != PREFACE:
                return
            self.send(pre)
            while True:
                h = recv_exact(self.c, 9)
                if h is None:
                    break
                ln = int.from_bytes(h[:3], "big")
                ftype, sid = h[3], int.from_bytes(h[5:9], "big") & 0x7FFFFFFF
                body = recv_exact(self.c, ln) if ln else b""
                if body is None:
                    break
                if ftype == 1 and sid not in self.streams:  # HEADERS of a new stream
                    self.streams[sid] = None
                if ftype == 0 and sid in self.streams:
                    if self.streams[sid] is None and self.held.take(ln):
                        self.streams[sid] = time.monotonic() + self.held.delay
                    if self.streams[sid] is not None and self.streams[sid] > 0:
                        with self.mu:
                            self.n += 1
                            heapq.heappush(self.due, (self.streams[sid], self.n, h + body))
                            self.mu.notify()
                        continue
                    self.streams[sid] = 0  # not held: pass from now on
                self.send(h + body)
        except OSError:
            pass
        with self.mu:
            self.closed = True
            self.mu.notify()


def serve(conn, upstream, held):
    try:
        up = socket.create_connection(("127.0.0.1", upstream))
    except OSError:
        conn.close()
        return
    threading.Thread(target=pipe_up, args=(up, conn), daemon=True).start()
    Down(conn, up, held).run()


def main():
    upstream, n, delay = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    opts = sys.argv[4:]
    armed = "--on-signal" in opts
    skip = int(opts[opts.index("--skip") + 1]) if "--skip" in opts else 0
    held = Held(0 if armed else n, delay, skip, "--log" in opts)

    def arm(*_):
        with held.mu:
            held.left = n

    signal.signal(signal.SIGUSR1, arm)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    print(ls.getsockname()[1], flush=True)

    def stop(*_):
        print(f"slow_proxy: held the messages of {held.count} streams {delay:g} s", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        conn, _ = ls.accept()
        threading.Thread(target=serve, args=(conn, upstream, held), daemon=True).start()


if __name__ == "__main__":
    main()
