"""Integration: the arena's population at start (storage/alloc.c) as a user sees it.

The population is slowed with the test hook KVSTASH_TEST_PREFAULT_PAUSE_MS (a pause before
each 64 MiB chunk), so that it is still under way while the test looks: /readyz answers 503
"starting: populating the arena (N of M bytes)" with N growing, then 200 "ready", never
going back; `stats` memory_prefaulted grows to memory_capacity; the log says when it ended;
and values put while the population writes into the arena's free pages read back
byte-exact once it is done (it never writes a page a value holds). Every wait is bounded.
"""

import hashlib
import os
import random
import re
import time
import urllib.error
import urllib.request

from kvtest import Daemon, free_port, wait_for

MIB = 1 << 20


def readyz(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_population_reported_in_readyz_and_stats_and_values_intact(work):
    port = free_port()
    d = Daemon(work, [f"--metrics_listen=127.0.0.1:{port}", "--memory_size=320m", "--ssd_dir="],
               env={"KVSTASH_TEST_PREFAULT_PAUSE_MS": "400"})
    try:
        d.wait_ready()
        c = d.tcp()
        cap = c.call("stats")["memory_capacity"]
        assert cap == 320 * MIB
        # values put while the population runs: 1 MiB and odd sizes, in the arena's low
        # pages, which the population reaches first or has just passed
        rnd = random.Random(5)
        table = {}
        for i in range(40):
            v = rnd.randbytes(rnd.choice((4096, 70000, MIB, 3 * MIB + 17)))
            k = f"during-{i}".encode()
            assert c.call("put", k, v) == 0
            table[k] = hashlib.sha256(v).hexdigest()
        seen, done = [], []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = readyz(port)
            pref = c.call("stats")["memory_prefaulted"]
            seen.append((status, body.strip(), pref))
            if status == 200:
                break
            time.sleep(0.05)
        assert seen[-1][:2] == (200, "ready"), seen[-5:]
        waiting = [s for s in seen if s[0] == 503]
        assert waiting, "the population was never observed under way"
        assert all(b.startswith("starting: populating the arena (") for _, b, _ in waiting), \
            waiting[:3]
        counts = [int(re.search(r"\((\d+) of (\d+) bytes\)", b).group(1)) for _, b, _ in waiting]
        assert counts == sorted(counts) and counts[-1] < cap, counts
        prefs = [p for _, _, p in seen]
        assert prefs == sorted(prefs), "memory_prefaulted went back"
        assert len(set(prefs)) >= 2, "memory_prefaulted never moved"
        assert c.call("stats")["memory_prefaulted"] == cap
        assert readyz(port)[0] == 200                        # and it stays ready
        wait_for(lambda: "arena of 320 MiB populated in" in d.output(), 10, "the log line")
        for k, digest in table.items():
            got = c.call("get", k)
            assert got is not None and hashlib.sha256(got).hexdigest() == digest, k
        d.stop()
    finally:
        d.reap()
