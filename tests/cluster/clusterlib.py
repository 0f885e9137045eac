"""clusterlib: the pool tests' harness (tests/cluster/): a real etcd and N kvstashd daemons.

Etcd(work) starts /usr/bin/etcd (Debian's etcd-server 3.4) on two free loopback ports with
its data under work, and waits (bounded) until its v3 JSON gateway answers; it can be
stopped and started again on the same ports and data (stop/start), SIGSTOPped (pause/resume)
and killed. call(path, body) is one gateway request; put/get/delete/compact/revision are
the few the tests need (keys and values as str or bytes; base64 is done here).

Pool(work, etcd, ...) starts daemons as pool members: node i listens on 127.0.0.<i+2> (its
own address, as a host of its own would have), with its own data dir, ports, node_id,
--metrics_listen= (off: the default port is one for all) and the cluster keys. Node is
kvtest.Daemon with the client pointed at that address, plus info() (the cluster_info RPC:
the view as that daemon sees it), drain(), pause()/resume() (SIGSTOP/SIGCONT).
Pool.wait_view(n) waits until every running node sees the same view of n active members.

Proxy(target) is a TCP forwarder a node can be given as its etcd endpoint, to cut that node
from etcd alone (cut/restore).

ViewPool(work, n) is a pool without etcd: n daemons on 127.0.0.1 that know each other
through a fixed view (KVSTASH_TEST_VIEW), each with its metrics port; owners(key), has(i,
keys) (peer_exists: what node i holds itself) and metric(i, name). The view_pools fixture
(conftest.py) starts them and kills them at teardown. metric_total(port, name) sums one
metric's series on a /metrics page; wait_until(pred, what) is kvtest.wait_for with the
pool tests' 20 s default.

Every wait is bounded; every process started is killed at teardown (the fixtures in
conftest.py). A machine without /usr/bin/etcd skips the tests with the reason.
"""

import base64
import contextlib
import json
import mmap
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import kvtest  # noqa: E402
from kvtest import Client, Daemon, wait_for  # noqa: E402
from place_ref import owners  # noqa: E402
from test_tls import make_cert, openssl  # noqa: E402  (the TLS port's tests' certificates)

ETCD = os.environ.get("ETCD") or "/usr/bin/etcd"
ETCD_START_TIMEOUT = 20.0


def require_etcd():
    """Skip (with the reason) when etcd is not installed."""
    if not os.access(ETCD, os.X_OK):
        pytest.skip(f"no etcd at {ETCD} (apt-get install etcd-server, or make deps)")


def make_pki(work, certs):
    """work/pki: two CAs, ca and other-ca (.pem and .key), and for each (name, ca, cn, san)
    of certs a certificate name.pem (subjectAltName san) signed by that CA, with its key
    name.key. Returns the directory. Skips (with the reason) without an openssl command."""
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("no openssl command (apt-get install openssl, or make deps)")
    d = os.path.join(work, "pki")
    os.makedirs(d)
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
                "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=kvstash test {ca}", cwd=d)
    for name, ca, cn, san in certs:
        make_cert(d, name, ca=ca, cn=cn, san=san)
    return d


