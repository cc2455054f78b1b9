#!/usr/bin/python3
"""Write real torch pickles and their expected raw bytes for the Go tests.

Run with Debian's interpreter from the package directory:

    /usr/bin/python3 testdata/gen_fixtures.py [outdir]

For every case it writes <name>.pkl (pickle.dumps(list_of_tensors, protocol=p)),
<name>.raw (each tensor's t.contiguous() bytes, concatenated in list order;
bfloat16 viewed as int16 first, as numpy has no bfloat16) and an entry in
manifest.json giving each tensor's dtype and shape. Data is seeded, so a rerun
with the same torch reproduces the files.
"""
import json
import os
import pickle
import sys

import torch

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def raw(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def dtype_name(dt):
    return str(dt).removeprefix("torch.")


def make(dtype, shape, gen):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


def cases():
    g = torch.Generator().manual_seed(1234)
    yield "f16_4d", [make(torch.float16, (2, 2, 16, 16), g)]
    yield "bf16_mla", [make(torch.bfloat16, (2, 16, 16), g)]
    yield "f32_1d", [make(torch.float32, (37,), g)]
    yield "f64_2d", [make(torch.float64, (3, 5), g)]
    yield "i8", [make(torch.int8, (4, 9), g)]
    yield "u8", [make(torch.uint8, (33,), g)]
    yield "bool", [make(torch.bool, (3, 7), g)]
    yield "i16_i32_i64", [make(torch.int16, (5,), g), make(torch.int32, (2, 3), g), make(torch.int64, (4,), g)]
    yield "several", [make(torch.float16, (2, 2, 16, 16), g), make(torch.bfloat16, (2, 16, 16), g),
                      make(torch.float32, (5, 3), g), make(torch.uint8, (6,), g)]
    base = make(torch.float32, (64,), g)
    yield "offset_slice", [base[10:30]]
    yield "transposed", [make(torch.bfloat16, (4, 16), g).t()]
    shared = make(torch.float16, (4, 8), g)
    yield "shared_storage", [shared[0], shared[1:3], shared.t(), shared]
    yield "expanded", [make(torch.float32, (1, 4), g).expand(3, 4)]
    yield "strided_step", [make(torch.int32, (6, 10), g)[::2, 1::3]]
    yield "scalar_0d", [torch.tensor(3.5, dtype=torch.float64)]
    yield "empty", [torch.zeros((0, 4), dtype=torch.float16)]
    yield "requires_grad", [make(torch.float32, (2, 3), g).requires_grad_()]
    yield "empty_list", []


def main():
    os.makedirs(OUT, exist_ok=True)
    manifest = []
    for name, ts in cases():
        for proto in (2, 3, 4, 5):
            fname = f"{name}_p{proto}"
            with open(os.path.join(OUT, fname + ".pkl"), "wb") as f:
                f.write(pickle.dumps(ts, protocol=proto))
            with open(os.path.join(OUT, fname + ".raw"), "wb") as f:
                for t in ts:
                    f.write(raw(t.detach()))
            manifest.append({
                "name": fname,
                "protocol": proto,
                "tensors": [{"dtype": dtype_name(t.dtype), "shape": list(t.shape)} for t in ts],
            })
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump({"torch": torch.__version__, "fixtures": manifest}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
