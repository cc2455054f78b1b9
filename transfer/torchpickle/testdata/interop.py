#!/usr/bin/python3
"""Interop helper for the Go tests (run with /usr/bin/python3 and torch).

    interop.py DIR

1. For every entry of DIR/go_manifest.json, pickle.loads(DIR/<name>.pkl) (written
   by Go's AppendEncode) and check it is a list of torch tensors whose dtype,
   shape and bytes equal tensors rebuilt independently from DIR/<name>.raw.
2. Write fresh pickles made by this torch (random data, protocols 2-5, views)
   as DIR/py_<n>.pkl with .raw sidecars and DIR/py_manifest.json for Go to decode.
"""
import json
import os
import pickle
import sys

import torch

DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8,
    "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
# Compare floats bit for bit (random bytes include NaNs).
BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
        torch.float32: torch.int32, torch.float64: torch.int64}
# torch 2.x float8 (torch.equal has no float8 kernel: compared as uint8).
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        DTYPES[_name] = getattr(torch, _name)
        BITS[DTYPES[_name]] = torch.uint8


def expected(raw, dtype, shape):
    if len(raw) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def bits(t):
    return t.view(BITS[t.dtype]) if t.dtype in BITS else t


def check(d):
    with open(os.path.join(d, "go_manifest.json")) as f:
        manifest = json.load(f)
    for entry in manifest:
        with open(os.path.join(d, entry["name"] + ".pkl"), "rb") as f:
            data = f.read()
        got = pickle.loads(data)
        # The pure-Python unpickler enforces frame boundaries strictly.
        slow = pickle._loads(data)
        assert len(slow) == len(got) and all(torch.equal(bits(a), bits(b)) for a, b in zip(slow, got)), entry["name"]
        with open(os.path.join(d, entry["name"] + ".raw"), "rb") as f:
            raw = f.read()
        assert isinstance(got, list), (entry["name"], type(got))
        assert len(got) == len(entry["tensors"]), entry["name"]
        off = 0
        for i, (t, spec) in enumerate(zip(got, entry["tensors"])):
            dt = DTYPES[spec["dtype"]]
            where = f'{entry["name"]}[{i}]'
            assert type(t) is torch.Tensor, (where, type(t))
            assert t.dtype == dt, (where, t.dtype, dt)
            assert list(t.shape) == spec["shape"], (where, list(t.shape), spec["shape"])
            assert t.is_contiguous() and not t.requires_grad and t.device.type == "cpu", where
            n = t.numel() * t.element_size()
            want = expected(raw[off:off + n], dt, spec["shape"])
            off += n
            assert torch.equal(bits(t), bits(want)), where
        assert off == len(raw), entry["name"]
        print("ok", entry["name"])


def raw_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16 or (t.dtype.is_floating_point and t.element_size() == 1):
        t = bits(t)
    return t.numpy().tobytes()


def make(d):
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    out = []
    n = 0
    for proto in (2, 3, 4, 5):
        for dt in DTYPES.values():
            if dt.is_floating_point:
                base = torch.randn((3, 4, 8), generator=g).to(dt)
            elif dt == torch.bool:
                base = torch.randint(0, 2, (3, 4, 8), generator=g).bool()
            else:
                base = torch.randint(0, 100, (3, 4, 8), generator=g).to(dt)
            ts = [base, base[1], base.transpose(0, 2), base[:, 1:3, ::2], torch.ones(70000, dtype=dt)]
            name = f"py_{n}"
            n += 1
            with open(os.path.join(d, name + ".pkl"), "wb") as f:
                f.write(pickle.dumps(ts, protocol=proto))
            with open(os.path.join(d, name + ".raw"), "wb") as f:
                for t in ts:
                    f.write(raw_bytes(t))
            out.append({"name": name, "protocol": proto,
                        "tensors": [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in ts]})
    # The most tensors a message may hold (Limits.MaxTensors), each a small
    # KV-like chunk of 512 bytes: torch's own pickles of these must fit the
    # decoder's default work and item budgets.
    for proto in (2, 4):
        ts = [torch.randn((2, 4, 8, 4), generator=g).to(torch.float16) for _ in range(4096)]
        name = f"py_{n}"
        n += 1
        with open(os.path.join(d, name + ".pkl"), "wb") as f:
            f.write(pickle.dumps(ts, protocol=proto))
        with open(os.path.join(d, name + ".raw"), "wb") as f:
            for t in ts:
                f.write(raw_bytes(t))
        out.append({"name": name, "protocol": proto,
                    "tensors": [{"dtype": "float16", "shape": list(t.shape)} for t in ts]})
    with open(os.path.join(d, "py_manifest.json"), "w") as f:
        json.dump({"torch": torch.__version__, "fixtures": out}, f)
    print("made", n)


if __name__ == "__main__":
    check(sys.argv[1])
    make(sys.argv[1])
