"""An emulated LMCache engine-driven worker of a hybrid-attention model (two
or more KV groups), for kvdock's interop tests.

It speaks the engine-driven table (protocols/base.py @ 006ebb57: COMMIT_STORE_GROUP
at 14) with pyzmq and msgpack as lmcache_worker.py does, registers
RegisterEngineDrivenContextPayload with group_layouts (GroupLayoutInfo maps;
the flat fields repeat group 0's), and moves each group's chunks:

- pickle (the engine-driven worker's multi-group path of that era): one
  COMMIT_STORE_GROUP per group carrying
  pickle.dumps([[("tensor", chunk), ...]], HIGHEST_PROTOCOL), and
  PREPARE_RETRIEVE whose data it reads back as upstream's
  _deserialize_multi_group_chunks does (tagged pairs or bare tensors);
- shm (the grouped SHM transfer): PREPARE_STORE slots with chunk_indices and
  group_ids, views over the segment, COMMIT_STORE b"", and PREPARE_RETRIEVE
  slots with group_ids.

Usage: hybrid_worker.py ENDPOINT SCENARIO [JSON_PARAMS]; prints one JSON line.
"""

import json
import pickle
import sys

import torch

import lmcache_worker as lw
from lmcache_worker import NO_REPLY, Client, Failure, check, key, make_chunk, same, tokens_for

# The engine-driven table (spec 1.4, protocols/base.py @ 006ebb57), shared
# with the other workers in lmcache_worker.PROFILES.
PROFILE = "engine-driven"


def group_shape(g, chunk):
    """A group's chunk tensor, sized as upstream's worker sizes it."""
    tpb = g["tokens_per_block"] if g["tokens_per_block"] > 0 else g["block_size"]
    tokens = chunk // tpb * tpb
    if g["use_mla"]:
        return [g["num_layers"], tokens, g["hidden_dim_size"]]
    return [2, g["num_layers"], tokens, g["hidden_dim_size"]]


def serialize_group(chunks):
    """upstream's _serialize_single_group_chunks for non-fp8 chunks."""
    return pickle.dumps([[("tensor", t.contiguous()) for t in chunks]], protocol=pickle.HIGHEST_PROTOCOL)


def deserialize_groups(data):
    """upstream's _deserialize_multi_group_chunks for non-fp8 chunks."""
    out = []
    for group in pickle.loads(data):
        items = []
        for it in group:
            if isinstance(it, tuple) and len(it) == 2 and it[0] == "tensor":
                it = it[1]
            check(isinstance(it, torch.Tensor), f"group item {type(it)}")
            items.append(it)
        out.append(items)
    return out


