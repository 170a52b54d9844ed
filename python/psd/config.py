"""The part of ps-train's YAML config a client reads (docs/config.md).

`psd.connect` takes the same file as `ps-train --config`: the servers to
dial (`server.address`, or `servers.<name>.address` for a cluster), the
message limit, the RPC deadline and retry budget (`trainer.*`), and TLS and
the token (`security.*`). Keys a client does not use (the model, the
optimizer, psd's own settings) are not checked here: `psd --check-config`
checks the whole file. The keys read here are checked as ps-train checks
them and a bad value is refused naming the file, the key and the value.

Where each stage lives is not read from `model.placement`: the client asks
every server what it hosts (ListParameters), so it cannot disagree with
them; the placement's order of stages is kept only to chain stages across
servers (`RemoteStage(None)`).
"""
import ipaddress
import os
import stat

from .errors import Error
import grpc

__all__ = ["Config", "load"]

# key: (type, default, low, high, low_open) as common/config.c's table.
_NUM = {
    "server.max_message_mb": (int, 64, 4, 2047, False),
    "trainer.rpc_timeout_s": (float, 60.0, 0.0, 3600.0, True),
    "trainer.retry_max_s": (float, 300.0, 0.0, 86400.0, False),
    "trainer.retry_backoff_s": (float, 0.2, 0.0, 60.0, True),
    "trainer.retry_backoff_max_s": (float, 10.0, 0.0, 600.0, True),
    "trainer.seed": (int, 0, 0, 2 ** 64 - 1, False),
}
_STR = ("server.address", "cluster.name", "security.ca", "security.client_cert", "security.client_key",
        "security.server_name", "security.token_file")
_BOOL = ("security.tls", "security.allow_insecure")


def _bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "yes", "on", "1"):
        return True
    if isinstance(v, str) and v.lower() in ("false", "no", "off", "0"):
        return False
    raise ValueError("not true or false")


def is_loopback(addr):
    """As common/rpc.c ps_rpc_addr_is_loopback: unix sockets, localhost,
    [::1] and 127.x.y.z (not a host name such as 127.example.com)."""
    a = addr
    if a.startswith("unix:") or a.startswith("unix-abstract:"):
        return True
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if a.startswith(scheme):
            a = a[len(scheme):]
            break
    if a == "localhost" or a.startswith("localhost:") or a == "[::1]" or a.startswith("[::1]:"):
        return True
    if not a.startswith("127."):
        return False
    host = a.rsplit(":", 1)[0] if ":" in a else a
    return all(c == "." or c.isdigit() for c in host)


class Server:
    """One psd: its name in messages, the address trainers dial, the name
    to verify in its certificate."""

    def __init__(self, name, address, tls_name=""):
        self.name, self.address, self.tls_name = name, address, tls_name

    def __str__(self):
        return f"{self.name} ({self.address})" if self.name else self.address


class Config:
    """What a client needs of a config: servers, limits, retry, security."""

    def __init__(self):
        self.origin = "defaults"
        self.servers = []          # [Server]; one with name "" in the single-server form
        self.cluster = "psd"
        self.stage_order = []      # model.placement's stages, in the file's order
        self.max_message_bytes = 64 << 20
        self.rpc_timeout_s = 60.0
        self.retry_max_s = 300.0
        self.retry_backoff_s = 0.2
        self.retry_backoff_max_s = 10.0
        self.seed = 0
        self.tls = False
        self.allow_insecure = False
        self.ca = self.client_cert = self.client_key = self.server_name = self.token_file = ""
        self.token = None          # the bearer token (token argument or security.token_file)
        self.flat = {}             # every key of the file, dotted ("model.sizes" and "servers" as mappings)

    def get(self, key, default=None):
        """The file's value of a dotted key (e.g. "model.sizes.dropout",
        "trainer.world_size"), or default; not checked here."""
        if key in self.flat:
            return self.flat[key]
        head, _, leaf = key.rpartition(".")
        sub = self.flat.get(head)
        return sub.get(leaf, default) if isinstance(sub, dict) else default

    # ---- credentials -------------------------------------------------------

    def _read(self, what, path, marker=None):
        try:
            with open(path, "rb") as f:
                data = f.read((1 << 20) + 1)
        except OSError as e:
            raise Error(grpc.StatusCode.NOT_FOUND, f"TLS: {what} {path}: {e.strerror}") from None
        if len(data) > 1 << 20:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"TLS: {what} {path}: larger than 1 MiB; not a PEM file")
        begin = data.find(b"-----BEGIN ")
        if marker and (begin < 0 or marker.encode() not in data[begin:]):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"TLS: {what} {path}: not a PEM file with a {marker} block")
        return data

    def credentials(self):
        """grpc.ChannelCredentials for TLS, or None for plaintext."""
        if not self.tls:
            if self.client_cert:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{self.origin}: security.client_cert is set but security.tls is false")
            return None
        if bool(self.client_cert) != bool(self.client_key):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                        "TLS: a client certificate needs both its certificate and its key file")
        ca = self._read("CA", self.ca, "CERTIFICATE") if self.ca else None
        cert = self._read("client certificate", self.client_cert, "CERTIFICATE") if self.client_cert else None
        key = self._read("client key", self.client_key, "PRIVATE KEY") if self.client_key else None
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def check_plaintext(self, address):
        if self.tls or self.allow_insecure or is_loopback(address):
            return
        raise Error(grpc.StatusCode.PERMISSION_DENIED,
                    f"server address \"{address}\": plaintext gRPC is only allowed on loopback addresses; "
                    "enable TLS (security.tls with security.ca) or set security.allow_insecure: true to send it "
                    "unencrypted")

    def read_token_file(self):
        """security.token_file's first word, refused as ps-train refuses it."""
        path = self.token_file
        try:
            mode = os.stat(path).st_mode
            with open(path, "rb") as f:
                text = f.read((1 << 20) + 1)
        except OSError as e:
            code = grpc.StatusCode.NOT_FOUND if isinstance(e, FileNotFoundError) else grpc.StatusCode.UNKNOWN
            hint = " (a leading ~ is not expanded: give the full path)" if path.startswith("~") else ""
            raise Error(code, f"token file {path}: {e.strerror}{hint}") from None
        if mode & stat.S_IROTH:
            raise Error(grpc.StatusCode.PERMISSION_DENIED,
                        f"token file {path}: readable by every user (mode {mode & 0o777:03o}); it holds secrets: "
                        f"chmod 600 {path}")
        words = text.decode("ascii", "replace").split()
        tok = words[0] if words else ""
        if not check_token(tok):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"token file {path}: the first line must hold a token of "
                        "16..256 printable characters")
        return tok


