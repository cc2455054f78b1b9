"""An emulated LMCache MP non-GPU worker, for kvdock's interop tests.

It speaks the seed-era wire protocol the way LMCache's worker code does
(ZMQ DEALER, msgpack frames, SHM through multiprocessing.shared_memory and
torch.frombuffer views, or pickled torch tensors) and runs one scenario given
on the command line. It prints one JSON line with what it saw and exits 0 when
every check held, 1 otherwise (with the reason on stderr).

Usage: lmcache_worker.py ENDPOINT SCENARIO [JSON_PARAMS] [--model M ...]
(run it with --help for the scenarios and the flags; docs/DEVELOPMENT.md
describes it as a tool).
"""

import argparse
import io
import json
import os
import pickle
import sys
import time

import msgpack
import torch
import zmq

# nongpu-v1 (seed) request numbers; nongpu-v2 inserts the separate unregister.
PROFILES = {
    "nongpu-v1": dict(
        LOOKUP=5, QUERY_PREFETCH_STATUS=6, QUERY_PREFETCH_LOOKUP_HITS=7, FREE_LOOKUP_LOCKS=8,
        END_SESSION=9, REGISTER=10, UNREGISTER=2, PREPARE_STORE=11, COMMIT_STORE=12,
        PREPARE_RETRIEVE=13, COMMIT_RETRIEVE=14, CLEAR=15, GET_CHUNK_SIZE=16, PING=17, NOOP=19,
    ),
    "nongpu-v2": dict(
        LOOKUP=5, QUERY_PREFETCH_STATUS=6, QUERY_PREFETCH_LOOKUP_HITS=7, FREE_LOOKUP_LOCKS=8,
        END_SESSION=9, REGISTER=10, UNREGISTER=11, PREPARE_STORE=12, COMMIT_STORE=13,
        PREPARE_RETRIEVE=14, COMMIT_RETRIEVE=15, CLEAR=16, GET_CHUNK_SIZE=17, PING=18, NOOP=20,
    ),
    # engine-driven era (protocols/base.py @ 006ebb57): PING carries [instance_id | None].
    "engine-driven": dict(
        LOOKUP=5, QUERY_PREFETCH_STATUS=6, QUERY_PREFETCH_LOOKUP_HITS=7, FREE_LOOKUP_LOCKS=8,
        END_SESSION=9, REGISTER=10, UNREGISTER=11, PREPARE_STORE=12, COMMIT_STORE=13,
        COMMIT_STORE_GROUP=14, PREPARE_RETRIEVE=15, COMMIT_RETRIEVE=16, CLEAR=17,
        GET_CHUNK_SIZE=18, PING=19, NOOP=21,
    ),
}

NO_REPLY = object()


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


class Client:
    """One DEALER, like LMCache's MessageQueueClient: uid counter, frames
    [uid, type, payload...], replies matched by uid."""

    def __init__(self, endpoint, profile, timeout=5.0):
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.num = PROFILES[profile]
        self.uid = 0
        self.timeout = timeout

    def call(self, name, *args, raw=None, timeout=None):
        """Send one request and wait for its reply. Returns the decoded
        result, NO_REPLY when the server answered without a result frame,
        and raises Failure on timeout."""
        self.uid += 1
        uid = msgpack.packb(self.uid)
        frames = [uid, msgpack.packb(self.num[name])]
        frames += raw if raw is not None else [msgpack.packb(a, use_bin_type=True) for a in args]
        self.sock.send_multipart(frames, copy=False)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise Failure(f"{name}: no answer within {timeout or self.timeout}s")
            reply = self.sock.recv_multipart(copy=True)
            if reply[0] != uid:
                continue  # a late answer to an earlier request
            check(reply[1] == frames[1], f"{name}: type frame not echoed")
            if len(reply) == 2:
                return NO_REPLY
            check(len(reply) == 3, f"{name}: {len(reply)} reply frames")
            return msgpack.unpackb(reply[2], raw=False)

    def close(self):
        self.sock.close(0)


def key(model, world, worker, tokens, start, end, request_id, salt=""):
    return {
        "model_name": model, "world_size": world, "worker_id": worker, "token_ids": tokens,
        "start": start, "end": end, "request_id": request_id, "cache_salt": salt,
    }


DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8,
          "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}
