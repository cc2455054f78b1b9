"""Emulated LMCache workers that live across a kvdock restart, for kvdock's
restart interop tests.

The workers (lmcache_worker.py's Worker: real DEALERs, msgpack, SHM views or
pickled tensors) register once at the start and never again: after kvdock
restarts, the same DEALERs, instance ids and SHM mappings carry on, as a
running LMCache worker's do. A scheduler-side DEALER does the lookups. The
process prints one JSON line when registered, then obeys stdin, one JSON
line answered per command:

  store TAG  every worker stores params["prompts"] prompts of
             params["chunks"] chunks under TAG; reports the commits and
             each failure
  check      every prompt committed so far: LOOKUP hits every chunk and a
             retrieve gives identical bytes; reports counts and failures
  loop       stores a new prompt (the first params["store_limit"] times)
             and retrieves a committed one in turn,
             through every worker, until a "stop" line; then reports the
             requests sent, those never answered (timeouts), those answered
             with a failure, lookups that missed, wrong bytes, the slowest
             answer, and the first failures with their time
  quit       exits 0

Usage: restart_worker.py ENDPOINT JSON_PARAMS
"""

import json
import random
import select
import sys
import time
import zlib

import torch

from lmcache_worker import NO_REPLY, Client, Failure, Worker, key, make_chunk, same

FAILURES_KEPT = 40


def say(obj):
    print(json.dumps(obj), flush=True)


class Counted:
    """Wraps a Client: counts every request, the unanswered ones, and the
    slowest answer (a request sent during the gap waits in the DEALER)."""

    def __init__(self, c, stats):
        self.c, self.stats = c, stats
        self.num = c.num

    def call(self, name, *args, raw=None, timeout=None):
        self.stats["requests"] += 1
        t0 = time.monotonic()
        try:
            return self.c.call(name, *args, raw=raw, timeout=timeout)
        except Failure as e:
            # The poll's millisecond rounding can end the wait a hair before
            # the deadline: "no answer" is what tells a timeout.
            if "no answer" in str(e) or time.monotonic() - t0 >= (timeout or self.c.timeout):
                self.stats["timeouts"] += 1
            raise
        finally:
            self.stats["slowest_s"] = max(self.stats["slowest_s"], time.monotonic() - t0)

    def close(self):
        self.c.close()


def new_stats():
    return dict(requests=0, timeouts=0, refused=0, missed=0, wrong=0, stores=0, retrieves=0,
                slowest_s=0.0, failures=[])