def check_token(tok):
    """16..256 printable ASCII characters without spaces (common/security.c)."""
    return isinstance(tok, str) and 16 <= len(tok) <= 256 and all(" " < c <= "~" for c in tok)


def _num(origin, key, v):
    typ, _, lo, hi, lo_open = _NUM[key]
    try:
        if isinstance(v, bool):
            raise ValueError
        x = typ(v) if typ is float else int(str(v), 10)
        if typ is float and x != x:
            raise ValueError
    except (TypeError, ValueError):
        raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                    f"{origin}: {key}: '{v}' is not {'a number' if typ is float else 'a whole number'}") from None
    if x < lo or x > hi or (lo_open and x == lo):
        raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                    f"{origin}: {key}: {v} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]")
    return x


_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.")
_UNIX_PATH_MAX = 107  # sockaddr_un.sun_path, NUL excluded


def _check_address(origin, key, v):
    """As common/config_cluster.c checks server.address: HOST:PORT (HOST an
    IPv4 address, [IPv6 address] or a host name; PORT 1..65535) or a unix
    socket, unix:PATH or unix:///ABSOLUTE, PATH 1..107 bytes."""
    bad = Error(grpc.StatusCode.INVALID_ARGUMENT,
                f"{origin}: {key}: '{v}' is not HOST:PORT (HOST an IPv4 address, [IPv6 address] or a host name; "
                f"PORT 1..65535) nor unix:PATH (a socket path of 1..{_UNIX_PATH_MAX} bytes)")
    if not isinstance(v, str) or not v:
        raise bad
    if v.startswith("local:"):
        raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                    f"{origin}: {key}: '{v}' is psd's local transport (server.local_socket), which ps-train and "
                    f"the C client speak, not this package: dial psd's gRPC address (server.listen) instead")
    if v.startswith("unix:"):
        path = v[5:]
        if path.startswith("//"):
            path = path[2:]
            if not path.startswith("/"):
                raise bad
        if not path or len(path.encode()) > _UNIX_PATH_MAX:
            raise bad
        return v
    host, sep, port = v.rpartition(":")
    ok = bool(sep and host and port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535)
    if ok and host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1] if host.endswith("]") else "x")
        except ValueError:
            ok = False
    elif ok:
        ok = (len(host) <= 253 and all(c in _HOST_CHARS for c in host) and host[0] not in "-." and
              ".." not in host)
    if not ok:
        raise bad
    return v


def _path_norm(p):
    """As common/config_cluster.c path_norm: a path as written, without
    "./" parts, repeated or trailing slashes."""
    out, i = [], 0
    while i < len(p):
        if p[i] == "/" and (p[i + 1:i + 2] == "/" or (p[i + 1:i + 2] == "." and p[i + 2:i + 3] in ("/", ""))):
            i += 1 if p[i + 1:i + 2] == "/" else 2
            continue
        if i == 0 and p.startswith("./"):
            i += 2
            continue
        out.append(p[i])
        i += 1
    while len(out) > 1 and out[-1] == "/":
        out.pop()
    return "".join(out)


