"""A connection to psd: one gRPC channel per server of the config, and what
each hosts (docs/python.md).

`connect()` dials every server of the config (one for the single-server
form, servers.* for a cluster), waits up to wait_s for each to answer
ListParameters, and learns from the answers which server hosts which
stage, which rows of a sharded table each shard holds, and every
parameter. Calls outside a context (inference Forwards, GetParameters,
Status) are retried under a fresh budget each (docs/protocol.md).
"""
import collections
import logging
import random
import threading
import time

import grpc
import torch

from . import config as _config
from ._proto import ps_pb2, ps_pb2_grpc
from .errors import Error, from_rpc
from .retry import Budget, ContextIds
from .tensors import from_wire

log = logging.getLogger("psd")

_default = None                 # the latest connect()
_default_lock = threading.Lock()


def read_pages(call, req, field, where):
    """Every page of a paged read (GetParameters, GetGradients): call(req)
    answers one page; while its `more` is set the next request starts at its
    next / next_row. A tensor cut between pages (first_rows) is put back
    together. Returns (OrderedDict name -> whole tensor, the first reply).
    A psd that does not page sends whole tensors and no `more`."""
    method = type(req).__name__[:-len("Request")]
    parts = collections.OrderedDict()
    first_reply = None
    while True:
        r = call(req)
        if first_reply is None:
            first_reply = r
        tensors = getattr(r, field)
        if (r.first_rows or r.more) and len(r.first_rows) != len(tensors):
            raise Error(grpc.StatusCode.INTERNAL, f"{method} reply: {len(tensors)} tensors, {len(r.first_rows)} "
                        "first_rows", method, where)
        for i, t in enumerate(tensors):
            first = r.first_rows[i] if r.first_rows else 0
            lst = parts.setdefault(t.name, [])
            have = sum(x.shape[0] for x in lst) if lst and lst[0].dim() else 0
            if first != have:
                raise Error(grpc.StatusCode.INTERNAL, f"{method}: page of {t.name} starts at row {first}, "
                            f"expected {have}", method, where)
            lst.append(from_wire(t))
        if not r.more:
            break
        if (r.next, r.next_row) <= (req.first, req.first_row):
            raise Error(grpc.StatusCode.INTERNAL, f"{method} reply: paging does not advance", method, where)
        nxt = type(req)()
        nxt.CopyFrom(req)
        nxt.first, nxt.first_row = r.next, r.next_row
        req = nxt
    out = collections.OrderedDict((k, v[0] if len(v) == 1 else torch.cat(v)) for k, v in parts.items())
    return out, first_reply


def default_client(client=None):
    """client, or the latest psd.connect()."""
    if client is not None:
        return client
    if _default is None:
        raise Error(grpc.StatusCode.FAILED_PRECONDITION, "no psd client: call psd.connect(...) first or pass client=")
    return _default


def message_dict(m):
    """A protobuf message as a plain dict: every field (defaults too),
    64-bit integers as ints, repeated fields as lists, messages as dicts."""
    out = {}
    for f in m.DESCRIPTOR.fields:
        v = getattr(m, f.name)
        if f.label == f.LABEL_REPEATED:
            out[f.name] = [message_dict(x) if f.message_type else x for x in v]
        elif f.message_type:
            out[f.name] = message_dict(v)
        else:
            out[f.name] = v
    return out


class Stage:
    """Where a stage lives: one server (conn), or shards [(conn, lo, hi)]."""

    def __init__(self, info, conn):
        self.name = info.name
        self.input_shape = tuple(info.input_shape)
        self.input_dtype = info.input_dtype
        self.output_shape = tuple(info.output_shape)
        self.conn = None
        self.shards = []
        self.rows = 0
        self.add(info, conn)

    def add(self, info, conn):
        if info.row_lo == 0 and info.row_hi == 0:
            if self.conn is not None or self.shards:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"stage '{self.name}' is hosted by both "
                            f"{self.conn or self.shards[0][0]} and {conn}")
            self.conn = conn
        else:
            if self.conn is not None:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"stage '{self.name}' is hosted whole by {self.conn} "
                            f"and as a shard by {conn}")
            self.shards.append((conn, info.row_lo, info.row_hi))
            self.shards.sort(key=lambda s: s[1])


