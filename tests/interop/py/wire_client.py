"""Wire-level LMCache MP client for kvdock's interop tests.

Plays an LMCache DEALER (pyzmq + msgpack, as msgspec encodes) against a
kvdock ROUTER and checks the frame layout byte for byte.

usage: wire_client.py ENDPOINT SCENARIO CONFIG_JSON
  CONFIG_JSON: {"types": {NAME: number, ...}, "chunk_size": N, "oversized": bytes}
Scenarios:
  basic     frame layout, uid/type echo, None -> no result frame,
            GET_CHUNK_SIZE / NOOP / PING / CLEAR, 100 outstanding requests
  badinput  after each bad message, NOOP answers within 1 s; bad input is
            never answered
Prints one JSON object with the steps done and the replies received by type
number ("answered"), which the server's counters must match; exits non-zero
on failure.
"""

import json
import sys
import time

import msgpack
import zmq


def packb(v):
    return msgpack.packb(v, use_bin_type=True)


class Dealer:
    def __init__(self, ctx, endpoint):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.uid = 0
        # Replies received, by type number: what the server must count as OK.
        self.answered = {}

    def next_uid(self):
        self.uid += 1
        return self.uid

    def send(self, frames):
        self.sock.send_multipart(frames)

    def recv(self, timeout_s):
        if self.sock.poll(int(timeout_s * 1000)):
            reply = self.sock.recv_multipart()
            if len(reply) >= 2:
                typ = str(msgpack.unpackb(reply[1]))
                self.answered[typ] = self.answered.get(typ, 0) + 1
            return reply
        return None

    def call(self, typ, *payload, timeout_s=2.0, uid_frame=None, type_frame=None):
        uid = self.next_uid()
        uid_frame = uid_frame if uid_frame is not None else packb(uid)
        type_frame = type_frame if type_frame is not None else packb(typ)
        self.send([uid_frame, type_frame] + [packb(p) for p in payload])
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            reply = self.recv(max(left, 0))
            if reply is None:
                raise AssertionError("no reply to type %r within %.1fs" % (typ, timeout_s))
            if reply[0] == uid_frame:
                if reply[1] != type_frame:
                    raise AssertionError("type frame %r echoed as %r" % (type_frame, reply[1]))
                return reply
            raise AssertionError("unexpected message (bad input answered?): %r" % (reply,))


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def basic(ctx, endpoint, cfg):
    t = cfg["types"]
    d = Dealer(ctx, endpoint)
    steps = []

    r = d.call(t["NOOP"])
    check(len(r) == 3, "NOOP reply has %d frames, want 3 (uid, type, result)" % len(r))
    check(msgpack.unpackb(r[2]) == "OK", "NOOP result %r" % r[2])
    check(r[2] == b"\xa2OK", "NOOP result must be a msgpack str, got %r" % r[2])
    steps.append("noop")

    # uid and type echoed byte for byte, also in non-shortest encodings.
    uid = b"\xcf" + (4242).to_bytes(8, "big")
    typ = b"\xcd" + t["NOOP"].to_bytes(2, "big")
    r = d.call(None, uid_frame=uid, type_frame=typ)
    check(r[0] == uid and r[1] == typ, "uid/type not echoed verbatim: %r" % (r[:2],))
    steps.append("echo_verbatim")

    r = d.call(t["GET_CHUNK_SIZE"])
    check(len(r) == 3 and msgpack.unpackb(r[2]) == cfg["chunk_size"], "GET_CHUNK_SIZE %r" % (r,))
    steps.append("chunk_size")

    r = d.call(t["PING"])
    check(len(r) == 3 and msgpack.unpackb(r[2]) is True, "PING %r" % (r,))
    steps.append("ping")

    r = d.call(t["CLEAR"])
    check(len(r) == 2, "CLEAR returns None: want no result frame, got %r" % (r,))
    steps.append("clear_none")

    r = d.call(t["END_SESSION"], "no-such-session")
    check(len(r) == 2, "END_SESSION returns None: want no result frame, got %r" % (r,))
    steps.append("end_session_none")

    # 100 outstanding requests, answered and matched by uid.
    sent = {}
    kinds = [t["NOOP"], t["GET_CHUNK_SIZE"], t["PING"], t["CLEAR"]]
    for i in range(100):
        typ = kinds[i % len(kinds)]
        u = d.next_uid()
        sent[u] = typ
        d.send([packb(u), packb(typ)])
    got = {}
    deadline = time.monotonic() + 10
    while len(got) < 100:
        r = d.recv(max(deadline - time.monotonic(), 0))
        check(r is not None, "only %d of 100 outstanding replies arrived" % len(got))
        u = msgpack.unpackb(r[0])
        check(u in sent and u not in got, "unexpected or duplicate uid %r" % u)
        check(msgpack.unpackb(r[1]) == sent[u], "uid %d: type %r, sent %r" % (u, r[1], sent[u]))
        want = {t["NOOP"]: "OK", t["GET_CHUNK_SIZE"]: cfg["chunk_size"], t["PING"]: True}.get(sent[u])
        if want is None:
            check(len(r) == 2, "uid %d: CLEAR reply has a result frame" % u)
        else:
            check(len(r) == 3 and msgpack.unpackb(r[2]) == want, "uid %d: result %r" % (u, r))
        got[u] = True
    steps.append("outstanding_100")
    return steps, d.answered