def _address_key(v):
    """What makes two addresses one, as common/config_cluster.c compares
    servers.<name>.address: the same unix socket ("unix:///s/a.sock" is
    "unix:/s//a.sock"), or the same host ("localhost" is 127.0.0.1) and
    port."""
    if v.startswith("unix:"):
        p = v[5:]
        return ("unix", _path_norm(p[2:] if p.startswith("//") else p))
    host, _, port = v.rpartition(":")
    return ("tcp", "127.0.0.1" if host == "localhost" else host, int(port))


def _placement_order(placement):
    return [str(k) for k in placement] if isinstance(placement, dict) else []


def _leaves(d, prefix=""):
    """Flat dotted keys of the nested mapping d (servers.* and
    model.placement.* kept as their sub-mappings)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in ("servers", "model.placement", "model.sizes"):
            out.update(_leaves(v, key + "."))
        else:
            out[key] = v
    return out


def load(config_or_address, token=None, server=None, overrides=None):
    """A Config from a YAML path, an already parsed mapping, or a bare
    "HOST:PORT" address (defaults for everything else). server: override
    server.address (ps-train --server); overrides: {"dotted.key": value}
    as ps-train --set."""
    cfg = Config()
    raw = {}
    if isinstance(config_or_address, dict):
        raw, cfg.origin = config_or_address, "config"
    elif isinstance(config_or_address, (str, os.PathLike)):
        s = os.fspath(config_or_address)
        if os.path.exists(s) or s.endswith((".yaml", ".yml")):
            import yaml
            try:
                with open(s) as f:
                    raw = yaml.safe_load(f) or {}
            except OSError as e:
                raise Error(grpc.StatusCode.NOT_FOUND, f"config {s}: {e.strerror}") from None
            except yaml.YAMLError as e:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"config {s}: not valid YAML: {e}") from None
            if not isinstance(raw, dict):
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"config {s}: the top level is not a mapping")
            cfg.origin = s
        else:
            raw = {"server": {"address": s}}
            cfg.origin = "address"
    else:
        raise TypeError(f"psd.connect: a config path, a mapping or 'HOST:PORT', not {type(config_or_address).__name__}")
    flat = _leaves(raw)
    for k, v in (overrides or {}).items():
        if k.startswith("servers.") and k.count(".") == 2:
            _, name, field = k.split(".")
            flat.setdefault("servers", {})
            flat["servers"] = dict(flat["servers"] or {})
            flat["servers"][name] = dict(flat["servers"].get(name) or {}, **{field: v})
        else:
            flat[k] = v
    if server is not None:
        flat["server.address"] = server
    cfg.flat = flat
    o = cfg.origin
    for key in _NUM:
        if key in flat:
            setattr(cfg, {"server.max_message_mb": "max_message_bytes"}.get(key, key.split(".", 1)[1]),
                    _num(o, key, flat[key]))
    if "server.max_message_mb" in flat:
        cfg.max_message_bytes = int(cfg.max_message_bytes) << 20
    if cfg.retry_backoff_s > cfg.retry_backoff_max_s:  # as ps_config_check_cluster
        raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                    f"{o}: trainer.retry_backoff_s: {cfg.retry_backoff_s:g} is larger than "
                    f"trainer.retry_backoff_max_s ({cfg.retry_backoff_max_s:g}): the first wait before a retry "
                    "cannot be longer than the longest; raise trainer.retry_backoff_max_s or lower "
                    "trainer.retry_backoff_s")
    for key in _STR:
        if key in flat and flat[key] is not None and not isinstance(flat[key], str):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"{o}: {key}: '{flat[key]}' is not a string")
    for key in _BOOL:
        if key in flat:
            try:
                setattr(cfg, key.split(".", 1)[1], _bool(flat[key]))
            except ValueError:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{o}: {key}: '{flat[key]}' is not true or false") from None
    for key in ("ca", "client_cert", "client_key", "server_name", "token_file"):
        setattr(cfg, key, flat.get(f"security.{key}") or "")
    cfg.cluster = flat.get("cluster.name") or "psd"
    cfg.stage_order = _placement_order(flat.get("model.placement"))
    servers = flat.get("servers")
    if servers:
        if not isinstance(servers, dict):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"{o}: servers: a mapping of NAME: {{address: HOST:PORT}}")
        for name, d in servers.items():
            if not isinstance(d, dict) or "address" not in d:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"{o}: servers.{name}.address: missing (HOST:PORT)")
            addr = _check_address(o, f"servers.{name}.address", d["address"])
            for other in cfg.servers:
                if _address_key(other.address) == _address_key(addr):
                    raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                                f"{o}: servers.{name}.address: '{addr}' is also servers.{other.name}'s address "
                                f"'{other.address}'; each server needs its own")
            cfg.servers.append(Server(str(name), addr, d.get("server_name") or cfg.server_name))
    else:
        addr = _check_address(o, "server.address", flat.get("server.address", "127.0.0.1:50051"))
        cfg.servers.append(Server("", addr, cfg.server_name))
    if token is not None:
        if not check_token(token):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, "token: 16..256 printable characters without spaces")
        cfg.token = token
    elif cfg.token_file:
        cfg.token = cfg.read_token_file()
    return cfg
