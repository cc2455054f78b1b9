package torchpickle

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
)

// Tensor rebuilding: turning a _rebuild_tensor_v2 call (and, through
// rebuildTensorV3 in torch2.go, a _rebuild_tensor_v3 call) into a Tensor.
// The arguments are checked, size and stride validated against the storage,
// and the view either aliases the storage (contiguous) or is copied within
// the copy and work budgets (strided).

func (m *machine) rebuildTensor(args []any) (Tensor, error) {
	const fn = "torch._utils._rebuild_tensor_v2"
	if len(args) != 6 && len(args) != 7 {
		return Tensor{}, m.errf(ErrMalformed, "%s with %d arguments, want 6 or 7", fn, len(args))
	}
	s, ok := args[0].(*storage)
	if !ok || s.dt == &untypedStorage {
		return Tensor{}, m.errf(ErrMalformed, "%s storage is %s, want a typed storage", fn, storageTypeName(args[0]))
	}
	off, ok := args[1].(int64)
	if !ok {
		return Tensor{}, m.errf(ErrMalformed, "%s storage_offset is %s, want int", fn, typeName(args[1]))
	}
	// Size and stride live on the stack; only the shape is kept.
	var sizeBuf, strideBuf [maxDims]int64
	size, err := m.intTuple(sizeBuf[:0], args[2], "size")
	if err != nil {
		return Tensor{}, err
	}
	stride, err := m.intTuple(strideBuf[:0], args[3], "stride")
	if err != nil {
		return Tensor{}, err
	}
	// The tensorVal (80 bytes) and its shape stay.
	if err := m.st.retain(5+int64(len(size)+1)/2, "tensor"); err != nil {
		return Tensor{}, m.wrap(err, fn)
	}
	if _, ok := args[4].(bool); !ok {
		return Tensor{}, m.errf(ErrMalformed, "%s requires_grad is %s, want bool", fn, typeName(args[4]))
	}
	if _, ok := args[5].(orderedDict); !ok {
		return Tensor{}, m.errf(ErrMalformed, "%s backward_hooks is %s, want an empty OrderedDict", fn, typeName(args[5]))
	}
	if len(args) == 7 {
		if d, ok := args[6].(*dict); !ok || len(d.keys) != 0 {
			return Tensor{}, m.errf(ErrMalformed, "%s metadata is %s, only an empty dict is supported", fn, typeName(args[6]))
		}
	}
	t, err := view(s, off, size, stride, m.st)
	if err != nil {
		return Tensor{}, m.wrap(err, fn)
	}
	return t, nil
}

// intTuple appends the tuple's non-negative ints to dst (of capacity maxDims).
func (m *machine) intTuple(dst []int64, v any, what string) ([]int64, error) {
	t, ok := v.(*tuple)
	if !ok {
		return nil, m.errf(ErrMalformed, "tensor %s is %s, want a tuple of ints", what, typeName(v))
	}
	if len(t.items) > maxDims {
		return nil, m.errf(ErrLimit, "tensor %s has %d dimensions, at most %d supported", what, len(t.items), maxDims)
	}
	if err := m.st.charge(int64(len(t.items))); err != nil {
		return nil, m.wrap(err, "tensor "+what)
	}
	for i, it := range t.items {
		x, ok := it.(int64)
		if !ok || x < 0 {
			return nil, m.errf(ErrMalformed, "tensor %s[%d] is %s, want a non-negative int", what, i, typeName(it))
		}
		dst = append(dst, x)
	}
	return dst, nil
}

