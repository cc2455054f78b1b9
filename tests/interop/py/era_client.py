"""A client of one LMCache era that decodes replies the way that era's
upstream MessageQueueClient does, for kvdock's --protocol auto tests.

Request numbers and payloads are those of the profile tables
(assets/protocols/*.yaml, docs/PROTOCOLS.md). Reply decoding follows the
upstream clients (spec sections 1.2, 1.6 and 2.1): a reply without a result
frame resolves the request to None; an int or bool result is decoded
untyped and passed to int() or bool(); any other result is decoded as its
declared type (None, str, list[str], a struct) and a mismatch raises in the
client's one polling loop, which then stops: every request of the client
still pending, and every later one, goes unanswered. The newest era
(rpc-messages) sends one request struct and decodes one reply struct.

Scenario: a seeding worker of the era stores one chunk; then a fresh
client of the era sends FIRST (NOOP, CLEAR, PING or GET_CHUNK_SIZE) as its
very first message and, without waiting for that answer past a second,
goes on as a worker on the same socket: GET_EXPERIMENTAL where the era has
it, register, store, look up, retrieve identical bytes, GET_CHUNK_SIZE.
Finally the seeder looks its chunk up again (gone only if a CLEAR ran).
Prints one JSON line; exits 0 unless the run itself broke.

Usage: era_client.py ENDPOINT JSON_PARAMS
"""

import json
import sys
import time

import msgpack
import zmq

import lmcache_worker as lw
import proto_worker as pw

FRAMES_NUMBERS = dict(lw.PROFILES)
FRAMES_NUMBERS["engine-driven-v2"] = dict(lw.PROFILES["engine-driven-v2"], GET_EXPERIMENTAL=32)
# The earlier enum of the same era: blend (25-36) and P2P (37-39) first.
FRAMES_NUMBERS["engine-driven-v2-early"] = dict(lw.PROFILES["engine-driven-v2"], GET_EXPERIMENTAL=40)
FRAMES_NUMBERS["rpc-messages"] = dict(lw.PROFILES["rpc-messages"], GET_EXPERIMENTAL=32)

RESULT = {
    "REGISTER": "struct", "UNREGISTER": None, "PREPARE_STORE": "struct", "COMMIT_STORE": bool,
    "PREPARE_RETRIEVE": "struct", "COMMIT_RETRIEVE": bool, "LOOKUP": None,
    "QUERY_PREFETCH_STATUS": "int?", "WAIT_PREFETCH_STATUS": "int?", "END_SESSION": None,
    "CLEAR": None, "GET_CHUNK_SIZE": int, "PING": bool, "NOOP": str, "GET_EXPERIMENTAL": "list[str]",
}
FIELDS = dict(pw.FIELDS, GET_EXPERIMENTAL=[])
REPLY = dict(pw.REPLY, GET_EXPERIMENTAL="names")

PENDING = object()


class DecodeDeath(Exception):
    pass


def decode_frames(name, reply):
    rt = RESULT[name]
    if len(reply) == 2:
        return None
    if len(reply) != 3:
        raise DecodeDeath(f"{name}: {len(reply)} reply frames")
    raw = msgpack.unpackb(reply[2], raw=False)
    if rt is None:
        if raw is not None:
            raise DecodeDeath(f"{name}: expected null, got {raw!r}")
        return None
    if rt in (int, bool):
        try:
            return rt(raw)
        except (TypeError, ValueError) as e:
            raise DecodeDeath(f"{name}: {rt.__name__}({raw!r}): {e}")
    if rt == "int?":
        if raw is None:
            return None
        try:
            return int(raw)
        except (TypeError, ValueError) as e:
            raise DecodeDeath(f"{name}: int({raw!r}): {e}")
    if rt == str:
        if not isinstance(raw, str):
            raise DecodeDeath(f"{name}: expected str, got {raw!r}")
        return raw
    if rt == "list[str]":
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise DecodeDeath(f"{name}: expected list[str], got {raw!r}")
        return raw
    if not isinstance(raw, dict):
        raise DecodeDeath(f"{name}: expected a struct, got {raw!r}")
    return raw


