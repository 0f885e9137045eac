"""The Debian package (make deb) and what make install puts in it: lintian finds no error,
systemd accepts the unit, the package unpacks into a scratch root whose kvstashd serves and
tells systemd it is ready, the man pages render and kvstashd.conf(5) names every option.

KVSTASH_DEB is the .deb to check (make test-python builds it and sets it); without it these
tests skip. Nothing here touches this machine's dpkg database: the package is unpacked with
dpkg -x.
"""

import gzip
import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from kvtest import ROOT, Daemon, wait_for

DEB = os.environ.get("KVSTASH_DEB")
pytestmark = pytest.mark.skipif(not DEB, reason="KVSTASH_DEB unset (make test-python builds "
                                "the package with make deb and sets it)")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    root = tmp_path_factory.mktemp("debroot")
    subprocess.run(["dpkg-deb", "-x", DEB, str(root)], check=True)
    return root


def control_file(name):
    out = subprocess.run(["dpkg-deb", "--ctrl-tarfile", DEB], check=True,
                         capture_output=True).stdout
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(out)) as t:
        return t.extractfile(f"./{name}").read().decode()


def dump_options(binary):
    out = subprocess.run([str(binary), "--dump-options"], check=True, capture_output=True,
                         text=True).stdout
    return [line.split("\t")[0] for line in out.splitlines() if not line.startswith("#")]


def test_lintian_reports_no_error():
    if shutil.which("lintian") is None:
        pytest.skip("lintian is not installed")
    r = subprocess.run(["lintian", "--tag-display-limit", "0", DEB], capture_output=True,
                       text=True)
    errors = [line for line in r.stdout.splitlines() if line.startswith("E:")]
    assert errors == [], "lintian errors:\n" + r.stdout
    # the warnings docs/operations.md lists, and no other
    warned = {line.split()[2] for line in r.stdout.splitlines() if line.startswith("W:")}
    assert warned <= {"link-to-shared-library-in-wrong-package",
                      "package-name-doesnt-match-sonames",
                      "pkg-config-unavailable-for-cross-compilation"}, r.stdout


def test_systemd_accepts_the_unit(scratch, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = (scratch / "lib/systemd/system/kvstashd.service").read_text()
    # verify wants ExecStart's binary to exist: point it at the unpacked one
    (tmp_path / "kvstashd.service").write_text(
        unit.replace("/usr/bin/kvstashd", str(scratch / "usr/bin/kvstashd")))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no",
                        str(tmp_path / "kvstashd.service")], capture_output=True, text=True)
    if r.returncode != 0 and "kvstashd.service" not in r.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def test_package_layout(scratch):
    for f in ["usr/bin/kvstashd", "usr/bin/kvstash", "usr/lib/libkvstash.so.0",
              "usr/lib/libkvstash.so", "usr/lib/libkvstash.a", "usr/include/kvstash.h",
              "usr/lib/pkgconfig/kvstash.pc", "usr/lib/python3/dist-packages/kvstash/client.py",
              "etc/kvstash/kvstashd.conf", "etc/logrotate.d/kvstash",
              "lib/systemd/system/kvstashd.service", "usr/share/man/man8/kvstashd.8.gz",
              "usr/share/man/man1/kvstash.1.gz", "usr/share/man/man5/kvstashd.conf.5.gz",
              "usr/share/doc/kvstash/copyright"]:
        assert (scratch / f).exists(), f
    assert control_file("conffiles").split() == ["/etc/kvstash/kvstashd.conf",
                                                 "/etc/logrotate.d/kvstash"]
    post = control_file("postinst")
    assert re.search(r"adduser --system .*kvstash", post.replace("\\\n", " ")), post
    assert "/var/lib/kvstash" in post
    # the packaged config is the shipped one, data_dir moved to the package's state directory
    shipped = (ROOT / "conf/kvstashd.conf").read_text()
    packaged = (scratch / "etc/kvstash/kvstashd.conf").read_text()
    assert packaged == shipped.replace("\ndata_dir ./var\n", "\ndata_dir /var/lib/kvstash\n")
    unit = (scratch / "lib/systemd/system/kvstashd.service").read_text()
    for line in ["Type=notify", "User=kvstash", "StateDirectory=kvstash",
                 "ExecStart=/usr/bin/kvstashd --config /etc/kvstash/kvstashd.conf",
                 "ExecReload=/bin/kill -HUP $MAINPID", "LimitMEMLOCK=infinity",
                 "PrivateDevices=no", "DeviceAllow=/dev/infiniband/uverbs* rw"]:
        assert line in unit.splitlines(), line
    rot = (scratch / "etc/logrotate.d/kvstash").read_text()
    assert "postrotate" in rot and "--signal=USR1" in rot
    pc = (scratch / "usr/lib/pkgconfig/kvstash.pc").read_text()
    assert "Libs: -L${libdir} -lkvstash" in pc and "libdir=/usr/lib" in pc