# torch 2.x adds float8 (no torch.equal kernel for it: compared as uint8).
FLOAT8 = {n: getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
DTYPES.update(FLOAT8)


def same(a, b):
    """Same dtype, shape and bytes."""
    if a.dtype != b.dtype or list(a.shape) != list(b.shape):
        return False
    if a.dtype in FLOAT8.values():
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a, b)


def chunk_shape(p, chunk):
    if p["mla"]:
        return [p["layers"], chunk, p["hidden"]]
    return [2, p["layers"], chunk, p["hidden"]]


def make_chunk(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
    return torch.randint(0, 100, shape, generator=g, dtype=torch.int64).to(dtype)


class Worker:
    """A registered non-GPU context: SHM when the server advertises a segment
    the worker can attach (unless force_pickle), pickle otherwise."""

    def __init__(self, endpoint, p, instance_id, worker_id, force_pickle=False):
        self.c = Client(endpoint, p.get("profile", "nongpu-v1"))
        self.p = p
        self.instance_id = instance_id
        self.worker_id = worker_id
        reply = self.c.call("REGISTER", {
            "instance_id": instance_id, "model_name": p["model"], "world_size": p["world"],
            "block_size": 16, "num_layers": p["layers"], "hidden_dim_size": p["hidden"],
            "dtype_str": p["dtype"], "use_mla": p["mla"],
        })
        check(isinstance(reply, dict), f"register reply {reply!r}")
        self.shm_name, self.pool_size = reply["shm_name"], reply["pool_size"]
        self.chunk = self.c.call("GET_CHUNK_SIZE")
        self.shape = chunk_shape(p, self.chunk)
        self.dtype = DTYPES[p["dtype"]]
        self.shm = None
        self.mode = "pickle"
        if self.shm_name and self.pool_size > 0 and not force_pickle:
            from multiprocessing import resource_tracker, shared_memory
            self.shm = shared_memory.SharedMemory(name=self.shm_name, create=False)
            # As LMCache's worker does: never let Python unlink kvdock's segment.
            resource_tracker.unregister(self.shm._name, "shared_memory")
            self.mode = "shm"

    def view_bytes(self):
        return torch.tensor([], dtype=self.dtype).element_size() * int(torch.Size(self.shape).numel())

    def view(self, slot):
        check(slot["dtype"] == self.p["dtype"], f"slot dtype {slot['dtype']}")
        itemsize = torch.tensor([], dtype=self.dtype).element_size()
        n = slot["length"] // itemsize
        check(n * itemsize == slot["length"], "slot length not a whole number of elements")
        return torch.frombuffer(self.shm.buf, dtype=self.dtype, count=n,
                                offset=slot["offset"]).view(slot["shape"])

    def key(self, tokens, start, end, request_id):
        return key(self.p["model"], self.p["world"], self.worker_id, tokens, start, end, request_id,
                   self.p.get("salt", ""))

    def store(self, tokens, chunks, request_id, start=0):
        """Stores chunks for tokens[start:start+len(chunks)*chunk]; returns the
        COMMIT_STORE answer (or None when nothing needed storing)."""
        end = start + len(chunks) * self.chunk
        k = self.key(tokens, start, end, request_id)
        prep = self.c.call("PREPARE_STORE", k, self.instance_id)
        check(isinstance(prep, dict) and "context" in prep, f"prepare_store reply {prep!r}")
        if self.mode == "shm":
            ctx = prep["context"]
            slots, idx = ctx["slots"], ctx.get("chunk_indices", list(range(len(ctx["slots"]))))
            if not slots:
                return None
            for s, i in zip(slots, idx):
                check(s["shape"] == self.shape, f"slot shape {s['shape']} != {self.shape}")
                self.view(s).copy_(chunks[i])
            return self.c.call("COMMIT_STORE", k, self.instance_id, b"")
        if not self.shm_name:
            check(prep["context"] == {}, f"pickle prepare_store context {prep['context']!r}")
        # A pickle worker ignores the PREPARE_STORE answer (LMCache's does).
        return self.c.call("COMMIT_STORE", k, self.instance_id, pickle.dumps(list(chunks)))

    def retrieve(self, tokens, n, request_id, start=0):
        """Retrieves n chunks; returns a list of tensors or None on a miss."""
        end = start + n * self.chunk
        k = self.key(tokens, start, end, request_id)
        r = self.c.call("PREPARE_RETRIEVE", k, self.instance_id)
        check(isinstance(r, dict), f"prepare_retrieve reply {r!r}")
        out = None
        if r["success"]:
            if self.mode == "shm":
                slots = r["context"].get("slots") if isinstance(r["context"], dict) else None
                if slots:
                    out = [self.view(s).clone() for s in slots]
            elif r["data"]:
                out = pickle.loads(r["data"])
        done = self.c.call("COMMIT_RETRIEVE", k, self.instance_id)
        check(done is True, f"commit_retrieve answered {done!r}")
        return out

    def close(self, unregister=True):
        if unregister:
            # UNREGISTER's result is None: the reply carries no result frame.
            check(self.c.call("UNREGISTER", self.instance_id) is NO_REPLY, "UNREGISTER reply")
        if self.shm is not None:
            self.shm.close()
        self.c.close()


def lookup(c, p, tokens, request_id, tp_size=1):
    """The scheduler side: LOOKUP then QUERY_PREFETCH_STATUS; returns hit chunks."""
    k = key(p["model"], p["world"], None, tokens, 0, len(tokens), request_id, p.get("salt", ""))
    check(c.call("LOOKUP", k, tp_size) is NO_REPLY, "LOOKUP must answer without a result")
    for _ in range(100):
        hits = c.call("QUERY_PREFETCH_STATUS", request_id)
        if hits is not NO_REPLY:
            return hits
        time.sleep(0.01)
    raise Failure("prefetch never finished")


def tokens_for(seed, n):
    return [(seed * 7919 + i * 31) % 50000 for i in range(n)]


def scenario_roundtrip(endpoint, p):
    """Store and retrieve through every worker of one world, SHM or pickle as
    the server advertises; checks bytes are identical."""
    world = p["world"]
    workers = [Worker(endpoint, p, instance_id=1000 + w, worker_id=w,
                      force_pickle=p.get("force_pickle", False)) for w in range(world)]
    sched = Client(endpoint, p.get("profile", "nongpu-v1"))
    nchunks = p.get("chunks", 3)
    tokens = tokens_for(p.get("seed", 1), nchunks * workers[0].chunk + 5)
    data = {w: [make_chunk(workers[0].shape, workers[0].dtype, 100 * w + i) for i in range(nchunks)]
            for w in range(world)}
    modes = [wk.mode for wk in workers]
    for w, wk in enumerate(workers):
        check(wk.store(tokens, data[w], "store-req") is True, f"worker {w} store not acknowledged")
    hits = lookup(sched, p, tokens, "ret-req", p.get("tp_size", 1))
    check(hits == nchunks, f"lookup hits {hits}, want {nchunks}")
    for w, wk in enumerate(workers):
        got = wk.retrieve(tokens, nchunks, "ret-req")
        check(got is not None, f"worker {w}: retrieve missed")
        check(len(got) == nchunks, f"worker {w}: {len(got)} chunks")
        for i in range(nchunks):
            check(got[i].dtype == data[w][i].dtype and list(got[i].shape) == list(data[w][i].shape),
                  f"worker {w} chunk {i}: {got[i].dtype} {list(got[i].shape)}")
            check(same(got[i], data[w][i]), f"worker {w} chunk {i}: bytes differ")
    # A second store of the same chunks finds them cached.
    again = workers[0].store(tokens, data[0], "store-again")
    check(again in (None, True), f"re-store answered {again!r}")
    sched.call("END_SESSION", "ret-req")
    for wk in workers:
        wk.close()
    sched.close()
    return {"modes": modes, "hits": hits, "shm_name": workers[0].shm_name, "pool_size": workers[0].pool_size}


def scenario_mixed(endpoint, p):
    """An SHM worker and a pickle worker (two instances of one model on an SHM
    server) read each other's chunks."""
    p = dict(p, world=1)
    pk = Worker(endpoint, p, instance_id=2001, worker_id=0, force_pickle=True)
    sh = Worker(endpoint, p, instance_id=2002, worker_id=0)
    check(sh.mode == "shm", "server did not advertise SHM")
    sched = Client(endpoint, p.get("profile", "nongpu-v1"))
    chunk = sh.chunk
    t1, t2 = tokens_for(11, 2 * chunk), tokens_for(12, 2 * chunk)
    d1 = [make_chunk(sh.shape, sh.dtype, 500 + i) for i in range(2)]
    d2 = [make_chunk(sh.shape, sh.dtype, 600 + i) for i in range(2)]
    check(pk.store(t1, d1, "m-s1") is True, "pickle worker store")
    check(sh.store(t2, d2, "m-s2") is True, "shm worker store")
    check(lookup(sched, p, t2, "m-r1") == 2, "lookup of the SHM worker's chunks")
    got = pk.retrieve(t2, 2, "m-r1")
    check(got is not None and all(same(a, b) for a, b in zip(got, d2)), "pickle worker reading SHM chunks")
    check(lookup(sched, p, t1, "m-r2") == 2, "lookup of the pickle worker's chunks")
    got = sh.retrieve(t1, 2, "m-r2")
    check(got is not None and all(same(a, b) for a, b in zip(got, d1)), "SHM worker reading pickled chunks")
    pk.close()
    sh.close()
    sched.close()
    return {"modes": [pk.mode, sh.mode]}


def scenario_warm(endpoint, p):
    """An SHM worker warms the cache; then a new pickle worker and a new SHM
    worker (neither has stored yet, so kvdock cannot tell them apart) look up
    and retrieve what it stored: each must receive the stored bytes, the
    pickle one from the reply's data, the SHM one from the slots."""
    p = dict(p, world=1)
    sh = Worker(endpoint, p, instance_id=2101, worker_id=0)
    check(sh.mode == "shm", "server did not advertise SHM")
    sched = Client(endpoint, p.get("profile", "nongpu-v1"))
    n = p.get("chunks", 2)
    t = tokens_for(21, n * sh.chunk)
    d = [make_chunk(sh.shape, sh.dtype, 700 + i) for i in range(n)]
    check(sh.store(t, d, "w-s") is True, "warming store")
    pk = Worker(endpoint, p, instance_id=2102, worker_id=0, force_pickle=True)
    fresh = Worker(endpoint, p, instance_id=2103, worker_id=0)
    got = {}
    for name, wk in (("pickle", pk), ("shm", fresh)):
        for r in range(p.get("rounds", 3)):
            rid = f"w-{name}-{r}"
            check(lookup(sched, p, t, rid) == n, f"lookup for the {name} worker")
            out = wk.retrieve(t, n, rid)
            check(out is not None and all(same(a, b) for a, b in zip(out, d)),
                  f"the {name} worker on a warm cache got {'nothing' if out is None else 'other bytes'}")
            got[name] = got.get(name, 0) + len(out)
    # Left registered, so the test reads their counters.
    for wk in (sh, pk, fresh):
        wk.close(unregister=False)
    sched.close()
    return {"received": got, "modes": [pk.mode, fresh.mode]}


class _Evil:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


class _Eval:
    def __init__(self, expr):
        self.expr = expr

    def __reduce__(self):
        import builtins
        return (builtins.eval, (self.expr,))


def scenario_malicious(endpoint, p):
    """Pickles that would run code are refused; nothing runs; the server keeps serving."""
    marker = p["marker"]
    p = dict(p, world=1)
    wk = Worker(endpoint, p, instance_id=3001, worker_id=0, force_pickle=True)
    tokens = tokens_for(21, wk.chunk)
    k = wk.key(tokens, 0, wk.chunk, "evil")
    wk.c.call("PREPARE_STORE", k, wk.instance_id)
    payloads = [
        pickle.dumps([_Evil(f"touch {marker}")]),
        pickle.dumps(_Evil(f"touch {marker}")),
        pickle.dumps([_Eval(f"open({marker!r}, 'w')")]),
        pickle.dumps([_Evil(f"touch {marker}")], protocol=2),
    ]
    answers = []
    for data in payloads:
        try:
            answers.append(wk.c.call("COMMIT_STORE", k, wk.instance_id, data, timeout=1.0))
        except Failure:
            answers.append("no answer")
        check(wk.c.call("NOOP") == "OK", "server stopped answering after a malicious pickle")
    check(not os.path.exists(marker), "a malicious pickle ran code")
    check(all(a is not True for a in answers), f"malicious pickle accepted: {answers}")
    check(lookup(Client(endpoint, p.get("profile", "nongpu-v1")), p, tokens, "evil-l") == 0,
          "malicious store left a readable chunk")
    wk.close()
    return {"answers": [str(a) for a in answers]}


class _Reduce:
    """Pickles as fn(*args): how a hostile peer writes any call it likes."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def torch2_payloads(marker):
    """Pickles in the forms torch 2.x adds, each running `touch marker` when
    torch 2.x's pickle.loads reads it: (name, bytes)."""
    from collections import OrderedDict
    cmd = f"touch {marker}"
    evil = _Evil(cmd)
    inner = io.BytesIO()
    # A legacy container (what _load_from_bytes reads) whose saved object is a call.
    torch.save(evil, inner, _use_new_zipfile_serialization=False)
    byte_storage = torch.ByteStorage(list(range(8)))
    return [
        # A tensor subclass with Python state: the rebuild calls its first argument.
        ("rebuild_from_type_v2", pickle.dumps([_Reduce(torch._tensor._rebuild_from_type_v2,
                                                        (os.system, torch.Tensor, (cmd,), {}))])),
        # The float8 form with a call where the dtype goes.
        ("rebuild_tensor_v3 with a call as dtype", pickle.dumps([_Reduce(torch._utils._rebuild_tensor_v3, (
            byte_storage, 0, (8,), (1,), False, OrderedDict(), evil))])),
        ("rebuild_parameter", pickle.dumps([_Reduce(torch._utils._rebuild_parameter, (evil, False, OrderedDict()))])),
        ("storage container with a call", pickle.dumps([_Reduce(torch.storage._load_from_bytes, (inner.getvalue(),))])),
        ("rebuild_tensor_v3 protocol 2", pickle.dumps([_Reduce(torch._utils._rebuild_tensor_v3, (
            byte_storage, 0, (8,), (1,), False, OrderedDict(), evil))], protocol=2)),
    ]


def scenario_malicious_torch2(endpoint, p):
    """torch 2.x-form pickles that run code under torch 2.x are refused by the
    server; each is first shown to be live here, with a marker of our own."""
    marker, live_dir = p["marker"], p["live_dir"]
    check(int(torch.__version__.split(".")[0]) >= 2, f"torch {torch.__version__}: want 2.x")
    live = []
    for i in range(len(torch2_payloads(marker))):
        probe = os.path.join(live_dir, f"live{i}")
        name, data = torch2_payloads(probe)[i]
        try:
            pickle.loads(data)
        except Exception:
            pass  # the command ran before whatever failed afterwards
        check(os.path.exists(probe), f"payload {name!r} did not run under torch {torch.__version__}: it proves nothing")
        live.append(name)
    p = dict(p, world=1)
    wk = Worker(endpoint, p, instance_id=3101, worker_id=0, force_pickle=True)
    tokens = tokens_for(22, wk.chunk)
    k = wk.key(tokens, 0, wk.chunk, "evil2")
    answers = []
    for name, data in torch2_payloads(marker):
        wk.c.call("PREPARE_STORE", k, wk.instance_id)
        try:
            answers.append(wk.c.call("COMMIT_STORE", k, wk.instance_id, data, timeout=1.0))
        except Failure:
            answers.append("no answer")
        check(wk.c.call("NOOP") == "OK", f"server stopped answering after {name!r}")
    check(not os.path.exists(marker), "a malicious pickle ran code in the server")
    check(all(a is not True for a in answers), f"malicious pickle accepted: {answers}")
    check(lookup(Client(endpoint, p.get("profile", "nongpu-v1")), p, tokens, "evil2-l") == 0,
          "malicious store left a readable chunk")
    # The server still stores and serves a genuine chunk after all that.
    good = [make_chunk(wk.shape, wk.dtype, 7)]
    check(wk.store(tokens, good, "good-store") is True, "genuine store after the payloads")
    check(lookup(Client(endpoint, p.get("profile", "nongpu-v1")), p, tokens, "good-ret") == 1, "lookup of the genuine chunk")
    got = wk.retrieve(tokens, 1, "good-ret")
    check(got is not None and same(got[0], good[0]), "genuine chunk read back")
    wk.close()
    return {"live": live, "answers": [str(a) for a in answers]}


def scenario_register(endpoint, p):
    """Registers one worker, stores one chunk and leaves it registered (the
    process exits without unregistering, as a worker that stays up would look
    to the server)."""
    p = dict(p, world=1)
    wk = Worker(endpoint, p, instance_id=p["instance_id"], worker_id=0,
                force_pickle=p.get("force_pickle", False))
    tokens = tokens_for(p["instance_id"], wk.chunk)
    check(wk.store(tokens, [make_chunk(wk.shape, wk.dtype, 1)], "reg-store") is True, "store")
    wk.close(unregister=False)
    return {"mode": wk.mode, "shm_name": wk.shm_name}


def wait_tiers_idle(url, limit=60.0):
    """Polls kvdock's /status until every tier's write queue is empty (the
    chunks queued so far are written or dropped)."""
    import urllib.request
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=5) as r:
            st = json.loads(r.read())
        if all(t["queue_depth"] == 0 for t in st.get("tiers", [])):
            return
        time.sleep(0.02)
    raise Failure(f"tier queues not empty within {limit}s")


