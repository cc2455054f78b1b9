"""Stores chunks at a steady pace through kvdock, as an LMCache MP worker,
so the dashboard's rates have something to show over several seconds.

Usage: store_paced.py ENDPOINT JSON_PARAMS
params: instance_id, prompts, chunks (per prompt), pause (seconds between
prompts), and the worker layout (layers, hidden, dtype). The worker stays
registered when it is done (it exits without UNREGISTER), so kvdock keeps
its context and its counters. Prints one JSON line; exits 1 on a failure.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interop", "py"))

import lmcache_worker as lw  # noqa: E402


def main():
    endpoint = sys.argv[1]
    p = dict(model="rates-model", world=1, layers=2, hidden=16, dtype="float32", mla=False)
    p.update(json.loads(sys.argv[2]))
    try:
        wk = lw.Worker(endpoint, p, instance_id=p["instance_id"], worker_id=0)
        sched = lw.Client(endpoint, "nongpu-v1")
        stored = hits = 0
        for q in range(p["prompts"]):
            tokens = lw.tokens_for(p["instance_id"] * 1000 + q, p["chunks"] * wk.chunk)
            data = [lw.make_chunk(wk.shape, wk.dtype, q * 100 + i) for i in range(p["chunks"])]
            r = wk.store(tokens, data, f"sp-{q}")
            lw.check(r in (True, None), f"prompt {q}: store answered {r!r}")
            stored += len(data)
            # The scheduler asks for what was just stored (lookups and hits),
            # then the worker loads the hits, which releases their locks.
            h = lw.lookup(sched, p, tokens, f"sp-l-{q}")
            hits += h
            if h:
                got = wk.retrieve(tokens, h, f"sp-l-{q}")
                lw.check(got is not None and all(lw.same(a, b) for a, b in zip(got, data)), f"prompt {q}: read back")
            sched.call("END_SESSION", f"sp-l-{q}")
            time.sleep(p.get("pause", 0.1))
        wk.close(unregister=False)
        sched.close()
    except lw.Failure as e:
        print(f"FAIL store_paced: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"mode": wk.mode, "stored": stored, "hits": hits, "chunk_bytes": wk.view_bytes()}))


if __name__ == "__main__":
    main()