class Session:
    def __init__(self, endpoint, p):
        self.p = p
        self.stats = new_stats()
        self.workers = []
        for spec in p["workers"]:
            wk = Worker(endpoint, p, instance_id=spec["instance_id"], worker_id=0,
                        force_pickle=spec.get("pickle", False))
            wk.c.timeout = p["timeout"]
            wk.c = Counted(wk.c, self.stats)
            self.workers.append(wk)
        self.sched = Counted(Client(endpoint, p["profile"], timeout=p["timeout"]), self.stats)
        self.committed = []  # (worker index, tag, prompt index)
        self.loops = 0
        self.t0 = time.monotonic()

    def ping(self, wk):
        if self.p["profile"] == "engine-driven":
            return wk.c.call("PING", wk.instance_id)
        return wk.c.call("PING")

    def prompt(self, w, tag, i):
        """The tokens and chunks of one prompt: the same whenever asked."""
        wk = self.workers[w]
        name = f"{wk.instance_id}/{tag}/{i}"
        g = random.Random(name)
        tokens = [g.randrange(50000) for _ in range(self.p["chunks"] * wk.chunk)]
        seed = zlib.crc32(name.encode())
        return tokens, [make_chunk(wk.shape, wk.dtype, seed + c) for c in range(self.p["chunks"])]

    def fail(self, what, why):
        self.stats["failures"].append({"t": round(time.monotonic() - self.t0, 3), "op": what, "why": why})
        del self.stats["failures"][FAILURES_KEPT:]

    def store(self, w, tag, i):
        """One prompt through PREPARE_STORE and COMMIT_STORE; True when it
        committed."""
        tokens, chunks = self.prompt(w, tag, i)
        self.stats["stores"] += 1
        try:
            r = self.workers[w].store(tokens, chunks, f"st-{tag}-{i}")
        except Failure as e:
            self.fail(f"store {w}/{tag}/{i}", str(e))
            if "no answer" not in str(e):
                self.stats["refused"] += 1
            return False
        if r is not True:
            self.stats["refused"] += 1
            self.fail(f"store {w}/{tag}/{i}", f"the store answered {r!r} (None: no slots or no commit)")
            return False
        self.committed.append((w, tag, i))
        return True

    def lookup(self, tokens, rid):
        """LOOKUP then QUERY_PREFETCH_STATUS polls (5 s): the hit chunks."""
        k = key(self.p["model"], self.p["world"], None, tokens, 0, len(tokens), rid)
        r = self.sched.call("LOOKUP", k, 1)
        if r is not NO_REPLY:
            raise Failure(f"LOOKUP answered {r!r}")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            hits = self.sched.call("QUERY_PREFETCH_STATUS", rid)
            if hits is not NO_REPLY:
                return hits
            time.sleep(0.005)
        raise Failure("prefetch never finished within 5 s")

    def retrieve(self, w, tag, i, rid):
        """Looks one committed prompt up and reads it back; True when every
        chunk hit and came back identical."""
        tokens, chunks = self.prompt(w, tag, i)
        self.stats["retrieves"] += 1
        what = f"retrieve {w}/{tag}/{i}"
        try:
            hits = self.lookup(tokens, rid)
            if hits != len(chunks):
                self.stats["missed"] += 1
                self.fail(what, f"lookup hit {hits} of {len(chunks)} chunks")
                return False
            got = self.workers[w].retrieve(tokens, len(chunks), rid)
            self.sched.call("END_SESSION", rid)
        except Failure as e:
            self.fail(what, str(e))
            if "no answer" not in str(e):
                self.stats["refused"] += 1
            return False
        if got is None:
            self.stats["missed"] += 1
            self.fail(what, "PREPARE_RETRIEVE missed after a full lookup hit")
            return False
        if len(got) != len(chunks) or not all(same(a, b) for a, b in zip(got, chunks)):
            self.stats["wrong"] += 1
            self.fail(what, "bytes differ from the stored ones")
            return False
        return True

    def reset(self):
        self.stats.update(new_stats())
        self.t0 = time.monotonic()

    def cmd_store(self, tag):
        self.reset()
        n = sum(self.store(w, tag, i) for i in range(self.p["prompts"]) for w in range(len(self.workers)))
        return dict(self.stats, committed=n, pings=[self.ping(wk) for wk in self.workers])

    def cmd_check(self):
        self.reset()
        good = sum(self.retrieve(w, tag, i, f"chk-{n}-{time.monotonic_ns()}")
                   for n, (w, tag, i) in enumerate(list(self.committed)))
        return dict(self.stats, prompts=len(self.committed), identical=good,
                    chunks=len(self.committed) * self.p["chunks"])

    def cmd_loop(self):
        """Stores and retrieves until "stop" arrives on stdin."""
        self.reset()
        self.loops += 1
        tag = f"loop{self.loops}"  # each loop stores prompts of its own
        g = random.Random(self.loops)
        before = len(self.committed)
        n = 0
        say({"looping": True})
        while not select.select([sys.stdin], [], [], 0)[0]:
            w = n % len(self.workers)
            if n < self.p["store_limit"]:
                self.store(w, tag, n)
            pw, ptag, pi = self.committed[g.randrange(len(self.committed))]
            self.retrieve(pw, ptag, pi, f"{self.p['rid_prefix']}loop-{self.loops}-{n}")
            if n % 8 == 0:
                try:
                    if self.ping(self.workers[w]) is not True:
                        self.stats["refused"] += 1
                        self.fail(f"ping {w}", "PING not True")
                except Failure as e:
                    self.fail(f"ping {w}", str(e))
            n += 1
        line = sys.stdin.readline().strip()
        if line != "stop":
            raise Failure(f"loop ended by {line!r}, want stop")
        return dict(self.stats, iterations=n, committed=len(self.committed) - before,
                    seconds=round(time.monotonic() - self.t0, 3))


def main():
    endpoint, p = sys.argv[1], json.loads(sys.argv[2])
    p = dict(dict(model="restart-model", world=1, layers=2, hidden=16, dtype="float32", mla=False,
                  profile="nongpu-v1", prompts=6, chunks=2, timeout=10.0, rid_prefix="",
                  store_limit=1 << 62), **p)
    try:
        s = Session(endpoint, p)
        say({"ready": True, "modes": [wk.mode for wk in s.workers], "shm_name": s.workers[0].shm_name,
             "chunk": s.workers[0].chunk, "torch": torch.__version__})
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "store":
                say(s.cmd_store(cmd[1]))
            elif cmd[0] == "check":
                say(s.cmd_check())
            elif cmd[0] == "loop":
                say(s.cmd_loop())
            elif cmd[0] == "quit":
                return
            else:
                raise Failure(f"unknown command {line!r}")
    except Failure as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
