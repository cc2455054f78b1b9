"""A router's subscriber, modelled on vLLM's example KV event subscriber: it
asks kvdock's replay ROUTER for every buffered batch from seq 0, decodes
each (events as tagged maps or positional arrays, hashes as integers), keeps
an index per model as llm-d does (a stored block whose parent it does not
know is dropped) and prints it as JSON: {"models": {model: [hash, ...]},
"batches": n, "dropped": n, "errors": [...]}.

usage: kv_events_replay.py REPLAY_ENDPOINT legacy|current
"""
import json
import sys

import msgpack
import zmq

END = b"\xff" * 8


def fields(ev):
    """The event's tag and fields by name, from either encoding."""
    if isinstance(ev, dict):
        return ev.get("type"), ev
    tag = ev[0]
    names = {
        "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                        "lora_id", "medium", "lora_name"],
        "BlockRemoved": ["block_hashes", "medium"],
    }.get(tag, [])
    return tag, dict(zip(names, ev[1:]))


def main():
    endpoint, form = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10000)
    sock.connect(endpoint)
    sock.send_multipart([b"", (0).to_bytes(8, "big")])
    index, errors, dropped, batches, want = {}, [], 0, 0, 0
    while True:
        frames = sock.recv_multipart()
        if form == "legacy":
            _, seq, payload = frames
            topic = None
        else:
            _, topic, seq, payload = frames
        if seq == END:
            if payload != b"" or (topic is not None and topic != b""):
                errors.append("bad end marker")
            break
        n = int.from_bytes(seq, "big")
        if n != want:
            errors.append("seq %d, expected %d" % (n, want))
        want = n + 1
        batches += 1
        ts, events, dp_rank = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if not isinstance(ts, float) or dp_rank != 0:
            errors.append("batch %d: ts %r, rank %r" % (n, ts, dp_rank))
        if topic is not None:
            model = topic.decode().split("@", 2)[2]
        else:
            model = "(all)"
        known = index.setdefault(model, set())
        for ev in events:
            tag, f = fields(ev)
            if f.get("medium") != "CPU":
                errors.append("medium %r" % f.get("medium"))
            hashes = f.get("block_hashes", [])
            if any(not isinstance(h, int) for h in hashes):
                errors.append("hash not an integer")
            if tag == "BlockStored":
                if len(f.get("token_ids", [])) != len(hashes) * f.get("block_size", 0):
                    errors.append("tokens do not fill the blocks")
                parent = f.get("parent_block_hash")
                if parent is not None and parent not in known:
                    dropped += 1
                    continue
                known.update(hashes)
            elif tag == "BlockRemoved":
                for h in hashes:
                    if h not in known:
                        errors.append("removal of %x, not announced" % h)
                    known.discard(h)
            else:
                errors.append("event %r" % tag)
    print(json.dumps({"models": {m: sorted(s) for m, s in index.items()},
                      "batches": batches, "dropped": dropped, "errors": errors}))


if __name__ == "__main__":
    main()
