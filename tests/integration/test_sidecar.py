"""packaging/sidecar/: the pod manifest parses (python3-yaml) and agrees with kvstashd: its
flags are options kvstashd accepts (--check-config), the memory limit covers memory_size,
the Unix socket sits in the emptyDir both containers mount, the probes hit metrics_listen's
port on /healthz and /readyz, and the Dockerfile installs the .deb on Debian 12. Neither the
image nor the pod is built or run here (no container runtime, no cluster)."""

import re
import subprocess

import pytest

from kvtest import KVSTASHD, ROOT

yaml = pytest.importorskip("yaml")
SIDECAR = ROOT / "packaging/sidecar"


def quantity(q):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(q))
    return int(m.group(1)) * units.get(m.group(2), 1)


def size(s):
    m = re.fullmatch(r"(\d+)([kmgt]?)", s.lower())
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2)]


@pytest.fixture(scope="module")
def pod():
    return yaml.safe_load((SIDECAR / "kvstash-sidecar.yaml").read_text())


def kvstash(pod):
    (c,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "kvstash"]
    return c


def flags(c):
    return dict(a[2:].split("=", 1) for a in c["args"])


def test_manifest_agrees_with_the_config(pod, tmp_path):
    c = kvstash(pod)
    f = flags(c)
    assert c["restartPolicy"] == "Always"  # a native sidecar: up before the engine
    # memory: the limit covers the arena, with requests equal to limits
    lim = quantity(c["resources"]["limits"]["memory"])
    assert lim >= size(f["memory_size"]) + (512 << 20)
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"]
    # the socket is in the emptyDir both containers mount at the same place
    sock_dir = f["unix_socket"].rsplit("/", 1)[0]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    (run_vol,) = [n for n, p in mounts.items() if p == sock_dir]
    assert "emptyDir" in vols[run_vol]
    assert vols["shm"]["emptyDir"]["medium"] == "Memory" and mounts["shm"] == "/dev/shm"
    for engine in pod["spec"]["containers"]:
        em = {m["name"]: m["mountPath"] for m in engine["volumeMounts"]}
        assert em[run_vol] == sock_dir and em["shm"] == "/dev/shm"
        env = {e["name"]: e["value"] for e in engine.get("env", [])}
        assert env["KVSTASH_ADDR"] == "unix:" + f["unix_socket"]
    # probes: metrics_listen's port, /healthz and /readyz
    port = int(f["metrics_listen"].rsplit(":", 1)[1])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
    assert c["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert port in [p["containerPort"] for p in c["ports"]]
    # the drain fits in the grace period
    assert pod["spec"]["terminationGracePeriodSeconds"] > int(f["shutdown_timeout_ms"][:-1])


def test_manifest_flags_are_options_kvstashd_accepts(pod, tmp_path):
    """Every flag the pod passes is a known key with a valid value (kvstashd --check-config);
    paths are moved under a scratch dir. metrics_listen belongs to the metrics work: until
    kvstashd knows it, this test says so and checks the rest."""
    f = flags(kvstash(pod))
    known = subprocess.run([KVSTASHD, "--dump-options"], capture_output=True, text=True,
                           check=True).stdout
    keys = {ln.split("\t")[0] for ln in known.splitlines() if not ln.startswith("#")}
    missing = set(f) - keys
    args = [f"--{k}={v}" for k, v in f.items() if k in keys]
    args = [a.replace("/run/kvstash", str(tmp_path)).replace("/var/lib/kvstash", str(tmp_path))
            for a in args]
    r = subprocess.run([KVSTASHD, *args, "--check-config"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert missing <= {"metrics_listen"}, missing
    if missing:
        pytest.skip("kvstashd has no metrics_listen yet (issue 21's metrics work); the other "
                    "flags are valid")


def test_dockerfile_installs_the_deb_on_debian_12():
    text = (SIDECAR / "Dockerfile").read_text()
    assert re.search(r"^FROM debian:12", text, re.M)
    assert "apt-get install" in text and "/tmp/kvstash.deb" in text
    assert '"/usr/bin/kvstashd", "--config", "/etc/kvstash/kvstashd.conf"' in text