def tier_prompt(wk, seed, prompt, nchunks):
    """The tokens and chunks of one prompt of a tier scenario: the same for
    every process given the same seed, so a second process can check them."""
    base = seed * 1000 + prompt
    tokens = tokens_for(base, nchunks * wk.chunk)
    return tokens, [make_chunk(wk.shape, wk.dtype, base * 100 + i) for i in range(nchunks)]


def scenario_tier_store(endpoint, p):
    """Stores p["prompts"] prompts of p["chunks"] chunks each (seeded by
    p["seed"]); with p["status_url"] it waits after each prompt until the
    tiers have written what was queued (so L1 may evict it safely)."""
    p = dict(p, world=1)
    wk = Worker(endpoint, p, instance_id=p.get("instance_id", 3001), worker_id=0,
                force_pickle=p.get("force_pickle", False))
    stored = 0
    for q in range(p["prompts"]):
        tokens, data = tier_prompt(wk, p["seed"], q, p["chunks"])
        r = wk.store(tokens, data, f"ts-{p['seed']}-{q}")
        check(r in (True, None), f"prompt {q}: store answered {r!r}")
        stored += len(data)
        if p.get("status_url"):
            wait_tiers_idle(p["status_url"])
    wk.close()
    return {"mode": wk.mode, "stored": stored, "chunk_bytes": wk.view_bytes()}


