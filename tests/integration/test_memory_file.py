"""Integration: the DRAM arena on a file that outlives the daemon (memory_file).

A daemon whose memory_file is in a tmpfs directory stores and serves byte-exact over TCP, a
registered shared-memory buffer (batch_put_from / batch_get_into) and the arena mapped from
the descriptor map_segment passes (put_start / put_end). Stopped, the file is kept (mode 0600,
the arena's size); started again on it, the daemon says it reused it (stats
memory_file_reused 1, its pages resident), serves nothing of the old run (an old key misses,
a new key's place in the arena is not readable as the old value) and stores new values
byte-exact. A second daemon on a file a live one holds refuses to start naming the path; a
daemon killed with SIGKILL keeps no one out; a file on a disk filesystem is refused and not
left behind; a file of another size is resized, saying so; a relative path is a config error.
On a tmpfs mounted with huge=within_size (mounted by the test; skipped, saying why, when it
cannot) the arena is transparent huge pages, mapped as 2 MiB pages, and a restart reuses
them; an arena whose last MiB is no whole 2 MiB page is logged as 64 of 65 MiB on 2 MiB
pages. On hugetlbfs
(skipped, saying why, without a mount and a hugetlb pool) the arena is 2 MiB pages and a
restart reuses them.
"""

import os
import random
import shutil
import stat
import subprocess
import tempfile

import pytest

from arena_fixture import MIB, skip_without_hugetlb_room, store_all_ways
from kvtest import Daemon, wait_for

import kvstash  # noqa: E402  (importable once arena_fixture has set the path)

TMPFS_MAGIC = 0x01021994


def fs_type(path):
    """The f_type of path's filesystem (stat -f), or None."""
    try:
        out = subprocess.run(["stat", "-f", "-c", "%t", path], capture_output=True, text=True,
                             check=True).stdout
        return int(out.strip(), 16)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None


@pytest.fixture
def shm_dir():
    """A fresh directory on tmpfs (under /dev/shm), removed with what is in it."""
    if fs_type("/dev/shm") != TMPFS_MAGIC:
        pytest.skip("/dev/shm is not a tmpfs on this host")
    d = tempfile.mkdtemp(prefix="kvstash-memfile-", dir="/dev/shm")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def daemon(work, path, size="64m", extra=()):
    return Daemon(work, [f"--memory_size={size}", f"--memory_file={path}", "--ssd_dir=",
                         "--memory_hugepages=auto", *extra])


def test_memory_file_serves_and_is_kept_warm_across_a_restart(work, shm_dir):
    path = os.path.join(shm_dir, "arena")
    rnd = random.Random(1919)
    d = daemon(work, path)
    try:
        d.wait_ready()
        assert f"of the tmpfs file {path} (memory_file, created" in d.output(), d.tail()
        with kvstash.Client(f"127.0.0.1:{d.port}") as c:
            st = c.stats()
            assert st["memory_file_reused"] == 0
            wait_for(lambda: c.stats()["memory_prefaulted"] == 64 * MIB, 60,
                     "the population to cover the arena")
        old = store_all_ways(d, rnd, "old")
        d.stop()
    finally:
        d.reap()
    st = os.stat(path)
    assert st.st_size == 64 * MIB, "the file is kept, the arena's size"
    assert stat.S_IMODE(st.st_mode) == 0o600

    d = daemon(work, path)
    try:
        d.wait_ready()
        out = d.output()
        assert f"of the tmpfs file {path} (memory_file, reused: the previous run's pages; " \
            "64 of 64 MiB resident" in out, out
        with kvstash.Client(d.unix_path) as c:
            st = c.stats()
            assert st["memory_file_reused"] == 1
            assert st["memory_file_resident"] == 64 * MIB, "the kept pages are still in memory"
            assert st["objects"] == 0
            for k in old:
                assert not c.is_exist(k), k
                assert c.get(k, None) is None, k
            got = c.batch_get_into(list(old)[:1], [(c.register_buffer(4 * MIB), 0, 4096)])
            assert got == [-1], "an old key misses through shared memory too"
        new = store_all_ways(d, rnd, "new")
        with kvstash.Client(f"127.0.0.1:{d.port}") as t:
            for k, v in new.items():
                assert t.get(k) == v, k
        d.stop()
    finally:
        d.reap()
    assert os.path.exists(path)


def test_a_second_daemon_on_the_file_is_refused(work, shm_dir):
    path = os.path.join(shm_dir, "arena")
    a = daemon(work, path)
    try:
        a.wait_ready()
        with kvstash.Client(a.unix_path) as c:
            arena = c.map_arena()     # a client holding the arena's descriptor and mapping
            b = daemon(work, path)
            try:
                assert b.exit_code() != 0
                assert f"memory_file {path}: in use by another process" in b.output(), b.tail()
            finally:
                b.reap()
            c.put(b"k", b"x" * 70000)
            assert c.get(b"k") == b"x" * 70000, "the first daemon serves on"
            a.kill9()                 # a killed daemon leaves its lock behind with it
            b = daemon(work, path)
            try:
                b.wait_ready()
                with kvstash.Client(f"127.0.0.1:{b.port}") as t:
                    assert t.get(b"k", None) is None
                b.stop()
            finally:
                b.reap()
            del arena
    finally:
        a.reap()


def test_a_file_on_a_disk_filesystem_is_refused(work):
    base = "/var/tmp"
    t = fs_type(base)
    if t is None or t == TMPFS_MAGIC:
        pytest.skip(f"{base} is not on a disk filesystem here")
    path = os.path.join(base, f"kvstash-memfile-{os.getpid()}.arena")
    d = daemon(work, path)
    try:
        assert d.exit_code() != 0
        out = d.output()
        assert f"memory_file {path}: on a filesystem that is neither tmpfs nor hugetlbfs" \
            in out, out
        assert not os.path.exists(path), "a file made for a refused start is removed"
    finally:
        d.reap()
        if os.path.exists(path):
            os.unlink(path)