class Conn:
    """One psd: its channel and what it hosts."""

    def __init__(self, client, index, server):
        self.client, self.index, self.server = client, index, server
        self.name = server.name or server.address
        self.channel = self.stub = None
        self.model = ""
        self.stages = []        # StageInfo, model order
        self.params = []        # ParameterInfo
        self.open()

    def __str__(self):
        return str(self.server)

    def open(self):
        cfg = self.client.cfg
        cfg.check_plaintext(self.server.address)
        opts = [("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.max_send_message_length", cfg.max_message_bytes),
                # a cut link shows up within ~15 s as UNAVAILABLE while a call waits
                ("grpc.keepalive_time_ms", 10000), ("grpc.keepalive_timeout_ms", 5000),
                ("grpc.http2.max_pings_without_data", 0),
                # reconnect quickly once a restarted psd is back; our own retries decide when
                ("grpc.max_reconnect_backoff_ms", 5000), ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.dns_min_time_between_resolutions_ms", 200),
                ("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]
        creds = cfg.credentials()
        if creds is None:
            self.channel = grpc.insecure_channel(self.server.address, options=opts)
        else:
            if self.server.tls_name:
                opts.append(("grpc.ssl_target_name_override", self.server.tls_name))
            self.channel = grpc.secure_channel(self.server.address, creds, options=opts)
        self.stub = ps_pb2_grpc.ParameterServerStub(self.channel)

    def reopen(self):
        """After UNAVAILABLE: a fresh channel, so the next try connects now
        instead of waiting out gRPC's reconnect backoff (as ps-train resets
        it)."""
        old = self.channel
        self.open()
        try:
            old.close()
        except Exception:  # noqa: BLE001 - closing a broken channel
            pass

    def call(self, method, req, timeout=None):
        """`method`, sent again as it is while psd refuses it for its
        admission limits (a client over its fair share of calls or context
        memory: psd.Error.busy; the call did nothing there, so exactly once
        holds) after a backoff of at least psd's hint, within a budget of its
        own (trainer.retry_max_s); any other refusal, or the budget spent, as
        psd.Error (docs/protocol.md, "Statuses")."""
        c = self.client
        budget = None
        while True:
            try:
                return self.call_once(method, req, timeout)
            except Error as err:
                if not err.busy:
                    raise
                budget = budget or c.new_budget()
                if not budget.wait(method, str(err), min_s=err.retry_after_ms / 1000.0, busy=True):
                    raise

    def call_once(self, method, req, timeout=None):
        """One try of `method`; psd's refusal as psd.Error."""
        c = self.client
        try:
            return getattr(self.stub, method)(req, timeout=timeout or c.cfg.rpc_timeout_s, metadata=c.metadata)
        except grpc.RpcError as e:
            err = from_rpc(e, method, str(self))
            if err.code == grpc.StatusCode.UNAVAILABLE:
                self.reopen()
            raise err from None


class Client:
    """psd's servers as one model. Create with psd.connect()."""

    def __init__(self, cfg, rank=1, wait_s=30.0):
        if not isinstance(rank, int) or not 0 <= rank < 2 ** 32:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"rank {rank!r}: a trainer rank 0..2^32-1")
        self.cfg = cfg
        self.rank = rank
        self.metadata = (("authorization", f"Bearer {cfg.token}"),) if cfg.token else None
        self.ids = ContextIds()
        self.who = f"psd: rank {rank}"
        self.retries = 0            # RPC retries so far, all budgets
        self._jitter = random.Random(self.ids.base ^ rank)
        self.conns = [Conn(self, i, s) for i, s in enumerate(cfg.servers)]
        self.seen_version = {}      # conn index -> the latest model_version a reply carried
        self.partial_steps = 0      # batches applied on some servers, lost on others
        self.reruns = 0             # batches run again with nothing applied
        self.released = 0           # contexts released unstepped on a server (ReleaseContext answered)
        self._report_unimplemented = False
        self._discover(wait_s)

    # ---- discovery ---------------------------------------------------------

    def _discover(self, wait_s):
        t0 = time.monotonic()
        self.model = ""
        self.stages = collections.OrderedDict()
        self.parameters = []
        for c in self.conns:
            while True:
                try:
                    r = c.call("ListParameters", ps_pb2.ListParametersRequest())
                    break
                except Error as e:
                    if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() - t0 > wait_s:
                        hint = ""
                        if e.code == grpc.StatusCode.UNAVAILABLE and "Socket closed" in e.details:
                            # what a plaintext client of a TLS psd, or one without the certificate a
                            # mutual-TLS psd wants, hears (psd drops it in its handshake)
                            if not self.cfg.tls:
                                hint = (" (this client dials plaintext: if psd serves TLS, set security.tls: true "
                                        "and security.ca)")
                            elif not self.cfg.client_cert:
                                hint = (" (this client sends no certificate: if psd requires one "
                                        "(security.mutual_tls), set security.client_cert and security.client_key)")
                        raise Error(e.code, f"cannot reach psd {c}: {e.details}{hint}", "ListParameters", str(c)) from None
                    time.sleep(0.2)
            if self.model and r.model != self.model:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"psd {c} serves model '{r.model}', but another server "
                            f"of the cluster serves '{self.model}'")
            self.model = r.model
            c.model, c.stages, c.params = r.model, list(r.stages), list(r.parameters)
            for s in r.stages:
                if s.name in self.stages:
                    self.stages[s.name].add(s, c)
                else:
                    self.stages[s.name] = Stage(s, c)
            for p in r.parameters:
                self.parameters.append({"name": p.name, "shape": tuple(p.shape), "stage": p.stage,
                                        "device": p.device, "sparse": p.sparse, "row_offset": p.row_offset,
                                        "rows_total": p.rows_total, "server": c.name})
        for st in self.stages.values():
            if st.shards:
                lo = 0
                for c, a, b in st.shards:
                    if a != lo:
                        raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"stage '{st.name}': rows [{lo}, {a}) are on no "
                                    f"server (shards: {', '.join(f'{x} [{y}, {z})' for x, y, z in st.shards)})")
                    lo = b
                st.rows = lo
        order = [s for s in self.cfg.stage_order if s in self.stages]
        if len(order) == len(self.stages):
            self.stages = collections.OrderedDict((s, self.stages[s]) for s in order)

    def stage(self, name):
        st = self.stages.get(name)
        if st is None:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"model {self.model} has no stage '{name}' (stages: "
                        f"{', '.join(self.stages)})")
        return st

    @property
    def single(self):
        """The one server every stage lives on, or None."""
        used = []
        for st in self.stages.values():
            for c in ([st.conn] if st.conn else [s[0] for s in st.shards]):
                if c not in used:
                    used.append(c)
        return used[0] if len(used) == 1 else None

    # ---- calls outside a context --------------------------------------------

    def new_budget(self):
        """A fresh retry budget (trainer.retry_*): one per unit of work."""
        c = self.cfg
        return Budget(c.retry_max_s, c.retry_backoff_s, c.retry_backoff_max_s, who=self.who,
                      seed=self._jitter.getrandbits(64), stats=self)

    def retrying(self, conn, method, req, what=None, budget=None, timeout=None):
        """conn.call under a fresh budget (or `budget`): UNAVAILABLE and
        DEADLINE_EXCEEDED are retried with backoff, anything else raised."""
        b = budget or self.new_budget()
        while True:
            try:
                return conn.call(method, req, timeout=timeout)
            except Error as e:
                if not e.retryable or not b.wait(what or method, str(e)):
                    raise

    def note_version(self, conn, v):
        self.seen_version[conn.index] = v

    def status(self):
        """psd's Status as a dict (model_version, samples, live_contexts,
        ...; proto/ps.proto StatusResponse). With several servers: the
        cluster name, the largest model_version and each server's dict
        under "servers"."""
        out = {}
        for c in self.conns:
            r = message_dict(self.retrying(c, "Status", ps_pb2.StatusRequest()))
            out[c.name] = r
        if len(self.conns) == 1:
            return out[self.conns[0].name]
        return {"cluster": self.cfg.cluster, "model": self.model,
                "model_version": max(r["model_version"] for r in out.values()), "servers": out}

    def get_parameters(self, conn, stage="", budget=None):
        """(OrderedDict name -> tensor, model_version) of conn's parameters
        (of one stage), its pages reassembled; budget: a context's, or a
        fresh one."""
        b = budget or self.new_budget()
        out, first = read_pages(lambda req: self.retrying(conn, "GetParameters", req, budget=b),
                                ps_pb2.GetParametersRequest(stage=stage), "parameters", str(conn))
        self.note_version(conn, first.model_version)
        return out, first.model_version

    def state_dict(self, stage=""):
        """Every parameter (of one stage) from every server, a sharded table
        put back together from its shards: a PyTorch state_dict."""
        out = collections.OrderedDict()
        filled = {}
        for c in self.conns:
            if stage and not any(s.name == stage for s in c.stages):
                continue
            got, _ = self.get_parameters(c, stage)
            info = {p.name: p for p in c.params}
            for k, v in got.items():
                p = info.get(k)
                if p is not None and p.rows_total:
                    if k not in out:
                        out[k] = torch.empty((p.rows_total,) + tuple(v.shape[1:]), dtype=v.dtype)
                        filled[k] = 0
                    out[k][p.row_offset:p.row_offset + v.shape[0]] = v
                    filled[k] += v.shape[0]
                elif k in out:
                    raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"parameter {k} is on two servers")
                else:
                    out[k] = v
        for k, n in filled.items():
            if n != out[k].shape[0]:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"parameter {k}: the shards hold {n} of its "
                            f"{out[k].shape[0]} rows")
        return out

    def report_partial(self, ctx_id, applied, lost):
        """ReportPartial to every server (best effort, as ps-train)."""
        req = ps_pb2.ReportPartialRequest(context_id=ctx_id, trainer_rank=self.rank,
                                          applied_on=[c.name for c in applied], lost_on=[c.name for c in lost])
        for c in self.conns:
            try:
                c.call("ReportPartial", req)
            except Error as e:
                if e.code == grpc.StatusCode.UNIMPLEMENTED:
                    if not self._report_unimplemented:
                        log.warning("%s: psd %s does not know ReportPartial (an older psd): partial steps are "
                                    "counted by this trainer only", self.who, c)
                    self._report_unimplemented = True
                else:
                    log.warning("%s: could not report the partial step of context %x to %s: %s", self.who, ctx_id,
                                c, e)

    def close(self):
        for c in self.conns:
            c.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        where = ", ".join(f"{st.name}: {st.conn.name if st.conn else ' + '.join(f'{c.name}[{a}:{b}]' for c, a, b in st.shards)}"
                          for st in self.stages.values())
        return f"<psd.Client model {self.model}, rank {self.rank}; {where}>"


def connect(config_or_address, token=None, *, rank=1, server=None, overrides=None, wait_s=30.0):
    """Connect to psd.

    config_or_address: the YAML file ps-train reads (`configs/local.yaml`;
    a cluster config dials every servers.<name>), a parsed mapping, or
    "HOST:PORT". token: a bearer token (else security.token_file). rank:
    this trainer's rank (ForwardRequest.trainer_rank: psd's status, ssp and
    the dropout streams; give each trainer its own). server: override
    server.address (ps-train --server). overrides: {"trainer.retry_max_s":
    60, ...} as ps-train --set. wait_s: how long to wait for each server to
    answer. The new client becomes the default of RemoteStage, context and
    HostedModule."""
    global _default
    cfg = _config.load(config_or_address, token=token, server=server, overrides=overrides)
    c = Client(cfg, rank=rank, wait_s=wait_s)
    with _default_lock:
        _default = c
    return c
