"""Fault scenarios for kvdock's reliability tests: an emulated LMCache
non-GPU worker (tests/interop/py/lmcache_worker.py, imported, not copied)
that dies with SIGKILL in the middle of a transfer.

Usage: faults.py ENDPOINT SCENARIO [JSON_PARAMS]

It prints one JSON line (flushed) describing what it did just before it
kills itself, so the Go test can check the server side afterwards.
"""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interop", "py"))

import lmcache_worker as lw  # noqa: E402


def die(out):
    print(json.dumps(out), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def scenario_die_mid_store(endpoint, p):
    """PREPARE_STORE, scribble garbage over every reserved slot, SIGKILL
    before COMMIT_STORE."""
    wk = lw.Worker(endpoint, p, instance_id=p["instance_id"], worker_id=0)
    lw.check(wk.mode == "shm", "server did not advertise SHM")
    tokens = lw.tokens_for(p["seed"], p["chunks"] * wk.chunk)
    k = wk.key(tokens, 0, p["chunks"] * wk.chunk, "die-store")
    prep = wk.c.call("PREPARE_STORE", k, wk.instance_id)
    slots = prep["context"]["slots"]
    for s in slots:
        wk.shm.buf[s["offset"]:s["offset"] + s["length"]] = b"\xde\xad" * (s["length"] // 2)
    die({"slots": len(slots), "chunk": wk.chunk})


def scenario_die_mid_retrieve(endpoint, p):
    """PREPARE_RETRIEVE (read locks taken), SIGKILL before COMMIT_RETRIEVE."""
    wk = lw.Worker(endpoint, p, instance_id=p["instance_id"], worker_id=0,
                   force_pickle=p.get("force_pickle", False))
    tokens = lw.tokens_for(p["seed"], p["chunks"] * wk.chunk)
    k = wk.key(tokens, 0, p["chunks"] * wk.chunk, "die-retrieve")
    # LOOKUP takes the read locks PREPARE_RETRIEVE hands over (as LMCache's scheduler does).
    hits = lw.lookup(lw.Client(endpoint, p.get("profile", "nongpu-v1")), p, tokens, "die-retrieve")
    lw.check(hits == p["chunks"], f"lookup hits {hits}")
    r = wk.c.call("PREPARE_RETRIEVE", k, wk.instance_id)
    slots = r["context"].get("slots", []) if isinstance(r["context"], dict) else []
    die({"success": r["success"], "slots": len(slots), "mode": wk.mode})


SCENARIOS = {"die_mid_store": scenario_die_mid_store, "die_mid_retrieve": scenario_die_mid_retrieve}


def main():
    endpoint, name = sys.argv[1], sys.argv[2]
    params = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    p = dict(model="faults-model", world=1, layers=2, hidden=16, dtype="float32", mla=False, chunks=2, seed=1)
    p.update(params)
    try:
        out = SCENARIOS[name](endpoint, p)
    except lw.Failure as e:
        print(f"FAIL {name}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
