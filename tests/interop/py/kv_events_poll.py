"""LMCache's KV event poll channel as its vLLM connector reads it, for
kvdock's interop tests.

Written from LMCache's description (docs/design/v1/multiprocess/modules/
kv_events.md @ 4c0a68c1; protocols/kv_events.py, modules/kv_events.py and
custom_types.py @ 593e6c13): the worker asks GET_EXPERIMENTAL and polls only
a server that names "kv_events"; POLL_KV_EVENTS [model_name, cursor,
max_events] (34 in the engine-driven-v2 table) answers
{enabled, incarnation, next_cursor, lost, events}, each record
{seq, kind, medium, model_name, block_hashes, parent_block_hash, token_ids,
block_size}. The poller keeps the announced set per medium: a stored record
is announced once, a removal only for announced chunks; on lost (ignored at
first contact) or a new incarnation it withdraws everything and starts over
from next_cursor.

Phases (JSON_PARAMS "phase"):
  store  register, check GET_EXPERIMENTAL, store the prompts, polling a page
         after each store (and checking the cursor rules on the way), then
         write the poller's state to "state".
  poll   read the state, poll until caught up, with hostile polls first
         (wrong types, a negative cursor, a cursor in the future, a huge
         max_events): the wrong ones go unanswered, the others get
         LMCache's answer, and none changes what the next poll sees.
Prints one JSON line: the index {hash hex: [tokens, parent hex | null]}
and what the poller saw; exits 0 unless a rule broke.

Usage: kv_events_poll.py ENDPOINT JSON_PARAMS
"""

import json
import sys

import msgpack

import lmcache_worker as lw
import proto_worker as pw

POLL = 34  # RequestType.POLL_KV_EVENTS, protocols/base.py @ 593e6c13
PAGE = 1024  # the connector's page (_KV_EVENT_POLL_PAGE)
RECORD_FIELDS = ["seq", "kind", "medium", "model_name", "block_hashes", "parent_block_hash",
                 "token_ids", "block_size"]
RESULT_FIELDS = ["enabled", "incarnation", "next_cursor", "lost", "events"]


class Poller:
    def __init__(self, c, model, chunk, state=None):
        self.c, self.model, self.chunk = c, model, chunk
        st = state or {}
        self.cursor = st.get("cursor", 0)
        self.incarnation = st.get("incarnation")
        self.index = {h: tuple(v) for h, v in st.get("index", {}).items()}
        self.last_seq = st.get("last_seq", 0)
        self.resyncs = st.get("resyncs", {"server_restart": 0, "events_lost": 0})
        self.records = st.get("records", 0)
        self.lost_seen = st.get("lost_seen", 0)
        # After a resync, removals of chunks announced before it arrive
        # for chunks the index no longer holds: skipped, as the connector
        # does (it reports removals of announced chunks only).
        self.resynced = st.get("resynced", False)
        self.skipped = st.get("skipped", 0)

    def raw(self, *args, timeout=5.0):
        """One POLL_KV_EVENTS with args packed as given; lw.NO_REPLY when
        the server answered nothing within timeout."""
        self.c.uid += 1
        uid = msgpack.packb(self.c.uid)
        frames = [uid, msgpack.packb(POLL)] + [msgpack.packb(a, use_bin_type=True) for a in args]
        self.c.sock.send_multipart(frames)
        while True:
            if not self.c.sock.poll(int(timeout * 1000)):
                return lw.NO_REPLY
            reply = self.c.sock.recv_multipart()
            if reply[0] == uid:
                break
        lw.check(len(reply) == 3, f"poll: {len(reply)} reply frames")
        res = msgpack.unpackb(reply[2], raw=False)
        lw.check(isinstance(res, dict) and list(res) == RESULT_FIELDS, f"poll result fields {res!r:.200}")
        for r in res["events"]:
            lw.check(list(r) == RECORD_FIELDS, f"record fields {list(r)}")
        return res

    def poll(self, max_events=PAGE):
        res = self.raw(self.model, self.cursor, max_events)
        lw.check(res is not lw.NO_REPLY, "poll unanswered")
        lw.check(res["enabled"] is True, "channel disabled")
        lw.check(len(res["events"]) <= max_events, "more records than max_events")
        first_contact = self.incarnation is None
        if not first_contact and res["incarnation"] != self.incarnation:
            self.withdraw_all("server_restart")
            self.last_seq = 0
        elif res["lost"]:
            self.lost_seen += 1
            if not first_contact:
                self.withdraw_all("events_lost")
        else:
            lw.check(res["next_cursor"] >= self.cursor, "cursor went back")
        self.incarnation = res["incarnation"]
        for r in res["events"]:
            self.apply(r, res["lost"])
        self.cursor = res["next_cursor"]
        return res

    def withdraw_all(self, reason):
        self.resyncs[reason] += 1
        self.index = {}
        self.resynced = True

    def apply(self, r, lost):
        lw.check(r["seq"] > self.last_seq, f"seq {r['seq']} after {self.last_seq}")
        self.last_seq = r["seq"]
        self.records += 1
        lw.check(r["model_name"] == self.model, f"record of model {r['model_name']!r}")
        lw.check(r["medium"] == "CPU", f"medium {r['medium']!r}")
        lw.check(r["block_size"] == self.chunk, f"block_size {r['block_size']}")
        hashes = r["block_hashes"]
        lw.check(all(isinstance(h, bytes) and len(h) == 32 for h in hashes), "hashes are not 32 bytes")
        if r["kind"] == "stored":
            lw.check(len(hashes) == 1, f"stored record with {len(hashes)} hashes")
            lw.check(len(r["token_ids"]) == self.chunk, f"{len(r['token_ids'])} tokens")
            parent = r["parent_block_hash"]
            lw.check(parent is None or (isinstance(parent, bytes) and len(parent) == 32), "parent hash")
            h = hashes[0].hex()
            if parent is not None and not lost and not self.resynced:
                lw.check(parent.hex() in self.index, f"stored {h[:8]} before its parent")
            lw.check(h not in self.index, f"{h[:8]} stored twice")
            self.index[h] = (r["token_ids"], parent.hex() if parent else None)
        elif r["kind"] == "removed":
            lw.check(r["token_ids"] == [] and r["parent_block_hash"] is None, "removal with tokens")
            for h in hashes:
                if h.hex() not in self.index and self.resynced:
                    self.skipped += 1
                    continue
                lw.check(h.hex() in self.index, f"removal of {h.hex()[:8]}, never announced")
                del self.index[h.hex()]
        else:
            raise lw.Failure(f"kind {r['kind']!r}")

    def catch_up(self):
        for _ in range(10000):
            prev = self.cursor
            res = self.poll()
            if not res["events"] and res["next_cursor"] == prev:
                return
        raise lw.Failure("never caught up")

    def state(self):
        return {"cursor": self.cursor, "incarnation": self.incarnation, "index": self.index,
                "last_seq": self.last_seq, "resyncs": self.resyncs, "records": self.records,
                "lost_seen": self.lost_seen, "resynced": self.resynced, "skipped": self.skipped}