def badinput(ctx, endpoint, cfg):
    t = cfg["types"]
    d = Dealer(ctx, endpoint)
    steps = []
    key = {"model_name": "m", "world_size": 1, "worker_id": 0, "token_ids": [1, 2],
           "start": 0, "end": 2, "request_id": "r", "cache_salt": ""}

    def noop_within_1s(step):
        t0 = time.monotonic()
        r = d.call(t["NOOP"], timeout_s=1.0)
        check(len(r) == 3 and msgpack.unpackb(r[2]) == "OK", "%s: NOOP reply %r" % (step, r))
        steps.append({"step": step, "noop_ms": round((time.monotonic() - t0) * 1000, 2)})

    cases = [
        ("one_frame", [packb(d.next_uid())]),
        ("garbage_type", [packb(d.next_uid()), b"garbage"]),
        ("type_250", [packb(d.next_uid()), packb(250)]),
        ("wrong_arity", [packb(d.next_uid()), packb(t["NOOP"]), packb(1)]),
        ("non_msgpack", [packb(d.next_uid()), packb(t["END_SESSION"]), b"\xc1\xc1"]),
        ("wrong_type_payload", [packb(d.next_uid()), packb(t["LOOKUP"]), packb(key), packb("two")]),
        ("gpu_store", [packb(d.next_uid()), packb(t["STORE"]), b"cuda ipc handle"]),
    ]
    if cfg.get("oversized"):
        # Frames each under the limit, total over it: dropped by the server.
        part = b"\x00" * (cfg["oversized"] // 2 + 1024)
        cases.append(("oversized_total", [packb(d.next_uid()), packb(t["COMMIT_STORE"]), packb(key), part, part]))
    for name, frames in cases:
        d.send(frames)
        noop_within_1s(name)

    if cfg.get("oversized"):
        # One frame over ZMQ_MAXMSGSIZE: libzmq drops that connection, so it
        # goes on its own DEALER; the main one must keep working.
        big = Dealer(ctx, endpoint)
        big.send([packb(1), packb(t["COMMIT_STORE"]), packb(key), packb(0),
                  packb(b"\x00" * (cfg["oversized"] + 1))])
        time.sleep(0.2)
        noop_within_1s("oversized_frame")
        big.sock.close(0)

    # Nothing but NOOP replies may have arrived.
    extra = d.recv(0.2)
    check(extra is None, "bad input was answered: %r" % (extra,))
    return steps, d.answered


def main():
    endpoint, scenario, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    ctx = zmq.Context()
    try:
        steps, answered = {"basic": basic, "badinput": badinput}[scenario](ctx, endpoint, cfg)
    finally:
        ctx.destroy(linger=0)
    print(json.dumps({"scenario": scenario, "steps": steps, "answered": answered}))


if __name__ == "__main__":
    main()