def scenario_tier_check(endpoint, p):
    """Looks up and retrieves every prompt scenario_tier_store stored and
    compares the bytes. Reports hits per prompt, chunks missed and chunks
    with wrong bytes; with p["strict"] every chunk must be a hit."""
    p = dict(p, world=1)
    wk = Worker(endpoint, p, instance_id=p.get("instance_id", 3002), worker_id=0,
                force_pickle=p.get("force_pickle", False))
    sched = Client(endpoint, p.get("profile", "nongpu-v1"))
    hits, missed, wrong, good = [], 0, 0, 0
    for q in range(p["prompts"]):
        tokens, data = tier_prompt(wk, p["seed"], q, p["chunks"])
        rid = f"tc-{p['seed']}-{q}-{wk.instance_id}"
        h = lookup_wait(sched, p, tokens, rid, p.get("lookup_limit", 15.0))
        hits.append(h)
        missed += len(data) - h
        if h > 0:
            got = wk.retrieve(tokens, h, rid)
            if got is None:
                missed += h
            else:
                check(len(got) == h, f"prompt {q}: {len(got)} chunks for {h} hits")
                for i in range(h):
                    if same(got[i], data[i]):
                        good += 1
                    else:
                        wrong += 1
        sched.call("END_SESSION", rid)
    wk.close()
    sched.close()
    if p.get("strict"):
        check(missed == 0 and wrong == 0, f"hits {hits}: {missed} missed, {wrong} wrong")
    return {"mode": wk.mode, "hits": hits, "missed": missed, "wrong": wrong, "good": good}


