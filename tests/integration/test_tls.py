"""Integration: the TLS listener.

Certificates are made for each test with the openssl command (a CA, a server certificate
for 127.0.0.1, a client certificate). The checks: a round trip through the kvstash CLI
(which is libkvstash's kvstash_connect_tls) and through Python's ssl module; a client that
speaks plain msgpack-rpc to the TLS port gets a plain-text error notification and is
closed at once, without disturbing anyone; with tls_ca_file a client without a certificate
is refused and one with a certificate served; SIGHUP loads new certificates for new
connections and drops none of the open ones. Every wait is bounded.
"""

import os
import signal
import socket
import ssl
import subprocess
import time

import msgpack
import pytest

from kvtest import KVSTASHD, Client, Daemon, free_port, recv_to_eof, wait_for

CLI = os.path.join(os.path.dirname(os.path.abspath(KVSTASHD)), "kvstash")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_cert(d, name, ca="ca", cn="127.0.0.1", san="IP:127.0.0.1,DNS:localhost"):
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
            f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(f"subjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
            cwd=d)


@pytest.fixture
def certs(tmp_path):
    if not os.access(KVSTASHD, os.X_OK) or not os.access(CLI, os.X_OK):
        pytest.fail(f"no kvstashd or kvstash next to {KVSTASHD} (build them)")
    d = str(tmp_path / "pki")
    os.makedirs(d)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=kvstash test CA", cwd=d)
    make_cert(d, "server")
    make_cert(d, "server2")
    make_cert(d, "client", cn="client", san="DNS:client")
    return d


def start(tmp_path, certs, *extra):
    port = free_port()
    d = Daemon(str(tmp_path), ("--memory_size=32m", "--ssd_dir=", f"--tls_listen=127.0.0.1:{port}",
                               f"--tls_cert_file={certs}/server.pem",
                               f"--tls_key_file={certs}/server.key", *extra)).wait_ready()
    d.tls_port = port
    return d


def tls_client(d, certs, cert=None):
    ctx = ssl.create_default_context(cafile=f"{certs}/ca.pem")
    if cert:
        ctx.load_cert_chain(f"{certs}/{cert}.pem", f"{certs}/{cert}.key")
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", d.tls_port), timeout=10),
                        server_hostname="127.0.0.1")
    return Client(s)


def cli(d, certs, *args, cert=None, stdin=None):
    cmd = [CLI, "-H", f"127.0.0.1:{d.tls_port}", "-t", "5000", "--tls-ca", f"{certs}/ca.pem"]
    if cert:
        cmd += ["--tls-cert", f"{certs}/{cert}.pem", "--tls-key", f"{certs}/{cert}.key"]
    return subprocess.run(cmd + list(args), input=stdin, capture_output=True, timeout=30)


def test_round_trip_over_tls(tmp_path, certs):
    d = start(tmp_path, certs)
    try:
        value = os.urandom(300000)
        p = cli(d, certs, "put", "tls-key", "-", stdin=value)
        assert p.returncode == 0, p.stderr
        p = cli(d, certs, "get", "tls-key")
        assert p.returncode == 0 and p.stdout == value, p.stderr
        c = tls_client(d, certs)
        assert c.sock.version() in ("TLSv1.2", "TLSv1.3")
        assert c.call("get", b"tls-key") == value
        assert "tls" in c.call("hello")["transports"]
        # The plain TCP port serves the same objects.
        assert d.tcp().call("get_size", b"tls-key") == len(value)
        # A certificate for another name is refused by the client library.
        p = subprocess.run([CLI, "-H", f"localhost:{d.tls_port}", "--tls-ca", f"{certs}/client.pem",
                            "ping"], capture_output=True, timeout=30)
        assert p.returncode == 3, p
    finally:
        d.stop()


def test_plain_text_client_on_the_tls_port_is_refused_cleanly(tmp_path, certs):
    d = start(tmp_path, certs)
    try:
        good = tls_client(d, certs)
        s = socket.create_connection(("127.0.0.1", d.tls_port), timeout=5)
        s.sendall(msgpack.packb([0, 1, "ping", []]))
        t0 = time.monotonic()
        data = recv_to_eof(s)
        assert time.monotonic() - t0 < 3, "the plain-text client was not closed promptly"
        msg = msgpack.unpackb(data, raw=False)
        assert msg[0] == 2 and msg[2][0] == 8 and "TLS" in msg[2][2], msg
        assert good.call("ping") == "pong"
        d.assert_alive()
    finally:
        d.stop()


def test_client_certificates_when_a_ca_is_set(tmp_path, certs):
    d = start(tmp_path, certs, f"--tls_ca_file={certs}/ca.pem")
    try:
        p = cli(d, certs, "ping")
        assert p.returncode == 3, "a client without a certificate was served"
        p = cli(d, certs, "ping", cert="client")
        assert p.returncode == 0, p.stderr
        assert tls_client(d, certs, cert="client").call("ping") == "pong"
    finally:
        d.stop()


def test_sighup_reloads_certificates_without_dropping_connections(tmp_path, certs):
    d = start(tmp_path, certs)
    try:
        old = tls_client(d, certs)
        first = old.sock.getpeercert(binary_form=True)
        os.replace(f"{certs}/server2.pem", f"{certs}/server.pem")
        os.replace(f"{certs}/server2.key", f"{certs}/server.key")
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:
            new = tls_client(d, certs)
            if new.sock.getpeercert(binary_form=True) != first:
                break
            new.close()
            assert time.monotonic() < deadline, "SIGHUP did not load the new certificate"
            time.sleep(0.1)
        assert new.call("ping") == "pong"
        assert old.call("ping") == "pong", "the reload dropped an open TLS connection"
    finally:
        d.stop()


def test_a_daemon_gone_mid_call_is_an_error_not_sigpipe(tmp_path, certs):
    """libkvstash over TLS: a write to a daemon that died fails the call; no SIGPIPE kills us."""
    d = start(tmp_path, certs)
    cmd = [CLI, "-H", f"127.0.0.1:{d.tls_port}", "-t", "5000", "--tls-ca", f"{certs}/ca.pem",
           "put", "gone", "-"]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        # The CLI connects (handshake included), then reads the value from stdin.
        watch = d.tcp()
        wait_for(lambda: watch.call("stats")["connections"] >= 2, 10, "the CLI's connection")
        d.kill9()
        time.sleep(0.3)             # its sockets closed: the CLI's writes meet a reset
        out, err = p.communicate(os.urandom(8 << 20), timeout=30)
        assert p.returncode == 3, (p.returncode, err)     # not -SIGPIPE
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        d.reap()