class HybridWorker:
    def __init__(self, endpoint, p, instance_id, groups, force_pickle=False, model=None):
        self.c = Client(endpoint, PROFILE)
        self.p, self.instance_id, self.groups = p, instance_id, groups
        self.model = model or p["model"]
        g0 = groups[0]
        self.reply = self.c.call("REGISTER", {
            "instance_id": instance_id, "model_name": self.model, "world_size": 1,
            "block_size": g0["block_size"], "num_layers": g0["num_layers"],
            "hidden_dim_size": g0["hidden_dim_size"], "dtype_str": g0["dtype_str"],
            "use_mla": g0["use_mla"], "group_layouts": groups,
        }, timeout=p.get("register_timeout"))
        check(isinstance(self.reply, dict), f"register reply {self.reply!r}")
        self.chunk = self.c.call("GET_CHUNK_SIZE")
        self.shapes = [group_shape(g, self.chunk) for g in groups]
        self.dtypes = [lw.DTYPES[g["dtype_str"]] for g in groups]
        self.shm, self.mode = None, "pickle"
        if self.reply["shm_name"] and self.reply["pool_size"] > 0 and not force_pickle:
            from multiprocessing import resource_tracker, shared_memory
            self.shm = shared_memory.SharedMemory(name=self.reply["shm_name"], create=False)
            resource_tracker.unregister(self.shm._name, "shared_memory")
            self.mode = "shm"

    def key(self, tokens, start, end, rid):
        return key(self.model, 1, 0, tokens, start, end, rid)

    def chunks(self, seed, n):
        """n chunks per group, each of its group's shape and dtype."""
        return [[make_chunk(self.shapes[g], self.dtypes[g], seed * 1000 + g * 100 + i) for i in range(n)]
                for g in range(len(self.groups))]

    def view(self, slot, g):
        dtype = self.dtypes[g]
        check(slot["dtype"] == self.groups[g]["dtype_str"], f"group {g} slot dtype {slot['dtype']}")
        check(slot["shape"] == self.shapes[g], f"group {g} slot shape {slot['shape']} != {self.shapes[g]}")
        itemsize = torch.tensor([], dtype=dtype).element_size()
        return torch.frombuffer(self.shm.buf, dtype=dtype, count=slot["length"] // itemsize,
                                offset=slot["offset"]).view(slot["shape"])

    def store(self, tokens, data, rid, only_groups=None):
        """Stores data[g][i] for every group; returns the answers."""
        n = len(data[0])
        k = self.key(tokens, 0, n * self.chunk, rid)
        if self.mode == "shm":
            prep = self.c.call("PREPARE_STORE", k, self.instance_id)
            ctx = prep["context"]
            slots, idx, gids = ctx["slots"], ctx["chunk_indices"], ctx["group_ids"]
            check(len(slots) == len(idx) == len(gids), "slot lists of different lengths")
            for s, i, g in zip(slots, idx, gids):
                self.view(s, g).copy_(data[g][i])
            return [self.c.call("COMMIT_STORE", k, self.instance_id, b"")]
        groups = range(len(self.groups)) if only_groups is None else only_groups
        return [self.c.call("COMMIT_STORE_GROUP", k, self.instance_id, g, serialize_group(data[g])) for g in groups]

    def retrieve(self, tokens, n, rid):
        """Returns the groups' chunks, or None on a miss."""
        k = self.key(tokens, 0, n * self.chunk, rid)
        r = self.c.call("PREPARE_RETRIEVE", k, self.instance_id)
        check(isinstance(r, dict), f"prepare_retrieve reply {r!r}")
        out = None
        if r["success"]:
            if self.mode == "shm":
                ctx = r["context"]
                out = [[] for _ in self.groups]
                for s, g in zip(ctx["slots"], ctx["group_ids"]):
                    out[g].append(self.view(s, g).clone())
            elif r["data"]:
                out = deserialize_groups(r["data"])
        check(self.c.call("COMMIT_RETRIEVE", k, self.instance_id) is True, "commit_retrieve")
        return out

    def close(self):
        check(self.c.call("UNREGISTER", self.instance_id) is NO_REPLY, "UNREGISTER reply")
        if self.shm is not None:
            self.shm.close()
        self.c.close()


def lookup(sched, model, tokens, rid):
    k = key(model, 1, None, tokens, 0, len(tokens), rid)
    check(sched.call("LOOKUP", k, 1) is NO_REPLY, "LOOKUP must answer without a result")
    for _ in range(500):
        hits = sched.call("QUERY_PREFETCH_STATUS", rid)
        if hits is not NO_REPLY:
            return hits
    raise Failure("prefetch never finished")


def same_groups(got, want):
    if got is None or len(got) != len(want):
        return False
    return all(len(a) == len(b) and all(same(x, y) for x, y in zip(a, b)) for a, b in zip(got, want))


def scenario_roundtrip(endpoint, p):
    """Stores and retrieves a hybrid model's groups; every tensor comes back
    equal (torch.equal, dtype and shape)."""
    w = HybridWorker(endpoint, p, 4001, p["groups"], force_pickle=p.get("force_pickle", False))
    sched = Client(endpoint, PROFILE)
    n = p.get("chunks", 3)
    tokens = tokens_for(41, n * w.chunk + 3)
    data = w.chunks(1, n)
    answers = w.store(tokens, data, "hy-store")
    check(all(a is True for a in answers), f"store answers {answers}")
    hits = lookup(sched, w.model, tokens, "hy-ret")
    check(hits == n, f"lookup hits {hits}, want {n}")
    got = w.retrieve(tokens, n, "hy-ret")
    check(same_groups(got, data), "retrieved groups differ from the stored ones")
    sched.call("END_SESSION", "hy-ret")
    w.close()
    sched.close()
    return {"mode": w.mode, "hits": hits, "shapes": w.shapes,
            "dtypes": [g["dtype_str"] for g in p["groups"]]}


def call_or_none(c, name, *args):
    try:
        return c.call(name, *args, timeout=1.0)
    except Failure:
        return "no answer"