def lookup_wait(c, p, tokens, request_id, limit):
    """lookup with a longer wait for the prefetch (tier loads)."""
    k = key(p["model"], p["world"], None, tokens, 0, len(tokens), request_id, p.get("salt", ""))
    check(c.call("LOOKUP", k, 1) is NO_REPLY, "LOOKUP must answer without a result")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        hits = c.call("QUERY_PREFETCH_STATUS", request_id)
        if hits is not NO_REPLY:
            return hits
        time.sleep(0.01)
    raise Failure(f"prefetch never finished within {limit}s")


SCENARIOS = {"tier_store": scenario_tier_store, "tier_check": scenario_tier_check, "register": scenario_register, "roundtrip": scenario_roundtrip, "mixed": scenario_mixed, "warm": scenario_warm,
             "malicious": scenario_malicious, "malicious_torch2": scenario_malicious_torch2}


# One line per scenario for --help (their docstrings say more).
SCENARIO_HELP = {
    "roundtrip": "every worker of one world stores --chunks chunks, looks them up and reads them back",
    "mixed": "an SHM worker and a pickle worker of one model read each other's chunks",
    "warm": "an SHM worker stores; a new pickle and a new SHM worker read it back (a warm cache)",
    "register": "registers --instance-id, stores one chunk and exits still registered",
    "tier_store": "stores --prompts prompts of --chunks chunks (seeded by --seed)",
    "tier_check": "looks up and reads back what tier_store stored; counts hits, misses, wrong bytes",
    "malicious": "test only (needs marker): code-running pickles are refused",
    "malicious_torch2": "test only (needs marker, live_dir): torch 2.x-form pickles are refused",
}

