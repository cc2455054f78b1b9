#!/usr/bin/python3
"""Write real torch pickles and their expected raw bytes for the Go tests.

Run with Debian's interpreter from the package directory:

    /usr/bin/python3 testdata/gen_fixtures.py [outdir]               # torch 1.13 (bookworm)
    scripts/torch2-env.sh run /usr/bin/python3 \
        transfer/torchpickle/testdata/gen_fixtures.py                 # torch 2.x (trixie root)

The default outdir is fixtures/ under torch 1.x and fixtures-torch<major>.<minor>/
under torch 2.x, so each torch's fixtures live in their own folder.

For every case it writes <name>.pkl (pickle.dumps(list_of_tensors, protocol=p)),
<name>.raw (each tensor's t.contiguous() bytes, concatenated in list order;
bfloat16 viewed as int16 and float8 as uint8 first, as numpy has neither) and an
entry in manifest.json giving each tensor's dtype and shape. Under torch 2.x it
adds the float8 cases (pickled by torch 2.x with _rebuild_tensor_v3 over an
UntypedStorage) and "refused" entries: pickles torch 2.x writes for tensors
that are not plain CPU tensors of a supported dtype, which the decoder must
refuse (the manifest names what the error must mention). Data is seeded, so
a rerun with the same torch reproduces the data (storage keys in the
containers are object ids and differ between runs).
"""
import json
import os
import pickle
import sys

import torch

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
_default = "fixtures" if not TORCH2 else "fixtures-torch" + ".".join(torch.__version__.split(".")[:2])
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), _default)
# Types numpy cannot hold, viewed as same-size integers for the .raw sidecars.
AS_INT = {torch.bfloat16: torch.int16}
if TORCH2:
    AS_INT.update({torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8})


def raw(t):
    t = t.contiguous()
    if t.dtype in AS_INT:
        t = t.view(AS_INT[t.dtype])
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
    if not TORCH2:
        return
    # torch 2.x: the dtypes without a typed storage, contiguous and as views,
    # alone and mixed with _rebuild_tensor_v2 tensors in one list.
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    yield "f8e4m3_4d", [make(e4, (2, 2, 16, 16), g)]
    yield "f8e5m2_mla", [make(e5, (2, 16, 16), g)]
    yield "f8_transposed", [make(e4, (4, 16), g).t(), make(e5, (3, 5), g).t()]
    f8 = make(e5, (6, 10), g)
    yield "f8_views", [f8[2:4], f8[::2, 1::3], f8[0, 3:9], f8]
    yield "f8_scalar_empty", [torch.tensor(1.5).to(e4), torch.zeros((0, 3), dtype=e5)]
    yield "f8_requires_grad_free", [make(e4, (3,), g).detach()]
    yield "mixed_v2_v3", [make(torch.bfloat16, (2, 8), g), make(e4, (2, 8), g), make(torch.float16, (4,), g),
                          make(e5, (2, 8), g), make(e4, (1,), g)]


def refused_cases():
    """Pickles torch 2.x writes for tensors that are no plain CPU tensor of a
    supported dtype: (name, object, text the decoder's error must contain)."""
    g = torch.Generator().manual_seed(99)
    yield "uint16_v3", [torch.randint(0, 1000, (4,), generator=g).to(torch.uint16)], "global torch.uint16 not allowed"
    yield "complex64", [torch.randn(3, dtype=torch.complex64, generator=g)], "ComplexFloatStorage"
    yield "parameter", [torch.nn.Parameter(torch.randn(3, generator=g))], "global torch._utils._rebuild_parameter not allowed"
    sub = torch.randn(3, generator=g)
    sub.note = "python attribute"
    yield "tensor_with_attrs", [sub], "global torch._tensor._rebuild_from_type_v2 not allowed"
    yield "conj_metadata", [torch.randn(3, dtype=torch.complex64, generator=g).conj()], "ComplexFloatStorage"


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
    refused = []
    if TORCH2:
        for name, obj, want in refused_cases():
            for proto in (2, 4):
                fname = f"refused_{name}_p{proto}"
                with open(os.path.join(OUT, fname + ".pkl"), "wb") as f:
                    f.write(pickle.dumps(obj, protocol=proto))
                refused.append({"name": fname, "protocol": proto, "error": want})
    out = {"torch": torch.__version__, "fixtures": manifest}
    if refused:
        out["refused"] = refused
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
