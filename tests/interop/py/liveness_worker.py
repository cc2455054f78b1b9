"""Long-lived emulated LMCache workers for kvdock's liveness interop tests.

Each role talks to kvdock like lmcache_worker.py's Worker (real DEALER,
msgpack, SHM views), prints one JSON line per step and, where the test must
act in between (SIGKILL, kvdock ctl unregister), waits for a line on stdin.

Usage: liveness_worker.py ENDPOINT ROLE [JSON_PARAMS]
Roles:
  hold     register, PING with the id (engine-driven) or without (seed),
           store one chunk, then prepare a second store and write into its
           slot without committing; print {"ready": ...}; wait for stdin.
           On "again": check an answer-less PREPARE_STORE (the instance is
           gone), register again, store, print {"again": ...}.
  reuse    register the id a "hold" worker holds (from this new DEALER),
           then look up, retrieve and commit the key the old worker prepared
           and never committed: print what each answered.
  probe    send PREPARE_STORE for an id and print whether anything answered.
"""

import json
import sys

from lmcache_worker import Client, Failure, Worker, check, key, lookup, make_chunk, tokens_for


def say(obj):
    print(json.dumps(obj), flush=True)


def ping(wk, p):
    if p["profile"] == "engine-driven":
        return wk.c.call("PING", wk.instance_id)
    return wk.c.call("PING")


def half_written_key(wk, p):
    """Prepares a store of the pending prompt and writes into its slot
    without committing: what a worker killed mid-store leaves."""
    tokens = tokens_for(p["pending_seed"], wk.chunk)
    k = wk.key(tokens, 0, wk.chunk, "pending-req")
    prep = wk.c.call("PREPARE_STORE", k, wk.instance_id)
    slots = prep["context"]["slots"]
    check(len(slots) == 1, f"pending prepare gave {len(slots)} slots")
    wk.view(slots[0]).copy_(make_chunk(wk.shape, wk.dtype, 77))
    return tokens


def role_hold(endpoint, p):
    wk = Worker(endpoint, p, instance_id=p["instance_id"], worker_id=0)
    check(wk.mode == "shm", f"worker mode {wk.mode}")
    check(ping(wk, p) is True, "PING")
    stored = tokens_for(p["stored_seed"], wk.chunk)
    check(wk.store(stored, [make_chunk(wk.shape, wk.dtype, 5)], "stored-req") is True, "store")
    half_written_key(wk, p)
    check(ping(wk, p) is True, "PING after the prepare")
    say({"ready": True, "mode": wk.mode})
    line = sys.stdin.readline().strip()
    if line != "again":
        return
    # The instance was removed: a seed-era worker gets no answer (as any
    # unregistered one), registers again and works.
    k = wk.key(stored, 0, wk.chunk, "after-req")
    gone = probe_call(wk.c, k, wk.instance_id)
    again = Worker(endpoint, p, instance_id=p["instance_id"], worker_id=0)
    fresh = tokens_for(p["stored_seed"] + 1000, again.chunk)
    ok = again.store(fresh, [make_chunk(again.shape, again.dtype, 6)], "fresh-req")
    say({"again": True, "answered_while_removed": gone, "store_after_register": ok})


def probe_call(c, k, instance_id):
    """PREPARE_STORE for instance_id; "none" when nothing answers in 1.5 s,
    else the answer's repr (an unregistered instance gets PREPARE_STORE's
    failure reply, an empty context)."""
    try:
        r = c.call("PREPARE_STORE", k, instance_id, timeout=1.5)
    except Failure:
        return "none"
    return repr(r)


def role_probe(endpoint, p):
    c = Client(endpoint, p["profile"])
    tokens = tokens_for(p["stored_seed"], p["chunk"])
    k = key(p["model"], p["world"], 0, tokens, 0, p["chunk"], "probe-req")
    say({"answer": probe_call(c, k, p["instance_id"])})


def role_reuse(endpoint, p):
    wk = Worker(endpoint, p, instance_id=p["instance_id"], worker_id=0)
    tokens = tokens_for(p["pending_seed"], wk.chunk)
    sched = Client(endpoint, p["profile"])
    hits = lookup(sched, p, tokens, "reuse-req")
    got = wk.retrieve(tokens, 1, "reuse-req")
    # The old worker's commit, sent now under the reused id, publishes nothing.
    k = wk.key(tokens, 0, wk.chunk, "pending-req")
    commit = wk.c.call("COMMIT_STORE", k, wk.instance_id, b"")
    hits_after = lookup(sched, p, tokens, "reuse-req-2")
    say({"lookup_hits": hits, "retrieved": got is not None, "commit": commit, "lookup_hits_after_commit": hits_after})


ROLES = {"hold": role_hold, "reuse": role_reuse, "probe": role_probe}


def main():
    endpoint, role = sys.argv[1], sys.argv[2]
    p = dict(model="interop-model", world=1, layers=2, hidden=16, dtype="float32", mla=False,
             profile="nongpu-v1", instance_id=4242, stored_seed=11, pending_seed=12)
    p.update(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
    try:
        ROLES[role](endpoint, p)
    except Failure as e:
        print(f"FAIL {role}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
