#!/usr/bin/python3
"""check_layers: the #include lines keep the layers of docs/architecture.md.

Each folder of C code is a layer and may include only headers of the layers it
sits on (LAYERS below); a few headers are allowed on their own (ALSO), and a
heavy library's header stays in the one place that owns it (OWNERS). Project
headers are included by bare name ("store.h"), so each name is found in exactly
one folder. Inside a folder of DAGS, the modules (a .c and its own .h are one)
include each other without a cycle, so their calls point one way too. Prints
every crossing and every cycle as file:line and exits 1 when there is one.

    /usr/bin/python3 tests/check_layers.py [TOP]
"""
import os
import re
import sys

# folder -> the folders whose headers it may include (its own always allowed)
LAYERS = {
    "util": [],
    "protocol": ["util"],
    "storage": ["util"],
    "rdma": ["util"],
    "client": ["util", "protocol", "rdma"],
    "src/cluster": ["util", "protocol", "storage", "rdma"],
    "src/rpc": ["util", "protocol", "storage", "rdma", "src/cluster"],
    "src": ["util", "protocol", "storage", "rdma", "src/rpc", "src/cluster"],
}

# folder -> single headers of another layer it may include
ALSO = {
    "storage": ["protocol/kverr.h"],   # the status codes every layer returns
    "rdma": ["protocol/kverr.h"],
    "src/rpc": ["src/config.h"],        # the limits a request is checked against
    "src/cluster": ["src/config.h"],    # the pool's settings
}

# OpenSSL's TLS: the daemon's contexts (tls.c), its TLS transport, the server that makes each
# connection's session, the client's TLS, and the pool's TLS to its peers (peer_tls.c) and to
# etcd (etcd.c, under libevent's bufferevent_openssl), with the helpers both share
# (cluster_tls.c), and OpenSSL's error text for all of them (util/tls_error.c). A connection
# reaches TLS only through its transport table (transport.h). (OpenSSL's hashes,
# openssl/sha.h and crypto.h, are not TLS.)
TLS_OWNERS = ["src/tls.c", "src/transport_tls.c", "src/server.c", "client/kvstash_wire.c",
              "src/cluster/peer_tls.c", "src/cluster/etcd.c", "src/cluster/cluster_tls.c",
              "util/tls_error.c"]

# system header prefix -> the only files (or folders, ending in /) that may include it
OWNERS = {
    "lmdb.h": ["storage/ssd_index.c"],
    "infiniband/": ["rdma/rdma_verbs.c"],
    # the loop and connection code, and the pool's etcd client and membership thread
    "event2/": ["src/server.c", "src/worker.c", "src/conn.c", "src/admin.c",
                "src/cluster/etcd.c", "src/cluster/member.c"],
    "openssl/ssl.h": TLS_OWNERS,
    "openssl/err.h": TLS_OWNERS,
    "openssl/x509": TLS_OWNERS,
}

# folders whose modules must include each other as a DAG (src/rpc/rpc.h: rpc.c ->
# the handler files -> the shared pieces -> rpc_req)
DAGS = ["src/rpc"]

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(path):
    """The layer a path (relative to the top) belongs to, or None."""
    folder = os.path.dirname(path)
    return folder if folder in LAYERS else None


def module_of(path):
    """The module of a file: its name without .c or .h."""
    return os.path.splitext(os.path.basename(path))[0]


def cycles(edges):
    """Each include that closes a cycle of edges {module: {module: (path, line)}},
    with the cycle, found by depth-first search."""
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n, where in sorted(edges.get(m, {}).items()):
            if state.get(n) == "open":
                found.append((where, stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found


def main():
    top = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    os.chdir(top)
    sources = []
    for folder in LAYERS:
        for name in sorted(os.listdir(folder)):
            if name.endswith((".c", ".h")):
                sources.append(os.path.join(folder, name))
    where = {}
    for path in sources:
        if path.endswith(".h"):
            name = os.path.basename(path)
            if name in where:
                print(f"{path}: header name also in {where[name]} (bare includes would be ambiguous)")
                return 1
            where[name] = path
    bad = 0
    edges = {}
    for path in sources:
        layer = layer_of(path)
        allowed = set(LAYERS[layer]) | {layer}
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if m is None:
                    continue
                quote, name = m.groups()
                if quote == "<":
                    for prefix, owners in OWNERS.items():
                        if name.startswith(prefix) and path not in owners:
                            print(f"{path}:{lineno}: includes <{name}>, which only "
                                  f"{', '.join(owners)} may")
                            bad += 1
                    continue
                target = where.get(os.path.basename(name))
                if target is None:
                    print(f"{path}:{lineno}: includes \"{name}\", found in no layer")
                    bad += 1
                    continue
                if (layer in DAGS and layer_of(target) == layer
                        and module_of(target) != module_of(path)):
                    edges.setdefault(module_of(path), {}).setdefault(
                        module_of(target), (path, lineno))
                if layer_of(target) in allowed or target in ALSO.get(layer, []):
                    continue
                below = LAYERS[layer] + ALSO.get(layer, [])
                print(f"{path}:{lineno}: {layer}/ includes {target}: {layer}/ sits on "
                      f"{', '.join(below) or 'nothing'} only (docs/architecture.md)")
                bad += 1
    for (path, lineno), loop in cycles(edges):
        print(f"{path}:{lineno}: closes the include cycle {' -> '.join(loop)}: the modules "
              f"of {os.path.dirname(path)}/ include down only (see DAGS)")
        bad += 1
    if bad:
        print(f"check_layers: {bad} include(s) cross the layers the wrong way or close a cycle")
        return 1
    print(f"check_layers: {len(sources)} files, every include points down, "
          f"no include cycle in {', '.join(d + '/' for d in DAGS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