def decode_message(name, reply):
    if len(reply) != 3:
        raise DecodeDeath(f"{name}: missing response message")
    raw = msgpack.unpackb(reply[2], raw=False)
    if not isinstance(raw, dict):
        raise DecodeDeath(f"{name}: reply {raw!r} is not a struct")
    if name in REPLY:
        if set(raw) != {REPLY[name]}:
            raise DecodeDeath(f"{name}: reply fields {sorted(raw)}")
        return raw[REPLY[name]]
    if name in pw.STRUCT_REPLY:
        return raw
    if raw != {}:
        raise DecodeDeath(f"{name}: reply {raw!r}, want the empty struct")
    return None


class EraClient:
    """One DEALER and one receive loop (pump) shared by every request, as
    upstream's client has: a reply it cannot decode stops the loop."""

    def __init__(self, endpoint, era):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.era, self.num = era, FRAMES_NUMBERS[era]
        self.uid = 0
        self.futures = {}
        self.death = None

    def submit(self, name, *args):
        self.uid += 1
        uid = msgpack.packb(self.uid)
        frames = [uid, msgpack.packb(self.num[name])]
        if self.era == "rpc-messages":
            fields = FIELDS[name]
            msg = args[0] if fields is None else dict(zip(fields, args))
            frames.append(msgpack.packb(msg, use_bin_type=True))
        else:
            frames += [msgpack.packb(a, use_bin_type=True) for a in args]
        self.futures[self.uid] = [name, PENDING]
        self.sock.send_multipart(frames)
        return self.uid

    def pump(self, timeout):
        if self.death is not None:
            time.sleep(timeout)
            return
        if not self.sock.poll(int(timeout * 1000)):
            return
        while self.sock.poll(0):
            reply = self.sock.recv_multipart()
            uid = msgpack.unpackb(reply[0])
            f = self.futures.get(uid)
            if f is None:
                continue
            try:
                if self.era == "rpc-messages":
                    f[1] = decode_message(f[0], reply)
                else:
                    f[1] = decode_frames(f[0], reply)
            except DecodeDeath as e:
                self.death = str(e)
                return

    def result(self, uid, timeout=5.0):
        deadline = time.monotonic() + timeout
        while self.futures[uid][1] is PENDING:
            left = deadline - time.monotonic()
            if left <= 0:
                raise lw.Failure(f"{self.futures[uid][0]}: no answer within {timeout}s"
                                 + (f" (receive loop stopped: {self.death})" if self.death else ""))
            self.pump(min(left, 0.05))
        return self.futures[uid][1]

    def call(self, name, *args, timeout=5.0):
        return self.result(self.submit(name, *args), timeout)


class Worker:
    def __init__(self, c, p, instance_id):
        self.c, self.p, self.instance_id = c, p, instance_id
        reg = {"instance_id": instance_id, "model_name": p["model"], "world_size": 1, "block_size": 16,
               "num_layers": p["layers"], "hidden_dim_size": p["hidden"], "dtype_str": p["dtype"],
               "use_mla": False}
        if c.era == "rpc-messages":
            reg["num_physical_slots"] = None
        reply = c.call("REGISTER", reg)
        lw.check(isinstance(reply, dict) and reply.get("pool_size", 0) > 0, f"register reply {reply!r}")
        from multiprocessing import resource_tracker, shared_memory
        self.shm = shared_memory.SharedMemory(name=reply["shm_name"], create=False)
        resource_tracker.unregister(self.shm._name, "shared_memory")
        self.shape = lw.chunk_shape(dict(p, mla=False), p["chunk"])
        self.dtype = lw.DTYPES[p["dtype"]]

    def view(self, slot):
        import torch
        n = slot["length"] // torch.tensor([], dtype=self.dtype).element_size()
        return torch.frombuffer(self.shm.buf, dtype=self.dtype, count=n, offset=slot["offset"]).view(slot["shape"])

    def key(self, tokens, rid, worker=0):
        return lw.key(self.p["model"], 1, worker, tokens, 0, len(tokens), rid)

    def store(self, tokens, chunk, rid):
        k = self.key(tokens, rid)
        prep = self.c.call("PREPARE_STORE", k, self.instance_id)
        slots = prep["context"]["slots"]
        lw.check(len(slots) == 1, f"prepare_store slots {slots!r}")
        self.view(slots[0]).copy_(chunk)
        lw.check(self.c.call("COMMIT_STORE", k, self.instance_id, b"") is True, "COMMIT_STORE")

    def retrieve(self, tokens, rid):
        k = self.key(tokens, rid)
        r = self.c.call("PREPARE_RETRIEVE", k, self.instance_id)
        out = None
        if r["success"] and r["context"].get("slots"):
            out = self.view(r["context"]["slots"][0]).clone()
        lw.check(self.c.call("COMMIT_RETRIEVE", k, self.instance_id) is True, "COMMIT_RETRIEVE")
        return out


