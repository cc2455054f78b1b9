"""A worker of one LMCache table (nongpu-v1, nongpu-v2, engine-driven,
engine-driven-v2 or rpc-messages), for kvdock's protocol tests.

Frames tables send one msgpack frame per argument (as MessageQueueClient did
up to the engine-driven era); rpc-messages sends one request struct per
message and reads one reply struct per answer (mq.py @ 00e8c126), encoded
the way msgspec encodes the upstream dataclasses: a map of every field in
declaration order. It registers, stores chunks (SHM when the server
advertises a segment, pickle otherwise), retrieves them and checks the bytes
are identical, clears the cache (with force where the table has it) and
checks a lookup then misses, asks the chunk size and unregisters. It prints one JSON
line and exits 0 when every check held.

Usage: proto_worker.py ENDPOINT JSON_PARAMS
"""

import json
import sys

import msgpack

import lmcache_worker as lw

# engine-driven: protocols/base.py @ 006ebb57; engine-driven-v2 and
# rpc-messages: the frozen table of tests/v1/multiprocess/test_protocols.py
# @ 00e8c126.
lw.PROFILES["engine-driven"] = dict(
    LOOKUP=5, QUERY_PREFETCH_STATUS=6, QUERY_PREFETCH_LOOKUP_HITS=7, FREE_LOOKUP_LOCKS=8,
    END_SESSION=9, REGISTER=10, UNREGISTER=11, PREPARE_STORE=12, COMMIT_STORE=13,
    PREPARE_RETRIEVE=15, COMMIT_RETRIEVE=16, CLEAR=17, GET_CHUNK_SIZE=18, PING=19, NOOP=21,
)
lw.PROFILES["engine-driven-v2"] = dict(
    LOOKUP=8, QUERY_PREFETCH_STATUS=9, WAIT_PREFETCH_STATUS=10, QUERY_PREFETCH_LOOKUP_HITS=11,
    FREE_LOOKUP_LOCKS=12, END_SESSION=13, REGISTER=14, UNREGISTER=15, PREPARE_STORE=16,
    COMMIT_STORE=17, PREPARE_RETRIEVE=18, COMMIT_RETRIEVE=19, CLEAR=20, GET_CHUNK_SIZE=21,
    PING=22, NOOP=24, GET_EXPERIMENTAL=32,
)
lw.PROFILES["rpc-messages"] = dict(
    LOOKUP=8, QUERY_PREFETCH_STATUS=9, WAIT_PREFETCH_STATUS=10, QUERY_PREFETCH_LOOKUP_HITS=11,
    FREE_LOOKUP_LOCKS=12, END_SESSION=13, REGISTER=14, UNREGISTER=15, PREPARE_STORE=16,
    COMMIT_STORE=17, PREPARE_RETRIEVE=18, COMMIT_RETRIEVE=19, CLEAR=20, GET_CHUNK_SIZE=21,
    PING=22, NOOP=24,
)

# Request struct fields (rpc_messages/*.py); None: the struct is the one
# argument itself (RegisterKvCacheEngineDrivenContextRequest).
FIELDS = {
    "LOOKUP": ["key", "tp_size"], "QUERY_PREFETCH_STATUS": ["request_id"],
    "WAIT_PREFETCH_STATUS": ["request_id", "timeout"], "QUERY_PREFETCH_LOOKUP_HITS": ["request_id"],
    "FREE_LOOKUP_LOCKS": ["key", "tp_size"], "END_SESSION": ["request_id"], "REGISTER": None,
    "UNREGISTER": ["instance_id"], "PREPARE_STORE": ["key", "instance_id"],
    "COMMIT_STORE": ["key", "instance_id", "data"], "PREPARE_RETRIEVE": ["key", "instance_id"],
    "COMMIT_RETRIEVE": ["key", "instance_id"], "CLEAR": ["force"], "GET_CHUNK_SIZE": [],
    "PING": ["instance_id"], "NOOP": [], "GET_EXPERIMENTAL": [],
}
# Reply struct field of scalar results; other replies are structs as is.
REPLY = {
    "QUERY_PREFETCH_STATUS": "chunk_count", "WAIT_PREFETCH_STATUS": "chunk_count",
    "QUERY_PREFETCH_LOOKUP_HITS": "chunk_count", "COMMIT_STORE": "success",
    "COMMIT_RETRIEVE": "success", "GET_CHUNK_SIZE": "chunk_size", "PING": "ok", "NOOP": "message",
    "GET_EXPERIMENTAL": "names",
}
STRUCT_REPLY = {"REGISTER", "PREPARE_STORE", "PREPARE_RETRIEVE"}
# What GET_EXPERIMENTAL names per table: the poll channel where the table
# has POLL_KV_EVENTS (protocols/base.py @ 593e6c13 numbers it 34).
EXPERIMENTAL = {"engine-driven-v2": ["kv_events"]}


class Client(lw.Client):
    def __init__(self, endpoint, profile, timeout=5.0):
        super().__init__(endpoint, profile, timeout)
        self.profile = profile

    def call(self, name, *args, raw=None, timeout=None):
        if self.profile != "rpc-messages" or raw is not None:
            return super().call(name, *args, raw=raw, timeout=timeout)
        fields = FIELDS[name]
        msg = args[0] if fields is None else dict(zip(fields, args))
        res = super().call(name, raw=[msgpack.packb(msg, use_bin_type=True)], timeout=timeout)
        lw.check(res is not lw.NO_REPLY, f"{name}: the reply carried no struct")
        lw.check(isinstance(res, dict), f"{name}: reply {res!r} is not a struct")
        if name in REPLY:
            lw.check(set(res) == {REPLY[name]}, f"{name}: reply fields {sorted(res)}")
            return lw.NO_REPLY if res[REPLY[name]] is None else res[REPLY[name]]
        if name in STRUCT_REPLY:
            return res
        lw.check(res == {}, f"{name}: reply {res!r}, want the empty struct")
        return lw.NO_REPLY