# Flags for the parameters people choose from a shell; each overrides the
# same key of JSON_PARAMS (the form the Go tests pass).
FLAGS = [
    ("--model", str, "model", "model name registered and used in keys (default interop-model)"),
    ("--world", int, "world", "world size: the number of workers of the model (default 1)"),
    ("--layers", int, "layers", "layers in the KV layout (default 2)"),
    ("--hidden", int, "hidden", "hidden size per layer (default 16)"),
    ("--dtype", str, "dtype", "tensor dtype: " + ", ".join(sorted(DTYPES)) + " (default float32)"),
    ("--chunks", int, "chunks", "chunks per prompt (roundtrip: default 3; tier_*: required)"),
    ("--profile", str, "profile", "wire profile: " + ", ".join(PROFILES) + " (default nongpu-v1)"),
    ("--instance-id", int, "instance_id", "instance id to register (register: required)"),
    ("--seed", int, "seed", "seed of the tokens and tensors (default 1; tier_*: required)"),
    ("--prompts", int, "prompts", "prompts to store or check (tier_*: required)"),
]


def parse_args(argv):
    scenarios = "\n".join(f"  {n:<17} {SCENARIO_HELP[n]}" for n in SCENARIOS)
    ap = argparse.ArgumentParser(
        prog="lmcache_worker.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="An emulated LMCache MP non-GPU worker: ZMQ DEALER and msgpack frames as "
                    "LMCache's worker sends them, chunks as real torch tensors through kvdock's "
                    "SHM segment or pickled. It runs one scenario, prints one JSON line with what "
                    "it saw and exits 0 when every check held, 1 otherwise (reason on stderr).",
        epilog="scenarios:\n" + scenarios + "\n\nexample:\n"
               "  lmcache_worker.py tcp://127.0.0.1:5555 roundtrip --dtype bfloat16 --world 2 --pickle")
    ap.add_argument("endpoint", help="kvdock's ZMQ endpoint, e.g. tcp://127.0.0.1:5555")
    ap.add_argument("scenario", choices=list(SCENARIOS), metavar="SCENARIO", help="one of the scenarios below")
    ap.add_argument("params", nargs="?", default="{}", metavar="JSON_PARAMS",
                    help="a JSON object of parameters (the flags below override its keys)")
    for flag, typ, dest, text in FLAGS:
        ap.add_argument(flag, type=typ, dest=dest, default=None, help=text)
    ap.add_argument("--mla", action="store_true", default=None, help="MLA layout [layers, chunk, hidden] "
                    "instead of [2, layers, chunk, hidden]")
    ap.add_argument("--pickle", action="store_true", dest="force_pickle", default=None,
                    help="send and receive pickled tensors even when the server advertises SHM")
    a = ap.parse_args(argv)
    try:
        params = json.loads(a.params)
    except ValueError as e:
        ap.error(f"JSON_PARAMS: {e}")
    if not isinstance(params, dict):
        ap.error("JSON_PARAMS must be a JSON object")
    for dest in [f[2] for f in FLAGS] + ["mla", "force_pickle"]:
        if getattr(a, dest) is not None:
            params[dest] = getattr(a, dest)
    if params.get("dtype", "float32") not in DTYPES:
        ap.error(f"--dtype {params['dtype']}: want one of {', '.join(sorted(DTYPES))}")
    if params.get("profile", "nongpu-v1") not in PROFILES:
        ap.error(f"--profile {params['profile']}: want one of {', '.join(PROFILES)}")
    return a.endpoint, a.scenario, params


def main():
    endpoint, name, params = parse_args(sys.argv[1:])
    p = dict(model="interop-model", world=1, layers=2, hidden=16, dtype="float32", mla=False)
    p.update(params)
    try:
        out = SCENARIOS[name](endpoint, p)
    except Failure as e:
        print(f"FAIL {name}: {e}", file=sys.stderr)
        sys.exit(1)
    out["torch"] = torch.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