def lookup(c, p, tokens, rid):
    k = lw.key(p["model"], 1, None, tokens, 0, len(tokens), rid)
    lw.check(c.call("LOOKUP", k, 1) is None, "LOOKUP answered a result")
    if "WAIT_PREFETCH_STATUS" in c.num:
        hits = c.call("WAIT_PREFETCH_STATUS", rid, 5.0)
    else:
        for _ in range(200):
            hits = c.call("QUERY_PREFETCH_STATUS", rid)
            if hits is not None:
                break
            time.sleep(0.01)
    c.call("END_SESSION", rid)
    return hits


FIRST_ARGS = {
    # CLEAR: [] up to engine-driven, [force] in the frozen frames era,
    # {force} in the newest.
    "CLEAR": lambda era: [False] if era in ("engine-driven-v2", "engine-driven-v2-early", "rpc-messages") else [],
    # PING: [] in the nongpu eras, [instance_id | None] after.
    "PING": lambda era: [] if era.startswith("nongpu") else [None],
    "NOOP": lambda era: [],
    "GET_CHUNK_SIZE": lambda era: [],
}


def run_case(endpoint, p):
    era, first = p["era"], p.get("first")
    out = {"era": era, "first": first, "steps": []}
    c = None
    try:
        tokens1 = lw.tokens_for(p["seed"], p["chunk"])
        tokens2 = lw.tokens_for(p["seed"] + 1, p["chunk"])
        seed_c = EraClient(endpoint, era)
        if "GET_EXPERIMENTAL" in seed_c.num and era != "rpc-messages":
            seed_c.call("GET_EXPERIMENTAL")
        seed = Worker(seed_c, p, p["instance_id"])
        c1 = lw.make_chunk(seed.shape, seed.dtype, p["seed"])
        seed.store(tokens1, c1, "seed")
        sched = EraClient(endpoint, era)
        if "GET_EXPERIMENTAL" in sched.num and era != "rpc-messages":
            sched.call("GET_EXPERIMENTAL")
        lw.check(lookup(sched, p, tokens1, "seed-before") == 1, "seeded chunk not found")

        c = EraClient(endpoint, era)
        if first:
            uid = c.submit(first, *FIRST_ARGS[first](era))
            try:
                c.result(uid, timeout=1.0)
            except lw.Failure:
                pass
        out["steps"].append("first")
        if "GET_EXPERIMENTAL" in c.num:
            t0 = time.monotonic()
            names = c.call("GET_EXPERIMENTAL")
            out["get_experimental"] = [names, round(time.monotonic() - t0, 3)]
        w = Worker(c, p, p["instance_id"] + 1)
        out["steps"].append("register")
        c2 = lw.make_chunk(w.shape, w.dtype, p["seed"] + 1)
        w.store(tokens2, c2, "w")
        out["steps"].append("store")
        lw.check(lookup(sched, p, tokens2, "w-look") == 1, "stored chunk not found")
        got = w.retrieve(tokens2, "w-look")
        lw.check(got is not None and lw.same(got, c2), "retrieved bytes differ")
        out["steps"].append("retrieve")
        out["chunk_size"] = c.call("GET_CHUNK_SIZE")
        out["steps"].append("chunk_size")
        out["seed_hits"] = lookup(sched, p, tokens1, "seed-after")
        seed.shm.close()
        w.shm.close()
    except lw.Failure as e:
        out["error"] = str(e)
    if c is not None:
        if first:
            c.pump(0.2)
            v = c.futures[1][1]
            out["first_answer"] = "no answer" if v is PENDING else v
        out["death"] = c.death
        c.sock.close(0)
    return out


def main():
    endpoint, p = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps([run_case(endpoint, dict(p, **case)) for case in p["cases"]]))


if __name__ == "__main__":
    main()