def test_a_file_of_another_size_is_resized_and_a_relative_path_refused(work, shm_dir):
    path = os.path.join(shm_dir, "arena")
    with open(path, "wb") as f:
        f.truncate(3 * MIB)
    os.chmod(path, 0o644)
    d = daemon(work, path)
    try:
        d.wait_ready()
        out = d.output()
        assert f"memory_file {path}: was 3145728 bytes, resized to the arena's 67108864" \
            in out, out
        assert "mode was 644, now 0600" in out, out
        with kvstash.Client(f"127.0.0.1:{d.port}") as c:
            assert c.stats()["memory_file_reused"] == 0
            c.put(b"k", b"y" * 100_000)
            assert c.get(b"k") == b"y" * 100_000
        d.stop()
    finally:
        d.reap()
    assert os.stat(path).st_size == 64 * MIB
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    d = daemon(work, "relative/arena")
    try:
        assert d.exit_code() != 0
        assert "must be an absolute path" in d.output(), d.tail()
    finally:
        d.reap()


def hugetlbfs_mount():
    """A mounted hugetlbfs of 2 MiB pages this process may write, or None."""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype, opts = line.split()[:4]
                if fstype == "hugetlbfs" and "pagesize=1024M" not in opts \
                        and os.access(mnt, os.W_OK):
                    return mnt
    except OSError:
        pass
    return None


def test_memory_file_on_hugetlbfs_reuses_the_pools_pages(work):
    skip_without_hugetlb_room(40)
    mnt, mounted = hugetlbfs_mount(), False
    if mnt is None:
        if os.geteuid() != 0:
            pytest.skip("no writable hugetlbfs mount, and not root to mount one")
        mnt = tempfile.mkdtemp(prefix="kvstash-hugetlbfs-")
        r = subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "none", mnt],
                           capture_output=True, text=True)
        if r.returncode != 0:
            os.rmdir(mnt)
            pytest.skip(f"cannot mount a hugetlbfs: {r.stderr.strip()}")
        mounted = True
    path = os.path.join(mnt, f"kvstash-test-{os.getpid()}.arena")
    try:
        rnd = random.Random(7)
        for run in range(2):
            d = daemon(work, path, size="65m")
            try:
                d.wait_ready()
                out = d.output()
                assert f"is on hugetlb pages of 2 MiB of the hugetlbfs file {path}" in out, out
                with kvstash.Client(d.unix_path) as c:
                    st = c.stats()
                    assert st["memory_hugepages"] == 2
                    assert st["memory_capacity"] == 64 * MIB, "whole 2 MiB pages"
                    assert st["memory_file_reused"] == run
                    wait_for(lambda: c.stats()["memory_prefaulted"] == 64 * MIB, 60,
                             "the population to cover the arena")
                table = store_all_ways(d, rnd, f"run{run}")
                assert len(table) > 0
                d.stop()
            finally:
                d.reap()
            assert os.stat(path).st_size == 64 * MIB
    finally:
        if os.path.exists(path):
            os.unlink(path)
        if mounted:
            subprocess.run(["umount", mnt], check=False)
            os.rmdir(mnt)


def pmd_mapped_kb(pid):
    """kB of shared memory the process maps with 2 MiB page-table entries."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("ShmemPmdMapped:"):
                return int(line.split()[1])
    return 0


def test_memory_file_on_a_huge_tmpfs_is_transparent_huge_pages(work):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs with huge=within_size needs root")
    mnt = tempfile.mkdtemp(prefix="kvstash-hugetmpfs-")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m,huge=within_size,mode=0700",
                        "none", mnt], capture_output=True, text=True)
    if r.returncode != 0:
        os.rmdir(mnt)
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    path = os.path.join(mnt, "arena")
    try:
        # an arena whose last MiB is no whole 2 MiB page: the population says how much is not
        d = daemon(work, os.path.join(mnt, "odd"), size="65m")
        try:
            d.wait_ready()
            wait_for(lambda: "of the arena's 65 MiB are mapped as 2 MiB pages" in d.output(), 60,
                     "the population's line on the pages not mapped as 2 MiB ones", interval=0.1)
            assert "alloc: 64 of the arena's 65 MiB are mapped as 2 MiB pages" in d.output()
            d.stop()
        finally:
            d.reap()
        os.unlink(os.path.join(mnt, "odd"))
        rnd = random.Random(11)
        for run in range(2):
            d = daemon(work, path)
            try:
                d.wait_ready()
                out = d.output()
                if "shmem_enabled deny" in out:
                    pytest.skip("shmem_enabled is deny on this host: no huge tmpfs pages")
                assert f"is on transparent huge pages of the tmpfs file {path}" in out, out
                assert "its mount's huge=within_size" in out, out
                with kvstash.Client(d.unix_path) as c:
                    st = c.stats()
                    assert st["memory_hugepages"] == 1
                    assert st["memory_file_reused"] == run
                    wait_for(lambda: c.stats()["memory_prefaulted"] == 64 * MIB, 60,
                             "the population to cover the arena")
                    if run == 1:
                        assert st["memory_file_resident"] == 64 * MIB
                    assert pmd_mapped_kb(d.pid) >= 64 * 1024, "mapped as 2 MiB pages"
                    assert "are mapped as 2 MiB pages, the rest" not in d.output(), d.tail()
                store_all_ways(d, rnd, f"run{run}")
                d.stop()
            finally:
                d.reap()
    finally:
        subprocess.run(["umount", mnt], check=False)
        os.rmdir(mnt)
