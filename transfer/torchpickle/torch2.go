package torchpickle

// torch 2.x pickles the dtypes it has no typed storage class for (the float8
// types among those this package handles) differently from the others:
//
//	_rebuild_tensor_v3(_load_from_bytes(<legacy container of a
//	    torch.storage.UntypedStorage, numel = byte count>),
//	    offset, size, stride, requires_grad, OrderedDict(), torch.<dtype>)
//
// torch 2.6 cannot load that form itself (its legacy loader asks the
// UntypedStorage class for a dtype it lacks), so the encoder names
// torch.ByteStorage in the container instead: _rebuild_tensor_v3 only uses
// the storage's bytes, and torch 2.x loads it. The decoder accepts both.
//
// The dtype travels as a global naming a torch.dtype object. The decoder
// treats it as an inert value: it can only be an argument of
// _rebuild_tensor_v3, never called. Offset, size and stride count elements
// of that dtype, so the bytes are viewed as the dtype before the view is
// checked against the storage exactly as for _rebuild_tensor_v2.

const (
	strRebuildV3Name = "_rebuild_tensor_v3"
	strUntypedMod    = "torch.storage"
	strUntypedName   = "UntypedStorage"
	strDtypeMod      = "torch"
)

// untypedStorage stands for torch.storage.UntypedStorage: bytes without an
// element type. Its empty name is no dtype, so nothing can be encoded or
// decoded as "untyped".
var untypedStorage = dtypeInfo{name: "", storage: strUntypedName, size: 1}

// dtypeVal is a torch.<dtype> global: a value, never a callable.
type dtypeVal struct{ dt *dtypeInfo }

// untypedInTorch reports whether torch 2.x pickles dt as an UntypedStorage
// with _rebuild_tensor_v3 (it has no typed storage class for dt).
func untypedInTorch(dt *dtypeInfo) bool { return dt.storage == "" }

// resolveTorch2 maps the globals torch 2.x adds to values; ok is false for
// every other name. inner: inside a legacy storage container.
func resolveTorch2(mod, name string, inner bool) (any, bool) {
	if inner {
		if mod == strUntypedMod && name == strUntypedName {
			return storageClass{&untypedStorage}, true
		}
		return nil, false
	}
	switch {
	case mod == strRebuildMod && name == strRebuildV3Name:
		return gRebuildTensorV3, true
	case mod == strDtypeMod:
		if dt, ok := dtypeByName(name); ok && name != "" {
			return dtypeVal{dt}, true
		}
	}
	return nil, false
}

// rebuildTensorV3 interprets _rebuild_tensor_v3(storage, storage_offset, size,
// stride, requires_grad, backward_hooks, dtype[, metadata]).
func (m *machine) rebuildTensorV3(args []any) (Tensor, error) {
	const fn = "torch._utils._rebuild_tensor_v3"
	if len(args) != 7 && len(args) != 8 {
		return Tensor{}, m.errf(ErrMalformed, "%s with %d arguments, want 7 or 8", fn, len(args))
	}
	s, ok := args[0].(*storage)
	if !ok || (s.dt != &untypedStorage && s.dt.name != "uint8") {
		return Tensor{}, m.errf(ErrMalformed, "%s storage is %s, want an UntypedStorage or a ByteStorage", fn, storageTypeName(args[0]))
	}
	dv, ok := args[6].(dtypeVal)
	if !ok {
		return Tensor{}, m.errf(ErrMalformed, "%s dtype is %s, want a torch dtype", fn, typeName(args[6]))
	}
	if len(s.data)%dv.dt.size != 0 {
		return Tensor{}, m.errf(ErrMalformed, "%s: %d storage bytes are not whole %s elements", fn, len(s.data), dv.dt.name)
	}
	// The remaining arguments are those of _rebuild_tensor_v2, checked the same way.
	v2 := append(append(make([]any, 0, 7), &storage{dt: dv.dt, data: s.data}), args[1:6]...)
	if len(args) == 8 {
		v2 = append(v2, args[7])
	}
	return m.rebuildTensor(v2)
}

func storageTypeName(v any) string {
	if s, ok := v.(*storage); ok {
		if s.dt == &untypedStorage {
			return "an UntypedStorage"
		}
		return "a torch." + s.dt.storage
	}
	return typeName(v)
}
