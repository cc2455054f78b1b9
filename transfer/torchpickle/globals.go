package torchpickle

import "unicode/utf8"

// The allowed globals: the only names a pickle may refer to (resolve) and
// what a REDUCE of each means (call). Nothing the input names is ever run;
// each "call" is Go code that checks its arguments. The torch 2.x names are
// in torch2.go, the tensor rebuilding in rebuild.go, the storage containers
// in legacy.go.

const (
	gRebuildTensorV2 global = iota + 1
	gLoadFromBytes
	gOrderedDict
	gCodecsEncode
	gRebuildTensorV3 // torch 2.x, for dtypes without a typed storage (torch2.go)
)

func (g global) String() string {
	switch g {
	case gRebuildTensorV2:
		return "torch._utils._rebuild_tensor_v2"
	case gLoadFromBytes:
		return "torch.storage._load_from_bytes"
	case gOrderedDict:
		return "collections.OrderedDict"
	case gCodecsEncode:
		return "_codecs.encode"
	case gRebuildTensorV3:
		return "torch._utils._rebuild_tensor_v3"
	}
	return "unknown global"
}

// resolve maps a module and name to an allowed global, or refuses it. The
// comparisons do not allocate; only a refusal builds the full name.
func (m *machine) resolve(mod, name []byte) (any, error) {
	if v, ok := resolveTorch2(string(mod), string(name), m.inner); ok {
		return v, nil
	}
	if m.inner {
		if string(mod) == "torch" {
			if dt, ok := dtypeByStorage(string(name)); ok {
				return storageClass{dt}, nil
			}
		}
		return nil, m.errf(ErrForbidden, "global %s not allowed in a storage container (only torch.<Type>Storage)", printable(string(mod)+"."+string(name)))
	}
	switch {
	case string(mod) == "torch._utils" && string(name) == "_rebuild_tensor_v2":
		return gRebuildTensorV2, nil
	case string(mod) == "torch.storage" && string(name) == "_load_from_bytes":
		return gLoadFromBytes, nil
	case string(mod) == "collections" && string(name) == "OrderedDict":
		return gOrderedDict, nil
	case string(mod) == "_codecs" && string(name) == "encode":
		return gCodecsEncode, nil
	}
	return nil, m.errf(ErrForbidden, "global %s not allowed", printable(string(mod)+"."+string(name)))
}

// call interprets a REDUCE of an allowed global; it never runs code chosen by the input.
func (m *machine) call(fv any, args []any) (any, error) {
	g, ok := fv.(global)
	if !ok {
		return nil, m.errf(ErrForbidden, "REDUCE on %s: only %s, %s, %s, %s and %s may be called",
			typeName(fv), gRebuildTensorV2, gRebuildTensorV3, gLoadFromBytes, gOrderedDict, gCodecsEncode)
	}
	switch g {
	case gOrderedDict:
		if len(args) != 0 {
			return nil, m.errf(ErrMalformed, "collections.OrderedDict with %d arguments, want none", len(args))
		}
		return orderedDict{}, nil
	case gCodecsEncode:
		return m.codecsEncode(args)
	case gLoadFromBytes:
		if len(args) != 1 {
			return nil, m.errf(ErrMalformed, "torch.storage._load_from_bytes with %d arguments, want 1", len(args))
		}
		b, ok := args[0].(pyBytes)
		if !ok {
			return nil, m.errf(ErrMalformed, "torch.storage._load_from_bytes of %s, want bytes", typeName(args[0]))
		}
		s, err := m.st.loadContainer(b)
		if err != nil {
			return nil, m.wrap(err, "storage container")
		}
		return s, nil
	case gRebuildTensorV2:
		if m.st.tensors >= m.st.lim.MaxTensors {
			return nil, m.errf(ErrLimit, "more than %d tensors", m.st.lim.MaxTensors)
		}
		m.st.tensors++
		t, err := m.rebuildTensor(args)
		if err != nil {
			return nil, err
		}
		return &tensorVal{t}, nil
	case gRebuildTensorV3:
		if m.st.tensors >= m.st.lim.MaxTensors {
			return nil, m.errf(ErrLimit, "more than %d tensors", m.st.lim.MaxTensors)
		}
		m.st.tensors++
		t, err := m.rebuildTensorV3(args)
		if err != nil {
			return nil, err
		}
		return &tensorVal{t}, nil
	}
	return nil, m.errf(ErrForbidden, "REDUCE on %s", g)
}

func (m *machine) codecsEncode(args []any) (any, error) {
	if len(args) != 2 {
		return nil, m.errf(ErrMalformed, "_codecs.encode with %d arguments, want 2", len(args))
	}
	s, ok1 := args[0].(str)
	enc, ok2 := args[1].(str)
	if !ok1 || !ok2 || string(enc) != "latin1" {
		return nil, m.errf(ErrMalformed, "_codecs.encode supported only as (str, 'latin1'), the protocol-2 form of bytes")
	}
	if err := m.st.charge(int64(len(s))); err != nil {
		return nil, m.wrap(err, "_codecs.encode")
	}
	n := utf8.RuneCount(s)
	if err := m.st.spend(int64(n), "latin-1 bytes"); err != nil {
		return nil, m.wrap(err, "_codecs.encode")
	}
	if err := m.st.retain(2, "bytes"); err != nil {
		return nil, m.wrap(err, "_codecs.encode")
	}
	out := make([]byte, 0, n)
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			out = append(out, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size <= 1 || r > 0xff {
			return nil, m.errf(ErrMalformed, "_codecs.encode: str is not latin-1 text (byte %d)", i)
		}
		out = append(out, byte(r))
		i += size
	}
	return pyBytes(out), nil
}
