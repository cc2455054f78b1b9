// Package torchpickle reads and writes the pickles that LMCache workers in pickle
// mode exchange with the cache server: `pickle.dumps(list_of_cpu_tensors)`.
//
// The decoder is a small, restricted pickle machine. It understands exactly the
// opcodes and globals that torch emits for a list of plain CPU tensors
// (torch._utils._rebuild_tensor_v2 over a storage rebuilt by
// torch.storage._load_from_bytes from a legacy torch.save container, an empty
// collections.OrderedDict for backward hooks, and _codecs.encode for protocol 2
// bytes). Everything else — any other global, opcode or shape — is an error that
// names what was met. It never calls anything: "calls" of allowed globals are
// interpreted by Go code that checks every argument. Declared sizes are checked
// against the bytes actually present before anything is sliced or allocated,
// and the decoder's work and retained memory are bounded by budgets that grow
// with the input's length (Limits), so no pickle costs more than a small
// multiple of its size in time or memory.
//
// The encoder writes the same form torch itself writes (protocol 4), so a
// worker's pickle.loads yields real torch tensors without custom code.
package torchpickle

import (
	"errors"
	"fmt"
)

// Tensor is one decoded (or to-be-encoded) tensor. Data holds the elements in
// row-major, contiguous order; Dtype is torch's dtype name ("bfloat16", ...).
// A decoded contiguous tensor's Data is a slice of the decoder's input.
type Tensor struct {
	Dtype string
	Shape []int
	Data  []byte
}

// Sentinel errors; every error returned by Decode or AppendEncode wraps one.
var (
	// ErrForbidden: the pickle uses a global or opcode outside the allow-list.
	ErrForbidden = errors.New("forbidden")
	// ErrLimit: a Limits bound was exceeded.
	ErrLimit = errors.New("limit exceeded")
	// ErrMalformed: the pickle is truncated, inconsistent or of an unsupported shape.
	ErrMalformed = errors.New("malformed")
	// ErrInvalidTensor: AppendEncode got a tensor it cannot encode.
	ErrInvalidTensor = errors.New("invalid tensor")
)

// Limits bounds the work and memory of Decode. A zero field takes its default.
// The defaults grow with the input, so any pickle torch writes for a list of
// tensors fits, while a hostile one costs at most a small multiple of its
// length in time and memory. Exceeding a limit is an ErrLimit error.
type Limits struct {
	MaxStack   int // stack and mark-stack entries (default 4096)
	MaxMemo    int // memo entries (default 65536)
	MaxDepth   int // nesting of tuples and dicts (default 32)
	MaxTensors int // tensors, storages and items of a list, per pickle (default 4096)
	// MaxCopyBytes bounds bytes allocated for copies: protocol-2 latin-1 bytes
	// and non-contiguous views made contiguous. Default 2×len(data), which every
	// pickle torch produces stays within (each tensor carries its own storage).
	MaxCopyBytes int64
	// MaxStorageHeader bounds the pickled header of one legacy storage
	// container (torch writes about 300 bytes). Default 64 KiB.
	MaxStorageHeader int
	// MaxWork bounds the decoder's steps, shared by the outer machine, the
	// storage containers' machines and tensor rebuilding: one per opcode, per
	// value copied or checked, per row and element of a strided copy, per byte
	// of text re-encoded. Default 8×len(data) + 65536; torch's pickles take
	// about one step per header byte.
	MaxWork int64
	// MaxItems bounds the values the decoder retains, in 16-byte slots: every
	// item of a tuple, list or dict, every memo entry, tensor dimension and
	// container object. The stack is bounded by MaxStack instead. Values of a
	// storage container's own pickles are released when it is read. Default
	// len(data)/16 + 16384: torch's pickles retain about 50 per tensor (their
	// memo keeps every tuple), so the default fits any message whose tensors
	// carry 400 bytes or more each, and up to about 300 tensors of any size.
	MaxItems int64
}

// Fixed bounds on shapes torch never exceeds for the tensors this package reads.
const (
	maxDims      = 64 // dimensions of one tensor
	maxDictItems = 64 // entries of one dict (torch's sys_info has 3)
)

// DefaultLimits returns the defaults used for zero fields (the ones that do
// not depend on the input length).
func DefaultLimits() Limits {
	return Limits{MaxStack: 4096, MaxMemo: 65536, MaxDepth: 32, MaxTensors: 4096, MaxStorageHeader: 64 << 10}
}

// Default per-input-byte budgets of Limits.MaxWork and Limits.MaxItems.
const (
	workPerByte  = 8
	workBase     = 1 << 16
	bytesPerItem = 16
	itemsBase    = 1 << 14
)

func (l Limits) resolve(inputLen int) Limits {
	d := DefaultLimits()
	if l.MaxStack <= 0 {
		l.MaxStack = d.MaxStack
	}
	if l.MaxMemo <= 0 {
		l.MaxMemo = d.MaxMemo
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = d.MaxDepth
	}
	if l.MaxTensors <= 0 {
		l.MaxTensors = d.MaxTensors
	}
	if l.MaxCopyBytes <= 0 {
		l.MaxCopyBytes = 2 * int64(inputLen)
	}
	if l.MaxStorageHeader <= 0 {
		l.MaxStorageHeader = d.MaxStorageHeader
	}
	if l.MaxWork <= 0 {
		l.MaxWork = workPerByte*int64(inputLen) + workBase
	}
	if l.MaxItems <= 0 {
		l.MaxItems = int64(inputLen)/bytesPerItem + itemsBase
	}
	return l
}

// dtypeInfo ties a torch dtype to its legacy storage class and element size.
type dtypeInfo struct {
	name    string
	storage string // class name in module torch; "" if torch has none (torch2.go)
	size    int
}

// dtypes is a read-only table.
var dtypes = [...]dtypeInfo{
	{"float16", "HalfStorage", 2},
	{"bfloat16", "BFloat16Storage", 2},
	{"float32", "FloatStorage", 4},
	{"float64", "DoubleStorage", 8},
	{"float8_e4m3fn", "", 1},
	{"float8_e5m2", "", 1},
	{"int8", "CharStorage", 1},
	{"uint8", "ByteStorage", 1},
	{"int16", "ShortStorage", 2},
	{"int32", "IntStorage", 4},
	{"int64", "LongStorage", 8},
	{"bool", "BoolStorage", 1},
}

func dtypeByName(name string) (*dtypeInfo, bool) {
	for i := range dtypes {
		if dtypes[i].name == name {
			return &dtypes[i], true
		}
	}
	return nil, false
}

func dtypeByStorage(class string) (*dtypeInfo, bool) {
	for i := range dtypes {
		if dtypes[i].storage == class && class != "" {
			return &dtypes[i], true
		}
	}
	return nil, false
}

// ElementSize returns the size in bytes of one element of dtype, or an error
// for a dtype this package does not handle.
func ElementSize(dtype string) (int, error) {
	d, ok := dtypeByName(dtype)
	if !ok {
		return 0, fmt.Errorf("torchpickle: dtype %q: %w (supported: %s)", dtype, ErrInvalidTensor, supportedDtypes())
	}
	return d.size, nil
}

func supportedDtypes() string {
	s := ""
	for i, d := range dtypes {
		if i > 0 {
			s += ", "
		}
		s += d.name
	}
	return s
}
