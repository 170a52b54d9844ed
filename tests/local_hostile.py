"""A hostile or broken client of psd's local transport (common/rpc_local.h),
written from the header's layout, not from psd's code: what psd answers to
malformed hellos and requests, and to a flood of connections.

    local_hostile.py SOCKET garbage   -> one line per case: "case code"
    local_hostile.py SOCKET flood N   -> opens N connections with valid
        hellos, prints "ok=K refused=R other=O", holds them until stdin closes
        (with $TOKEN: the hellos carry it)

Codes are gRPC status codes (0 OK, 3 INVALID_ARGUMENT, 8 RESOURCE_EXHAUSTED,
12 UNIMPLEMENTED, 14 UNAVAILABLE); -1: psd closed the connection without
an answer."""
import fcntl
import os
import socket
import struct
import sys

MAGIC = 0x314C5350  # "PSL1"
HELLO = struct.Struct("=IIQI")       # magic, version, region, token_len; token follows
WELCOME = struct.Struct("=IiiIQ")    # magic, code, retry_after_ms, reserved, max_request; details follow
REQUEST = struct.Struct("=IIQqI")    # magic, seq, len, timeout_ms, path_len; path follows
REPLY = struct.Struct("=IIiiQ")      # magic, seq, code, retry_after_ms, len; details follow
REGION = 1 << 16


def memfd(size, seal=True):
    fd = os.memfd_create("hostile", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(30)
    s.connect(path)
    return s


def answer_code(s, st, seq=None):
    """The code of psd's next message on s, laid out as st (WELCOME: code
    second; REPLY: seq second, code third): -1 when none came, -2 when it is
    not an answer (magic, or seq when given)."""
    try:
        m = s.recv(4096)
    except OSError:
        return -1
    if len(m) < st.size:
        return -1
    f = st.unpack_from(m)
    if f[0] != MAGIC or (seq is not None and f[1] != seq):
        return -2
    return f[1] if st is WELCOME else f[2]


def hello(path, region=REGION, fd_size=None, seal=True, magic=MAGIC, version=1, send_fd=True, raw=None, token=b""):
    s = connect(path)
    msg = raw if raw is not None else HELLO.pack(magic, version, region, len(token)) + token
    if send_fd:
        fd = memfd(fd_size if fd_size is not None else 2 * region, seal)
        socket.send_fds(s, [msg], [fd])
        os.close(fd)
    else:
        s.send(msg)
    return s, answer_code(s, WELCOME)


def call(s, path_bytes, length, seq=1, raw=None):
    msg = raw if raw is not None else REQUEST.pack(MAGIC, seq, length, 5000, len(path_bytes)) + path_bytes
    s.send(msg)
    return answer_code(s, REPLY, seq)


def garbage(path):
    cases = []
    s, c = hello(path, send_fd=False)
    cases.append(("hello_without_memfd", c)); s.close()
    s, c = hello(path, seal=False)
    cases.append(("unsealed_memfd", c)); s.close()
    s, c = hello(path, fd_size=REGION)
    cases.append(("memfd_of_the_wrong_size", c)); s.close()
    s, c = hello(path, magic=0x12345678)
    cases.append(("bad_magic", c)); s.close()
    s, c = hello(path, version=99)
    cases.append(("bad_version", c)); s.close()
    s, c = hello(path, region=16)
    cases.append(("tiny_region", c)); s.close()
    s, c = hello(path, raw=b"\x00" * 3)
    cases.append(("truncated_hello", c)); s.close()
    # calls on a connection that was welcomed
    s, c = hello(path)
    assert c == 0, "a valid hello was refused: %d" % c
    cases.append(("unknown_method", call(s, b"/ps.ParameterServer/NoSuchMethod", 0, seq=1)))
    cases.append(("request_longer_than_region", call(s, b"/ps.ParameterServer/Forward", REGION + 1, seq=2)))
    cases.append(("request_of_2^63_bytes", call(s, b"/ps.ParameterServer/Forward", 1 << 63, seq=3)))
    cases.append(("garbage_request_bytes", call(s, b"/ps.ParameterServer/Forward", 100, seq=4)))
    # too short to carry its seq: the answer has seq 0
    cases.append(("truncated_request", call(s, b"", 0, seq=0, raw=b"\x01\x02\x03")))
    try:
        after = s.recv(16)
        cases.append(("closed_after_malformed", 0 if after == b"" else -3))
    except OSError:
        cases.append(("closed_after_malformed", 0))
    s.close()
    for name, code in cases:
        print(name, code)


def flood(path, n):
    held, ok, refused, other = [], 0, 0, 0
    token = os.environ.get("TOKEN", "").encode()
    for _ in range(n):
        try:
            s, c = hello(path, token=token)
        except OSError:
            other += 1
            continue
        if c == 0:
            ok += 1
            held.append(s)
        elif c == 8:
            refused += 1
            s.close()
        else:
            other += 1
            s.close()
    print("ok=%d refused=%d other=%d" % (ok, refused, other), flush=True)
    sys.stdin.read()
    for s in held:
        s.close()


if __name__ == "__main__":
    if sys.argv[2] == "garbage":
        garbage(sys.argv[1])
    else:
        flood(sys.argv[1], int(sys.argv[3]))