def hostile(p):
    """Polls a peer may send: unanswered when wrongly typed or refused,
    LMCache's answer otherwise; none changes what the next poll sees."""
    seen = {}
    before = p.raw(p.model, p.cursor, PAGE)
    for name, args in [("cursor_str", (p.model, "0", 8)), ("model_int", (7, 0, 8)),
                       ("max_none", (p.model, 0, None)), ("two_args", (p.model, 0)),
                       ("negative_cursor", (p.model, -1, 8)), ("zero_max", (p.model, 0, 0))]:
        seen[name] = p.raw(*args, timeout=1.0) is lw.NO_REPLY
    last = before["next_cursor"]
    fut = p.raw(p.model, last + 1000, 8)
    seen["future_cursor"] = fut["lost"] is True and fut["events"] == [] and fut["next_cursor"] == last
    huge = p.raw(p.model, 0, 2 ** 62)
    seen["huge_max"] = len(huge["events"]) <= 4096
    other = p.raw("no-such-model", 0, 8)
    seen["unknown_model"] = other["events"] == []
    after = p.raw(p.model, p.cursor, PAGE)
    seen["unchanged"] = after == before
    return seen


def main():
    endpoint, params = sys.argv[1], json.loads(sys.argv[2])
    out = {}
    try:
        if params["phase"] == "store":
            w = pw.Worker(endpoint, params, params["instance_id"], 0)
            out["mode"] = w.mode
            p = Poller(w.c, params["model"], params["chunk"])
            first = p.poll(1)
            lw.check(first["lost"] is False and first["next_cursor"] == 0, f"first poll {first!r:.200}")
            for i, toks in enumerate(params["prompts"]):
                n = len(toks) // w.chunk
                chunks = [lw.make_chunk(w.shape, w.dtype, i * 100 + c) for c in range(n)]
                ok = w.store(toks, chunks, "s-%d" % i)
                lw.check(ok in (True, None), f"COMMIT_STORE answered {ok!r}")
                if params.get("poll_every", 1) and i % params.get("poll_every", 1) == 0:
                    p.poll(params.get("page", PAGE))
            if params.get("paged_from_zero"):
                # Cursor 0 pages through the oldest records, one at a time.
                q = Poller(w.c, params["model"], params["chunk"])
                r1 = q.raw(q.model, 0, 1)
                r2 = q.raw(q.model, r1["next_cursor"], 1)
                out["paged"] = [[e["seq"] for e in r["events"]] for r in (r1, r2)]
            with open(params["state"], "w") as f:
                json.dump(p.state(), f)
            w.c.close()
        else:
            with open(params["state"]) as f:
                state = json.load(f)
            c = pw.Client(endpoint, "engine-driven-v2")
            names = c.call("GET_EXPERIMENTAL")
            lw.check("kv_events" in names, f"GET_EXPERIMENTAL {names!r}")
            p = Poller(c, params["model"], params["chunk"], state)
            if params.get("hostile"):
                out["hostile"] = hostile(p)
            p.catch_up()
            out.update(p.state())
            c.close()
    except lw.Failure as e:
        out["error"] = str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
