"""Produces each reason a LOOKUP chunk can miss for, on purpose, over the
real wire, for kvdock's miss-reason interop test. It uses the emulated
LMCache worker of lmcache_worker.py (pyzmq, msgpack, torch, SHM).

The server runs with a pool of 16 chunks (64 MiB, 4 MiB chunks), the default
lock caps (one instance may lock half the pool) and a short write TTL. Each
step prints what it did; the Go test then checks /status's breakdown.

Usage: misses_worker.py ENDPOINT JSON_PARAMS (status_url, write_ttl)
"""

import json
import sys
import time
import urllib.request

from lmcache_worker import (NO_REPLY, Client, Failure, Worker, check, key, lookup, make_chunk,
                            tokens_for)


def status(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def prompt(wk, seed, n):
    return tokens_for(seed, n * wk.chunk), [make_chunk(wk.shape, wk.dtype, seed * 100 + i) for i in range(n)]


def run(endpoint, p):
    url = p["status_url"]
    # 4 MiB chunks: 2 × 2 layers × 256 tokens × 1024 × float32.
    base = dict(model="miss-model", world=1, layers=2, hidden=1024, dtype="float32", mla=False)
    a = Worker(endpoint, base, instance_id=7001, worker_id=0)
    check(a.mode == "shm", f"worker A runs {a.mode}, want shm")
    sched1 = Client(endpoint, "nongpu-v1")
    ctx1 = dict(base)
    steps = {}

    # other_layout: A (world size 1) stores 2 chunks; workers of world size
    # 2 register the same model name with another layout and their
    # scheduler looks the prompt up: its keys differ, nothing is shareable.
    t, d = prompt(a, 41, 2)
    check(a.store(t, d, "s-other") is True, "store for other_layout")
    ws2 = dict(base, world=2, hidden=512)
    b = Worker(endpoint, ws2, instance_id=7002, worker_id=0)
    sched2 = Client(endpoint, "nongpu-v1")
    steps["other_layout"] = lookup(sched2, ws2, t, "l-other")

    # never_stored: a prompt nobody stored.
    t, _ = prompt(a, 42, 3)
    steps["never_stored"] = lookup(sched1, ctx1, t, "l-never")

    # expired: PREPARE_STORE reserves 2 slots and the worker never commits:
    # the server gives the store up (the transfer module at half the write
    # TTL, or the pool at the TTL; polled through /status).
    t, _ = prompt(a, 43, 2)
    prep = a.c.call("PREPARE_STORE", a.key(t, 0, len(t), "s-expire"), a.instance_id)
    check(len(prep["context"]["slots"]) == 2, f"prepare_store reserved {prep!r}")
    deadline = time.monotonic() + 10 * p["write_ttl"] + 30
    while True:
        st = status(url)
        # No write lock left: the reservation is gone, and its keys noted.
        gone = st["transfer"]["expired"] >= 1 or st["pool"]["expired_write_locks"] >= 2
        if gone and st["pool"]["write_locked"] == 0:
            break
        check(time.monotonic() < deadline, "the write locks never expired")
        time.sleep(0.05)
    steps["expired"] = lookup(sched1, ctx1, t, "l-expire")

    # evicted: 4 chunks, then 16 more in two stores of 8 (the instance lock
    # cap is half the pool) fill the 16-chunk pool: the 4 (and the 2 of
    # other_layout, older still) are evicted, LRU first.
    t, d = prompt(a, 44, 4)
    check(a.store(t, d, "s-evict") is True, "store to be evicted")
    for seed in (45, 46):
        tf, df = prompt(a, seed, 8)
        check(a.store(tf, df, f"s-fill-{seed}") is True, f"fill {seed}")
    steps["evicted"] = lookup(sched1, ctx1, t, "l-evict")

    # refused: 17 chunks in one store can never fit the 16-chunk pool.
    t, d = prompt(a, 47, 17)
    r = a.store(t, d, "s-refuse")
    check(r is None, f"a store larger than the pool answered {r!r}")
    steps["refused"] = lookup(sched1, ctx1, t, "l-refuse")

    # cleared: 2 chunks stored, then CLEAR over the wire.
    t, d = prompt(a, 48, 2)
    check(a.store(t, d, "s-clear") is True, "store to be cleared")
    a.c.call("CLEAR")
    steps["cleared"] = lookup(sched1, ctx1, t, "l-clear")

    # after_miss: chunks 1 and 2 of a prompt stored, chunk 0 not: chunk 0 is
    # never stored, 1 and 2 miss only because a LOOKUP serves a prefix.
    t, d = prompt(a, 49, 3)
    check(a.store(t, d[1:], "s-gap", start=a.chunk) is True, "store behind a gap")
    steps["after_miss"] = lookup(sched1, ctx1, t, "l-gap")

    # A full hit adds nothing to the breakdown.
    t, d = prompt(a, 50, 1)
    check(a.store(t, d, "s-hit") is True, "store to hit")
    steps["hit"] = lookup(sched1, ctx1, t, "l-hit")
    for wk in (a, b):
        wk.close()
    sched1.close()
    sched2.close()
    return {"hits": steps}


def main():
    endpoint, params = sys.argv[1], json.loads(sys.argv[2])
    try:
        out = run(endpoint, params)
    except Failure as e:
        print(f"FAIL misses: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