def scenario_hostile(endpoint, p):
    """Hostile group requests: each is refused (no answer: the profile drops
    errors) or answered false, never stores a servable chunk, and the server
    keeps serving; a store of group 1 only is never a hit."""
    groups = p["groups"]
    w = HybridWorker(endpoint, p, 4101, groups, force_pickle=True)
    sched = Client(endpoint, PROFILE)
    tokens = tokens_for(51, 2 * w.chunk)
    data = w.chunks(2, 2)
    k = w.key(tokens, 0, 2 * w.chunk, "hs")
    out = {}
    out["group 2"] = call_or_none(w.c, "COMMIT_STORE_GROUP", k, w.instance_id, 2, serialize_group(data[1]))
    out["group -1"] = call_or_none(w.c, "COMMIT_STORE_GROUP", k, w.instance_id, -1, serialize_group(data[1]))
    out["group 2**40"] = call_or_none(w.c, "COMMIT_STORE_GROUP", k, w.instance_id, 2**40, serialize_group(data[1]))
    # Group 0's chunks sent as group 1 (other shape and dtype), and one chunk short.
    out["group 0 data as group 1"] = call_or_none(w.c, "COMMIT_STORE_GROUP", k, w.instance_id, 1, serialize_group(data[0]))
    out["one chunk short"] = call_or_none(w.c, "COMMIT_STORE_GROUP", k, w.instance_id, 1, serialize_group(data[1][:1]))
    out["truncated shape"] = call_or_none(w.c, "COMMIT_STORE_GROUP", k, w.instance_id, 1,
                                          serialize_group([t.flatten()[:-1] for t in data[1]]))
    for name, a in out.items():
        check(a is not True, f"{name}: answered {a!r}")
        check(w.c.call("NOOP") == "OK", f"server stopped answering after {name}")
    check(lookup(sched, w.model, tokens, "hs-l0") == 0, "hostile commits made a hit")
    # Group 1 alone (valid): stored, yet never served as a full chunk.
    out["group 1 only"] = w.store(tokens, data, "hs-g1", only_groups=[1])
    check(out["group 1 only"] == [True], f"group 1 store {out['group 1 only']}")
    check(lookup(sched, w.model, tokens, "hs-l1") == 0, "group 1 alone is a hit")
    check(w.retrieve(tokens, 2, "hs-l1") is None, "group 1 alone was served")
    # Then group 0: the chunks are whole and come back exactly.
    check(w.store(tokens, data, "hs-g0", only_groups=[0]) == [True], "group 0 store")
    check(lookup(sched, w.model, tokens, "hs-l2") == 2, "both groups stored: not a hit")
    check(same_groups(w.retrieve(tokens, 2, "hs-l2"), data), "bytes after a split store")
    # Too many groups are refused; other groups for the same model register
    # beside it (their keys name their own layout).
    many = [groups[0]] * 17
    out["17 groups"] = call_or_none(Client(endpoint, PROFILE), "REGISTER", {
        "instance_id": 4102, "model_name": "hy-many", "world_size": 1, "block_size": 4, "num_layers": 1,
        "hidden_dim_size": 4, "dtype_str": "float16", "use_mla": False, "group_layouts": many})
    check(out["17 groups"] == "no answer", f"17 groups answered {out['17 groups']!r}")
    other = [dict(groups[0]), dict(groups[1], hidden_dim_size=groups[1]["hidden_dim_size"] * 2)]
    oc = Client(endpoint, PROFILE)
    out["other groups"] = call_or_none(oc, "REGISTER", {
        "instance_id": 4103, "model_name": w.model, "world_size": 1, "block_size": 4, "num_layers": 1,
        "hidden_dim_size": 4, "dtype_str": "float16", "use_mla": False, "group_layouts": other})
    check(isinstance(out["other groups"], dict), f"other groups answered {out['other groups']!r}")
    # A LOOKUP answers for every registered layout: the other groups' worker
    # stored nothing, so the prompt misses until it unregisters.
    check(lookup(sched, w.model, tokens, "hs-lo") == 0, "a hit the other groups' worker cannot retrieve")
    check(oc.call("UNREGISTER", 4103) is NO_REPLY, "UNREGISTER reply")
    oc.close()
    # The same instance id registered again with other groups keeps its first
    # registration: its chunks still come back exactly.
    again = call_or_none(w.c, "REGISTER", {
        "instance_id": 4101, "model_name": w.model, "world_size": 1, "block_size": 4, "num_layers": 1,
        "hidden_dim_size": 4, "dtype_str": "float16", "use_mla": False, "group_layouts": other})
    check(isinstance(again, dict), f"re-register answered {again!r}")
    check(lookup(sched, w.model, tokens, "hs-l3") == 2, "re-register lost the chunks")
    check(same_groups(w.retrieve(tokens, 2, "hs-l3"), data), "bytes after a re-register")
    w.close()
    sched.close()
    return {k: str(v) for k, v in out.items()}


SCENARIOS = {"roundtrip": scenario_roundtrip, "hostile": scenario_hostile}


def main():
    endpoint, name = sys.argv[1], sys.argv[2]
    p = dict(model="hybrid-model")
    p.update(json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
    try:
        out = SCENARIOS[name](endpoint, p)
    except Failure as e:
        print(f"FAIL {name}: {e}", file=sys.stderr)
        sys.exit(1)
    out["torch"] = torch.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