def _crc32c_table():
    t = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    """CRC-32C (Castagnoli), a table per byte: the checksum every value travels with
    between peers."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _CRC32C_TABLE[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def register_memfd(c, size):
    """A memfd of size bytes registered on the Unix connection c (register_buffer with the
    descriptor): (fd, buffer id). The caller closes fd."""
    fd = os.memfd_create("kvstash-cluster-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    _, data = c.request("register_buffer", [{"size": size}])
    assert socket.send_fds(c.sock, [data], [fd]) == len(data)
    msg = c.recv()
    assert msg[2] is None, msg
    return fd, msg[3]


@contextlib.contextmanager
def shm_values(c, vals, keys):
    """The values of keys back to back in a memfd registered on the Unix connection c: yields
    batch_put_from's pieces ([[buffer id, offset, length]] per key); the memfd is closed
    after."""
    size = sum(len(vals[k]) for k in keys)
    fd, buf = register_memfd(c, size)
    try:
        with mmap.mmap(fd, size) as mm:
            pieces, off = [], 0
            for k in keys:
                mm[off:off + len(vals[k])] = vals[k]
                pieces.append([[buf, off, len(vals[k])]])
                off += len(vals[k])
            yield pieces
    finally:
        os.close(fd)


def free_port(host="127.0.0.1"):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until(pred, what, timeout=20.0):
    """Poll pred() (every 50 ms) until it is truthy; a test failure naming what after
    timeout seconds."""
    return wait_for(pred, timeout, what, interval=0.05)


def metric_total(port, name, host="127.0.0.1", headers=None):
    """The sum of every series of metric name (bare or with labels) on host:port/metrics;
    name may carry labels itself to pick one series."""
    req = urllib.request.Request(f"http://{host}:{port}/metrics", headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def b64(x):
    return base64.b64encode(x.encode() if isinstance(x, str) else x).decode()


def unb64(s):
    return base64.b64decode(s) if s else b""


class Etcd:
    """One etcd member on loopback; its data in work/etcd; also: more loopback addresses it
    listens on (its port, also_endpoints). tls: a dict of PEM paths ("cert",
    "key", "ca", and "client_cert"/"client_key" for the harness's own calls when
    "client_auth" is true): the client port is then https:// with that certificate; with
    client_auth etcd requires a client certificate chaining to ca (--trusted-ca-file and
    --client-cert-auth: etcd 3.4 requires one whenever --trusted-ca-file is given). args:
    more etcd flags (--auth-token-ttl ...). After enable_auth the harness's own calls log in
    as root (again when etcd refuses the token)."""

    def __init__(self, work, tls=None, also=(), args=()):
        require_etcd()
        self.args = list(args)
        self.auth = None            # (user, password) of the harness's calls, or None
        self.token = None
        self.dir = os.path.join(work, "etcd")
        self.log_path = os.path.join(work, "etcd.log")
        self.client_port = free_port()
        self.peer_port = free_port()
        self.tls = tls
        scheme = "https" if tls else "http"
        self.endpoint = f"{scheme}://127.0.0.1:{self.client_port}"
        # more loopback addresses it answers on, the same port (also_endpoints)
        self.also_endpoints = [f"{scheme}://{h}:{self.client_port}" for h in also]
        self.proc = None
        self.start()

    def _ssl(self):
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.tls["ca"])
        if self.tls.get("client_cert"):
            ctx.load_cert_chain(self.tls["client_cert"], self.tls["client_key"])
        return ctx

    def start(self):
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [ETCD, "--name", "kvt", "--data-dir", self.dir,
               "--listen-client-urls", ",".join([self.endpoint, *self.also_endpoints]),
               "--advertise-client-urls", self.endpoint,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"kvt={peer}", "--log-level", "warn", *self.args]
        if self.tls:
            cmd += ["--cert-file", self.tls["cert"], "--key-file", self.tls["key"]]
            if self.tls.get("client_auth"):
                cmd += ["--trusted-ca-file", self.tls["ca"], "--client-cert-auth"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ETCD_START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"etcd exited at start ({self.proc.returncode}):\n{self.tail()}")
            try:
                self.revision()
                return self
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"etcd did not answer within {ETCD_START_TIMEOUT} s:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self, n=30):
        with open(self.log_path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])

    def _post(self, path, body, timeout, token=None):
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = token
        req = urllib.request.Request(self.endpoint + path, data=json.dumps(body).encode(),
                                     headers=headers)
        with urllib.request.urlopen(req, timeout=timeout, context=self._ssl()) as r:
            return json.loads(r.read())

    def call(self, path, body, timeout=5.0):
        """POST body (a dict) to the gateway; the answer as a dict."""
        if self.auth is None:
            return self._post(path, body, timeout)
        for attempt in (0, 1):
            if self.token is None:
                self.token = self._post("/v3/auth/authenticate",
                                        {"name": self.auth[0], "password": self.auth[1]},
                                        timeout)["token"]
            try:
                return self._post(path, body, timeout, self.token)
            except urllib.error.HTTPError as e:
                if e.code != 401 or attempt == 1:       # 401: the token expired
                    raise
                self.token = None

    def enable_auth(self, prefix, user, password, root_password="root-secret"):
        """etcd's authentication on: users root and user (with a role that may read and
        write the keys under prefix), then auth enable; the harness logs in as root."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        for path, body in (
                ("/v3/auth/role/add", {"name": "root"}),
                ("/v3/auth/user/add", {"name": "root", "password": root_password}),
                ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
                ("/v3/auth/role/add", {"name": "kvstash-rw"}),
                ("/v3/auth/role/grant", {"name": "kvstash-rw", "perm": {
                    "permType": "READWRITE", "key": b64(prefix), "range_end": b64(end)}}),
                ("/v3/auth/user/add", {"name": user, "password": password}),
                ("/v3/auth/user/grant", {"user": user, "role": "kvstash-rw"}),
                ("/v3/auth/enable", {})):
            self.call(path, body)
        self.auth = ("root", root_password)

    def revision(self):
        return int(self.call("/v3/kv/range", {"key": b64("\0")})["header"]["revision"])

    def put(self, key, value):
        return self.call("/v3/kv/put", {"key": b64(key), "value": b64(value)})

    def get(self, key):
        kvs = self.call("/v3/kv/range", {"key": b64(key)}).get("kvs", [])
        return unb64(kvs[0].get("value")) if kvs else None

    def get_prefix(self, prefix):
        """{key: value} of every key under prefix (str keys, bytes values)."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        kvs = self.call("/v3/kv/range", {"key": b64(prefix), "range_end": b64(end)}).get("kvs",
                                                                                         [])
        return {unb64(kv["key"]).decode(): unb64(kv.get("value")) for kv in kvs}

    def delete(self, key):
        return self.call("/v3/kv/deleterange", {"key": b64(key)})

    def compact(self, revision):
        return self.call("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    def revoke(self, lease):
        return self.call("/v3/lease/revoke", {"ID": str(lease)})

    def lease_of(self, key):
        kvs = self.call("/v3/kv/range", {"key": b64(key)}).get("kvs", [])
        return int(kvs[0].get("lease", "0")) if kvs else None

    def stop(self):
        """SIGTERM and wait: etcd is down (start() brings it back on the same data)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def pause(self):
        kvtest.stop_process(self.proc.pid)      # returns once every thread has stopped

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def reap(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass


class Proxy:
    """A TCP forwarder on host (127.0.0.1 unless told) to target (host, port), in threads: a
    node given proxy.endpoint as its etcd endpoint reaches etcd only through it. cut()
    closes every connection and refuses new ones (the node is cut from etcd, nothing else);
    restore() lets them through again."""

    def __init__(self, target, host="127.0.0.1"):
        import threading
        self.target = target
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((host, 0))
        self.lsock.listen(64)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.endpoint = f"http://{host}:{self.port}"
        self.lock = threading.Lock()
        self.conns = []
        self.open = True
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _pipe(self, a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self):
        import threading
        while self.running:
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                if not self.open:
                    c.close()
                    continue
                try:
                    u = socket.create_connection(self.target, timeout=5)
                except OSError:
                    c.close()
                    continue
                u.settimeout(None)
                c.settimeout(None)
                self.conns += [c, u]
            threading.Thread(target=self._pipe, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()

    def cut(self):
        with self.lock:
            self.open = False
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self.conns = []

    def restore(self):
        with self.lock:
            self.open = True

    def close(self):
        self.cut()
        self.running = False
        self.lsock.close()
        self.thread.join(5)


class Node(Daemon):
    """A pool member: kvtest.Daemon on its own 127.0.0.x address."""

    def __init__(self, work, host, node_id, args, data_dir=None):
        self.host = host
        self.node_id = node_id
        port = free_port(host)
        self.addr = f"{host}:{port}"
        super().__init__(work, [f"--listen={self.addr}", f"--node_id={node_id}", *args],
                         data_dir=data_dir, unix=False)
        self.port = port

    def _answers(self):
        c = Client(socket.create_connection((self.host, self.port), timeout=5))
        try:
            return c.call("ping") == "pong"
        finally:
            c.close()

    def tcp(self):
        c = Client(socket.create_connection((self.host, self.port), timeout=10))
        self.clients.append(c)
        return c

    client = tcp

    def assert_alive(self):
        assert self.alive(), f"kvstashd died (exit {self.proc.returncode}):\n" + self.tail()
        assert self._answers()

    def call(self, method, *params):
        """One request on a fresh connection (closed after)."""
        c = Client(socket.create_connection((self.host, self.port), timeout=10))
        try:
            return c.call(method, *params)
        finally:
            c.close()

    def info(self, keys=None):
        """cluster_info: the pool as this daemon sees it."""
        return self.call("cluster_info", keys) if keys is not None else self.call("cluster_info")

    def view(self):
        """(revision, {id: state}) of this daemon's current view."""
        i = self.info()
        return i["revision"], {n["id"]: n["state"] for n in i["nodes"]}

    def drain(self):
        return self.call("cluster_drain")

    def pause(self):
        kvtest.stop_process(self.proc.pid)      # returns once every thread has stopped

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def reap(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        super().reap()


class Pool:
    """Daemons of one pool against one etcd. args: more flags for every node."""

    def __init__(self, work, etcd, name="pool", ttl="2s", replicas=2, args=()):
        self.work = work
        self.etcd = etcd
        self.name = name
        self.prefix = f"/kvstash/{name}"
        self.ttl = ttl
        self.replicas = replicas
        self.args = list(args)
        self.nodes = []
        self.seq = 0

    def node_args(self, weight=1, replicas=None, extra=()):
        return [f"--cluster_name={self.name}", f"--etcd_endpoints={self.etcd.endpoint}",
                f"--etcd_lease_ttl={self.ttl}", f"--replicas={replicas or self.replicas}",
                f"--node_weight={weight}", "--memory_size=64m", "--ssd_dir=", *self.args,
                *extra]

    def start(self, node_id=None, weight=1, replicas=None, args=(), ready=True, host=None,
              data_dir=None):
        """Start one member (node ids n1, n2, ... on 127.0.0.2, .3, ...)."""
        self.seq += 1
        node_id = node_id or f"n{self.seq}"
        host = host or f"127.0.0.{self.seq + 1}"
        n = Node(self.work, host, node_id, self.node_args(weight, replicas, args),
                 data_dir=data_dir)
        self.nodes.append(n)
        return n.wait_ready() if ready else n

    def restart(self, node, args=(), ready=True, env=None):
        """A new process for node: same id, address, port and data dir (env: variables
        added to its environment)."""
        n = Node.__new__(Node)
        n.host = node.host
        n.node_id = node.node_id
        n.addr = node.addr
        extra = [a for a in node.cmd[1:] if not a.startswith(("--listen=", "--data_dir=",
                                                             "--unix_socket="))]
        Daemon.__init__(n, self.work, [f"--listen={node.addr}", *extra, *args],
                        data_dir=node.data_dir, unix=False, env=env)
        n.port = node.port
        self.nodes.append(n)
        return n.wait_ready() if ready else n

    def running(self):
        return [n for n in self.nodes if n.alive()]

    def wait_view(self, n, timeout=15.0, nodes=None, states=("active",)):
        """Wait until every node of nodes (default: the running ones) sees one view of n
        members, all in states; returns that view's {id: state}."""
        nodes = nodes or self.running()
        last = {}

        def same():
            views = []
            for node in nodes:
                try:
                    views.append(node.view())
                except (OSError, AssertionError, TimeoutError, ConnectionError):
                    return False
            last["views"] = views
            members = [v[1] for v in views]
            if all(m == members[0] for m in members) and len(members[0]) == n and \
                    all(s in states for s in members[0].values()):
                return members[0]
            return False

        return wait_for(same, timeout, lambda: f"one view of {n} members {states} on "
                        f"{[x.node_id for x in nodes]}; last seen {last.get('views')}",
                        interval=0.05)

    def reap(self):
        for n in self.nodes:
            n.reap()

    def reap_show(self, lines=25):
        """reap(), then each node's command and the tail of its log (a test's teardown)."""
        self.reap()
        for n in self.nodes:
            print(f"---- {n.node_id} {' '.join(n.cmd[1:])}\n{n.tail(lines)}")


class ViewPool:
    """n daemons on 127.0.0.1 in one pool with no etcd: each knows the others through a
    fixed view (KVSTASH_TEST_VIEW), as node-0 .. node-<n-1>, R = replicas. Node i has its
    own port and metrics port (and data dir data[i] when data_prefix names one, so start(i)
    brings it back as itself). extra: more flags for every node, after the pool's; a
    subclass adds node i's own before them (node_args). A start that fails leaves no
    daemon behind; one that failed only because a port picked for it was taken meanwhile
    (by any process's outbound connection) is tried again on new ports, twice at most."""

    env = {}                    # more environment for every daemon (a subclass's)

    def __init__(self, work, n, extra=(), unix=False, replicas=2, data_prefix=None):
        self.work = work
        self.extra = list(extra)
        self.unix = unix
        self.replicas = replicas
        self.ids = [f"node-{i}" for i in range(n)]
        self.data = [os.path.join(work, f"{data_prefix}-{i}") if data_prefix else None
                     for i in range(n)]
        for attempt in range(3):
            self.ports = [kvtest.free_port() for _ in range(n)]
            self.mports = [kvtest.free_port() for _ in range(n)]
            self.view = ",".join(f"{nid}@127.0.0.1:{p}"
                                 for nid, p in zip(self.ids, self.ports))
            self.daemons = [None] * n
            try:
                for i in range(n):
                    self.start(i, ready=False)
                for d in self.daemons:
                    d.wait_ready()
                return
            except BaseException:
                taken = any(d is not None and d.proc.poll() is not None
                            and "Address already in use" in d.tail() for d in self.daemons)
                self.close()    # a start that failed leaves no daemon behind
                if not taken or attempt == 2:
                    raise

    def node_args(self, i):
        """Node i's own flags, before the pool's (a subclass's config file, say)."""
        return []

    def start(self, i, ready=True):
        """Start node i (again, after stop()): same id, ports and data dir."""
        args = [*self.node_args(i), f"--listen=127.0.0.1:{self.ports[i]}",
                f"--metrics_listen=127.0.0.1:{self.mports[i]}", f"--node_id={self.ids[i]}",
                "--cluster_name=t", "--etcd_endpoints=http://127.0.0.1:9",
                f"--replicas={self.replicas}", "--memory_size=64m", *self.extra]
        d = kvtest.Daemon(self.work, args, data_dir=self.data[i], unix=self.unix,
                          env={"KVSTASH_TEST_VIEW": self.view, **self.env})
        d.port = self.ports[i]
        self.daemons[i] = d
        return d.wait_ready() if ready else d

    def owners(self, key):
        """Indexes of key's owners, first owner first (place_ref over the view)."""
        return owners([(nid, 1.0) for nid in self.ids], key, self.replicas)

    def has(self, i, keys):
        """Which of keys node i holds itself (peer_exists asks no one else)."""
        c = kvtest.Client.tcp(self.ports[i])
        try:
            return c.call("peer_exists", 0, list(keys))
        finally:
            c.close()

    def metric(self, i, name):
        return metric_total(self.mports[i], name)

    def close(self):
        for d in self.daemons:
            if d is not None:
                d.reap()