def test_installed_binary_serves_and_notifies_systemd(scratch, tmp_path):
    """The unpacked kvstashd, with the packaged config (data_dir moved to a scratch dir, TCP
    on a loopback port), answers the unpacked CLI's ping and sends READY=1 to NOTIFY_SOCKET
    once it does; a reload and a stop are announced too."""
    sock_path = str(tmp_path / "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(sock_path)
    notify.settimeout(20)
    d = Daemon(str(tmp_path), ["--config", str(scratch / "etc/kvstash/kvstashd.conf")],
               binary=str(scratch / "usr/bin/kvstashd"), env={"NOTIFY_SOCKET": sock_path})
    try:
        assert notify.recv(4096) == b"READY=1"
        r = subprocess.run([str(scratch / "usr/bin/kvstash"), "-H", f"127.0.0.1:{d.port}",
                            "-t", "5000", "ping"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout == "pong\n", r.stderr
        d.proc.send_signal(signal.SIGHUP)
        assert notify.recv(4096) == b"RELOADING=1"
        assert notify.recv(4096) == b"READY=1"
        d.stop()
        assert notify.recv(4096) == b"STOPPING=1"
    finally:
        d.reap()
        notify.close()


def render(path):
    env = {**os.environ, "MANWIDTH": "100", "LC_ALL": "C.UTF-8"}
    r = subprocess.run(["man", "--warnings", "-l", str(path)], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0 and r.stderr == "", f"{path}: {r.stderr}"
    return r.stdout


def test_man_pages_render_and_the_config_page_names_every_option(scratch):
    if shutil.which("man") is None:
        pytest.skip("man is not installed")
    man = scratch / "usr/share/man"
    assert "SIGNALS" in render(man / "man8/kvstashd.8.gz")
    cli = render(man / "man1/kvstash.1.gz")
    for cmd in ["stats", "top", "bench"]:
        assert re.search(rf"^\s+{cmd}\b", cli, re.M), cmd
    page = render(man / "man5/kvstashd.conf.5.gz")
    keys = dump_options(scratch / "usr/bin/kvstashd")
    assert len(keys) > 40
    for k in keys:
        assert re.search(rf"^\s+{re.escape(k)}\b", page, re.M), f"{k} not in kvstashd.conf(5)"
    # the facts come from the table: memory_size's default, range and restart rule
    assert re.search(r"memory_size\s+size, default 1g, 1m\.\., restart", page), page[:2000]


def test_the_page_generator_refuses_an_undocumented_option(tmp_path):
    """A key added to the option table without its comment in conf/kvstashd.conf stops the
    build of kvstashd.conf(5) instead of leaving the page short."""
    table = tmp_path / "opts.tsv"
    kvstashd = os.environ.get("KVSTASHD") or str(ROOT / "build/release/kvstashd")
    rows = subprocess.run([kvstashd, "--dump-options"], check=True, capture_output=True,
                          text=True).stdout
    table.write_text(rows + "brand_new_key\tcount\t1\t0..9\treload\n")
    r = subprocess.run(["/usr/bin/python3", str(ROOT / "packaging/man/gen_conf_man.py"),
                        str(table), str(ROOT / "conf/kvstashd.conf"), "0"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "brand_new_key" in r.stderr, r.stderr