// view turns (storage, offset, size, stride) into a contiguous tensor: a slice
// of the storage when the view is contiguous, a bounded copy otherwise.
func view(s *storage, off int64, size, stride []int64, st *decodeState) (Tensor, error) {
	if len(size) != len(stride) {
		return Tensor{}, fmt.Errorf("size has %d dims, stride %d: %w", len(size), len(stride), ErrMalformed)
	}
	es := int64(s.dt.size)
	snumel := int64(len(s.data)) / es
	if off < 0 || off > snumel {
		return Tensor{}, fmt.Errorf("storage offset %d outside storage of %d elements: %w", off, snumel, ErrMalformed)
	}
	numel := int64(1)
	for _, d := range size {
		hi, lo := bits.Mul64(uint64(numel), uint64(d))
		if hi != 0 || lo > math.MaxInt64/uint64(es) {
			return Tensor{}, fmt.Errorf("size %s overflows: %w", dimsString(size), ErrMalformed)
		}
		numel = int64(lo)
	}
	shape := make([]int, len(size))
	for i, d := range size {
		if int64(int(d)) != d {
			return Tensor{}, fmt.Errorf("size %s too large: %w", dimsString(size), ErrMalformed)
		}
		shape[i] = int(d)
	}
	t := Tensor{Dtype: s.dt.name, Shape: shape}
	if numel == 0 {
		t.Data = s.data[off*es : off*es : off*es]
		return t, nil
	}
	// Highest element index the view touches must lie inside the storage.
	last := uint64(off)
	for i, d := range size {
		hi, lo := bits.Mul64(uint64(d-1), uint64(stride[i]))
		var c uint64
		last, c = bits.Add64(last, lo, 0)
		if hi != 0 || c != 0 || last >= 1<<62 {
			return Tensor{}, fmt.Errorf("size %s stride %s overflow: %w", dimsString(size), dimsString(stride), ErrMalformed)
		}
	}
	if int64(last) >= snumel {
		return Tensor{}, fmt.Errorf("view (offset %d, size %s, stride %s) reaches element %d of a %d-element storage: %w", off, dimsString(size), dimsString(stride), last, snumel, ErrMalformed)
	}
	if contiguous(size, stride) {
		t.Data = s.data[off*es : (off+numel)*es : (off+numel)*es]
		return t, nil
	}
	n := numel * es
	if err := st.spend(n, "copy of a non-contiguous view"); err != nil {
		return Tensor{}, err
	}
	// Dimensions of size 1 move no address; without them every carry in
	// stridedCopy's odometer is paid for by at least two rows.
	size, stride = dropUnitDims(size, stride)
	rows := numel / size[len(size)-1]
	steps := rows
	if stride[len(stride)-1] != 1 {
		steps += numel // copied element by element
	}
	if err := st.charge(steps); err != nil {
		return Tensor{}, fmt.Errorf("copy of a non-contiguous view: %w", err)
	}
	t.Data = stridedCopy(make([]byte, n), s.data, off, size, stride, int(es))
	return t, nil
}

// dropUnitDims returns size and stride without the dimensions of size 1, or
// a single dimension of size 1 when all are. numel > 0, so no size is 0.
func dropUnitDims(size, stride []int64) ([]int64, []int64) {
	var sz, sd []int64
	for i, d := range size {
		if d != 1 {
			sz = append(sz, d)
			sd = append(sd, stride[i])
		}
	}
	if len(sz) == 0 {
		return []int64{1}, []int64{1}
	}
	return sz, sd
}

// dimsString formats dims as fmt's %v would, without letting them escape
// (rebuildTensor keeps size and stride on its stack).
func dimsString(dims []int64) string {
	b := []byte{'['}
	for i, d := range dims {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendInt(b, d, 10)
	}
	return string(append(b, ']'))
}

// contiguous follows torch's is_contiguous: dims of size 1 may have any stride.
func contiguous(size, stride []int64) bool {
	expect := int64(1)
	for i := len(size) - 1; i >= 0; i-- {
		if size[i] != 1 {
			if stride[i] != expect {
				return false
			}
			expect *= size[i]
		}
	}
	return true
}

func stridedCopy(dst, src []byte, off int64, size, stride []int64, es int) []byte {
	nd := len(size)
	idx := make([]int64, nd)
	inner, innerStride := int(size[nd-1]), int(stride[nd-1])*es
	base := int(off) * es // byte offset of the current row, kept incrementally
	w := 0
	for {
		switch {
		case innerStride == es:
			w += copy(dst[w:], src[base:base+inner*es])
		case es == 2:
			for j, p := 0, base; j < inner; j, p = j+1, p+innerStride {
				dst[w], dst[w+1] = src[p], src[p+1]
				w += 2
			}
		case es == 1:
			for j, p := 0, base; j < inner; j, p = j+1, p+innerStride {
				dst[w] = src[p]
				w++
			}
		default:
			for j, p := 0, base; j < inner; j, p = j+1, p+innerStride {
				w += copy(dst[w:w+es], src[p:p+es])
			}
		}
		i := nd - 2
		for ; i >= 0; i-- {
			idx[i]++
			base += int(stride[i]) * es
			if idx[i] < size[i] {
				break
			}
			base -= int(size[i]*stride[i]) * es
			idx[i] = 0
		}
		if i < 0 {
			return dst
		}
	}
}
