#!/usr/bin/python3
"""Compare two model files (docs/models.md) node by node: the same name,
max_batch, stages (names, inputs), nodes (names, kinds, inputs, attributes)
after resolving the model's sizes to their defaults and implicit wiring to
explicit inputs. `init:` entries are left out (psd-export's weights file
carries the initial values), as are comments and `about`.

    compare.py SHIPPED.yaml EXPORTED.yaml     exit 0 when equivalent, else 1
                                              printing every difference
"""
import sys

import yaml


def load(path):
    with open(path) as f:
        d = yaml.safe_load(f)
    sizes = {}
    for k, v in (d.get("sizes") or {}).items():
        sizes[k] = v["default"] if isinstance(v, dict) else v

    def res(v):
        if isinstance(v, list):
            return [res(x) for x in v]
        if isinstance(v, str) and v in sizes:
            return sizes[v]
        if isinstance(v, float) and v == int(v):
            return v
        return v

    out = {"name": d.get("name"), "max_batch": d.get("max_batch", 1024), "stages": []}
    for st in d["stages"]:
        inp = st.get("input")
        if inp is not None:
            inp = {"shape": res(list(inp.get("shape", []))), "dtype": inp.get("dtype", "float32")}
        nodes, prev = [], "input"
        for nd in st["nodes"]:
            nd = dict(nd)
            name, kind = nd.pop("name"), nd.pop("kind")
            nd.pop("init", None)
            if "inputs" in nd:
                ins = list(nd.pop("inputs"))
            elif "input" in nd:
                ins = [nd.pop("input")]
            else:
                ins = [prev]
            nodes.append({"name": name, "kind": kind, "inputs": ins,
                          "attrs": {k: res(v) for k, v in sorted(nd.items())}})
            prev = name
        out["stages"].append({"name": st["name"], "input": inp,
                              "output": st.get("output", nodes[-1]["name"] if nodes else None), "nodes": nodes})
    return out


def diff(a, b, where, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: {'missing in the shipped file' if k not in a else 'missing in the export'}"
                           f" ({a.get(k, b.get(k))!r})")
            else:
                diff(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and all(isinstance(x, dict) for x in a + b):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} entries in the shipped file, {len(b)} in the export "
                       f"({[x.get('name') for x in a]} vs {[x.get('name') for x in b]})")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{where}[{x.get('name', i)}]", out)
    elif a != b and not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)
                         and not isinstance(a, bool) and not isinstance(b, bool)):
        out.append(f"{where}: {a!r} in the shipped file, {b!r} in the export")


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    out = []
    diff(a, b, "model", out)
    for line in out:
        print(line)
    if out:
        return 1
    n = sum(len(s["nodes"]) for s in a["stages"])
    print(f"equivalent: {a['name']}, {len(a['stages'])} stages, {n} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