class Worker(lw.Worker):
    """lw.Worker without the GET_CHUNK_SIZE right after registering (the
    chunk size comes with the params), registering with the payload of its
    era."""

    def __init__(self, endpoint, p, instance_id, worker_id):
        self.c = Client(endpoint, p["profile"])
        self.p, self.instance_id, self.worker_id = p, instance_id, worker_id
        if "GET_EXPERIMENTAL" in self.c.num:
            # As the frozen-number workers do at start; under --protocol
            # auto it tells engine-driven-v2 from engine-driven-v2-early.
            # kvdock names its KV event poll channel (log on by default)
            # to the table that serves POLL_KV_EVENTS.
            want = EXPERIMENTAL.get(p["profile"], [])
            got = self.c.call("GET_EXPERIMENTAL")
            lw.check(got == want, f"GET_EXPERIMENTAL {got!r}, want {want!r}")
        reg = {
            "instance_id": instance_id, "model_name": p["model"], "world_size": p["world"],
            "block_size": 16, "num_layers": p["layers"], "hidden_dim_size": p["hidden"],
            "dtype_str": p["dtype"], "use_mla": p["mla"],
        }
        if p["profile"] == "rpc-messages":
            reg["num_physical_slots"] = None
        reply = self.c.call("REGISTER", reg)
        lw.check(isinstance(reply, dict), f"register reply {reply!r}")
        self.shm_name, self.pool_size = reply["shm_name"], reply["pool_size"]
        self.chunk = p["chunk"]
        self.shape = lw.chunk_shape(p, self.chunk)
        self.dtype = lw.DTYPES[p["dtype"]]
        self.shm, self.mode = None, "pickle"
        if self.shm_name and self.pool_size > 0:
            from multiprocessing import resource_tracker, shared_memory
            self.shm = shared_memory.SharedMemory(name=self.shm_name, create=False)
            resource_tracker.unregister(self.shm._name, "shared_memory")
            self.mode = "shm"


def main():
    endpoint, p = sys.argv[1], json.loads(sys.argv[2])
    steps = []
    try:
        w = Worker(endpoint, p, p["instance_id"], 0)
        steps.append(["register", w.mode])
        tokens = lw.tokens_for(p["seed"], 2 * p["chunk"])
        chunks = [lw.make_chunk(w.shape, w.dtype, p["seed"] * 10 + i) for i in range(2)]
        ok = w.store(tokens, chunks, "req-%d" % p["instance_id"])
        lw.check(ok is True, f"COMMIT_STORE answered {ok!r}")
        steps.append(["store", 2])
        # The scheduler side, its own DEALER (a peer of its own): LOOKUP,
        # then WAIT_PREFETCH_STATUS (newest) or QUERY_PREFETCH_STATUS polls.
        sched = Client(endpoint, p["profile"])
        rid = "ret-%d" % p["instance_id"]
        if p["profile"] in ("rpc-messages", "engine-driven-v2"):
            k = lw.key(p["model"], p["world"], None, tokens, 0, len(tokens), rid)
            lw.check(sched.call("LOOKUP", k, 1) is lw.NO_REPLY, "LOOKUP answered a result")
            hits = sched.call("WAIT_PREFETCH_STATUS", rid, 5.0)
        else:
            hits = lw.lookup(sched, p, tokens, rid)
        lw.check(hits == 2, f"lookup hits {hits!r}, want 2")
        got = w.retrieve(tokens, 2, rid)
        lw.check(got is not None and len(got) == 2, f"retrieve got {got!r}")
        for a, b in zip(got, chunks):
            lw.check(a.dtype == b.dtype and list(a.shape) == list(b.shape) and lw.same(a, b),
                     "retrieved bytes differ from the stored ones")
        steps.append(["retrieve", "identical"])
        sched.call("END_SESSION", rid)
        # CLEAR from the worker's DEALER, settled on its table by now (a
        # scheduler that only looked up is not: CLEAR's number means other
        # requests in other tables). [force] where the table has it
        # (engine-driven tolerates it; the newest ClearRequest.force, PR
        # #5158), [] before. The stored chunks are gone afterwards.
        if p["profile"] in ("nongpu-v1", "nongpu-v2"):
            res = w.c.call("CLEAR")
        else:
            res = w.c.call("CLEAR", True)
        lw.check(res is lw.NO_REPLY, f"CLEAR answered {res!r}")
        rid2 = rid + "-after-clear"
        if p["profile"] in ("rpc-messages", "engine-driven-v2"):
            k = lw.key(p["model"], p["world"], None, tokens, 0, len(tokens), rid2)
            sched.call("LOOKUP", k, 1)
            hits = sched.call("WAIT_PREFETCH_STATUS", rid2, 5.0)
        else:
            hits = lw.lookup(sched, p, tokens, rid2)
        lw.check(hits == 0, f"lookup after CLEAR hits {hits!r}, want 0")
        steps.append(["clear", hits])
        sched.call("END_SESSION", rid2)
        sched.close()
        n = w.c.call("GET_CHUNK_SIZE")
        lw.check(n == p["chunk"], f"GET_CHUNK_SIZE answered {n!r}")
        steps.append(["chunk_size", n])
        w.close()
        steps.append(["unregister"])
    except lw.Failure as e:
        print(json.dumps({"profile": p["profile"], "steps": steps, "error": str(e)}))
        sys.exit(1)
    print(json.dumps({"profile": p["profile"], "steps": steps}))


if __name__ == "__main__":
    main()
