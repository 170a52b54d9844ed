#!/usr/bin/python3
"""python/psd over TLS with tokens, from the same YAML as ps-train
(tests/it_py_security.sh runs it).

    security_check.py TRAINER_YAML READER_TOKEN ROGUE_CA BAD_TOKEN_FILE

psd runs with mutual TLS and a tokens file (a trainer and a reader token).
TRAINER_YAML is a trainer's config: security.tls, ca, client_cert/key,
server_name (psd.test, a name in psd's certificate other than the address
dialled) and token_file. Checks: a batch trains and steps; the reader token
reads Status but its training Forward is refused PERMISSION_DENIED; an
unknown token UNAUTHENTICATED; a world-readable token file, plaintext to a
non-loopback address, a server.address no trainer can dial and client TLS
options without TLS are refused before anything is sent; a rogue CA does not
connect.
"""
import os
import sys

import grpc
import torch
import torch.nn.functional as F

import psd


def refused(fn, code, *words):
    try:
        fn()
    except psd.Error as e:
        assert e.code == code, f"expected {code.name}, got {e}"
        for w in words:
            assert w in str(e), f"'{w}' not in: {e}"
        return str(e)
    raise AssertionError(f"expected {code.name}; it succeeded")


def main():
    yaml_path, reader, rogue_ca, bad = sys.argv[1:5]
    torch.set_num_threads(1)
    c = psd.connect(yaml_path)
    assert c.cfg.tls and c.cfg.token and c.conns[0].server.tls_name == "psd.test"
    net = psd.RemoteStage(None, c)
    with psd.context(c) as ctx:
        loss = F.nll_loss(net(torch.randn(8, 1, 28, 28)), torch.arange(8))
        loss.backward()
        r = ctx.step()
    assert r.version == 1, r
    print(f"ok: a batch over mutual TLS with the trainer's token (server name psd.test): version {r.version}")

    rd = psd.connect(yaml_path, token=reader)
    assert rd.status()["model_version"] == 1
    m = refused(lambda: _train(rd),
                grpc.StatusCode.PERMISSION_DENIED, "may not call")
    print(f"ok: the reader token reads Status, training refused: {m}")
    m = refused(lambda: psd.connect(yaml_path, token="0123456789abcdef0123456789abcdef", wait_s=5),
                grpc.StatusCode.UNAUTHENTICATED, "invalid token")
    print(f"ok: an unknown token: {m}")
    os.chmod(bad, 0o644)
    m = refused(lambda: psd.connect(yaml_path, overrides={"security.token_file": bad}),
                grpc.StatusCode.PERMISSION_DENIED, "readable by every user", "chmod 600")
    print(f"ok: {m}")
    m = refused(lambda: psd.connect(yaml_path, overrides={"security.token_file": "~/.psd-token-of-security_check"}),
                grpc.StatusCode.NOT_FOUND, "a leading ~ is not expanded")
    print(f"ok: {m}")
    m = refused(lambda: psd.connect(c.conns[0].server.address, wait_s=1), grpc.StatusCode.UNAVAILABLE,
                "if psd serves TLS, set security.tls: true and security.ca")
    print(f"ok: plaintext to psd's TLS port: {m}")
    m = refused(lambda: psd.connect(yaml_path, overrides={"security.client_cert": "", "security.client_key": ""},
                                    wait_s=1), grpc.StatusCode.UNAVAILABLE,
                "if psd requires one (security.mutual_tls), set security.client_cert and security.client_key")
    print(f"ok: no client certificate for a mutual-TLS psd: {m}")
    m = refused(lambda: psd.connect("10.0.0.1:50051", wait_s=1), grpc.StatusCode.PERMISSION_DENIED,
                "plaintext gRPC is only allowed on loopback")
    print(f"ok: {m}")
    for addr in ("bad_host:50051", "127.0.0.1:99999", "unix:"):  # as ps-train and psd --check-config refuse them
        m = refused(lambda: psd.connect(yaml_path, server=addr), grpc.StatusCode.INVALID_ARGUMENT,
                    f"server.address: '{addr}' is not HOST:PORT", "nor unix:PATH")
    print(f"ok: {m}")
    m = refused(lambda: psd.connect("local:/run/psd/local.sock", wait_s=1), grpc.StatusCode.INVALID_ARGUMENT,
                "is psd's local transport (server.local_socket)", "not this package")
    print(f"ok: {m}")
    m = refused(lambda: psd.connect(yaml_path, overrides={"security.tls": "false"}),
                grpc.StatusCode.INVALID_ARGUMENT, "security.client_cert is set but security.tls is false")
    print(f"ok: {m}")
    m = refused(lambda: psd.connect(yaml_path, overrides={"security.ca": rogue_ca, "trainer.rpc_timeout_s": 3},
                                    wait_s=2), grpc.StatusCode.UNAVAILABLE)
    print("ok: a rogue CA does not connect (UNAVAILABLE)")
    print("security_check: TLS, mutual TLS, server_name, tokens and refusals from the YAML: OK")


def _train(client):
    net = psd.RemoteStage(None, client)
    with psd.context(client) as ctx:
        F.nll_loss(net(torch.randn(2, 1, 28, 28)), torch.arange(2)).backward()
        ctx.step()


if __name__ == "__main__":
    main()
