package torchpickle

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
)

// The encoder writes what torch's pickle.dumps writes for a list of
// contiguous CPU tensors, at protocol 4: per tensor
//
//	_rebuild_tensor_v2(_load_from_bytes(<legacy container>), 0, shape, stride, False, OrderedDict())
//
// or, for the dtypes torch 2.x has no typed storage for (float8), the
// _rebuild_tensor_v3 form described in torch2.go. Each global is memoized
// where it is first written and fetched with BINGET afterwards. Small opcodes
// are grouped in FRAMEs; each container travels outside any frame, as
// CPython's pickler does for large bytes.

// Memo slots of the globals the encoder writes; a dtype global's slot is
// slotDtype0 plus the dtype's index in the dtypes table.
const (
	slotRebuildV2 = iota
	slotRebuildV3
	slotLoad
	slotOD
	slotDtype0
)

// memoSlots hands out memo indices in order of first use. The size pass and
// the writing pass each walk the tensors with their own memoSlots, so both
// see the same first uses.
type memoSlots struct {
	idx  [slotDtype0 + len(dtypes)]int16 // memo index + 1; 0: not written yet
	next int16
}

// use returns the memo index of slot and whether this is its first use (the
// global must then be written in full and memoized).
func (ms *memoSlots) use(slot int) (byte, bool) {
	if i := ms.idx[slot]; i != 0 {
		return byte(i - 1), false
	}
	ms.next++
	ms.idx[slot] = ms.next
	return byte(ms.next - 1), true
}

// legacySysInfo is torch's sys_info pickle, byte for byte as torch 1.13 writes it.
const legacySysInfo = "\x80\x02}q\x00(X\x10\x00\x00\x00protocol_versionq\x01M\xe9\x03" +
	"X\r\x00\x00\x00little_endianq\x02\x88X\n\x00\x00\x00type_sizesq\x03}q\x04(" +
	"X\x05\x00\x00\x00shortq\x05K\x02X\x03\x00\x00\x00intq\x06K\x04X\x04\x00\x00\x00longq\x07K\x04uu."

// legacyKey names the single storage inside each container.
const legacyKey = "0"

const (
	strRebuildMod  = "torch._utils"
	strRebuildName = "_rebuild_tensor_v2"
	strLoadMod     = "torch.storage"
	strLoadName    = "_load_from_bytes"
	strODMod       = "collections"
	strODName      = "OrderedDict"
)

// appendsBatch is how many tensors one APPENDS adds, as CPython's pickler
// batches them: the unpickler's stack holds one batch, not the whole list.
const appendsBatch = 1000

// EncodedSize returns the exact number of bytes AppendEncode appends for ts,
// so callers can allocate once. It returns -1 if ts cannot be encoded.
func EncodedSize(ts []Tensor) int {
	n, err := encodedSize([][]Tensor{ts}, false)
	if err != nil {
		return -1
	}
	return n
}

// EncodedGroupsSize is EncodedSize for AppendEncodeGroups.
func EncodedGroupsSize(groups [][]Tensor) int {
	n, err := encodedSize(groups, true)
	if err != nil {
		return -1
	}
	return n
}

// Shaped describes count tensors of one dtype and shape, without their
// data, for sizing a pickle before the tensors are at hand.
type Shaped struct {
	Count int
	Dtype string
	Shape []int
}

// ShapedSize is EncodedSize of the tensors gs describe, in order, as one
// list (groups false) or EncodedGroupsSize of one group per element of gs
// (groups true); -1 when they cannot be encoded.
func ShapedSize(gs []Shaped, groups bool) int {
	n, err := sizeOf(len(gs), groups, func(g int) int { return gs[g].Count }, func(g, _ int) (string, []int, int, bool) {
		return gs[g].Dtype, gs[g].Shape, 0, false
	})
	if err != nil {
		return -1
	}
	return n
}

// encodedSize sizes the pickle of groups: nested, a list of lists; else
// groups[0] as one list.
func encodedSize(groups [][]Tensor, nested bool) (int, error) {
	return sizeOf(len(groups), nested, func(g int) int { return len(groups[g]) }, func(g, i int) (string, []int, int, bool) {
		t := &groups[g][i]
		return t.Dtype, t.Shape, len(t.Data), true
	})
}

// sizeOf sizes the pickle of n groups (nested: a list of lists; else one
// list of every group's tensors), count(g) tensors in group g, each one
// described by tensor(g, i): its dtype, shape and, when hasData, its data
// length (checked against the shape; else taken from it).
func sizeOf(n int, nested bool, count func(g int) int, tensor func(g, i int) (dtype string, shape []int, dataLen int, hasData bool)) (int, error) {
	if nested && n > appendsBatch {
		return 0, fmt.Errorf("%d groups: at most %d: %w", n, appendsBatch, ErrInvalidTensor)
	}
	total := 2 + frameHdr + 1 // PROTO, first FRAME, EMPTY_LIST
	var ms memoSlots
	i0 := 0
	if nested {
		if n > 0 {
			total += 2 // MARK ... APPENDS
		}
		total += n // an EMPTY_LIST per group
	}
	// Not nested, the groups' tensors are one list: its APPENDS batches
	// run across them.
	lists := n
	if !nested {
		lists = min(n, 1)
	}
	all := 0
	for g := range n {
		all += count(g)
	}
	for l := range lists {
		c := all
		if nested {
			c = count(l)
		}
		if c > 0 {
			total++                               // MARK (for APPENDS)
			total += 2 * ((c - 1) / appendsBatch) // APPENDS, MARK between batches
			total++                               // APPENDS
		}
	}
	for g := range n {
		c := count(g)
		for i := range c {
			dtype, shape, dataLen, hasData := tensor(g, i)
			dt, numel, err := checkMeta(dtype, shape, dataLen, hasData, i0+i)
			if err != nil {
				return 0, err
			}
			if !hasData {
				dataLen = numel * dt.size
			}
			one := segA(&ms, dt) + segB(&ms, shape, dt)
			cs := containerSize(dt, numel, dataLen)
			one += bytesHdr(cs) + cs + frameHdr // the frame that follows this container
			total += one
			if !hasData && i == 1 {
				// Described tensors of a group are alike, and from the
				// second on every global they name is memoised: each
				// costs what the second did. (A count comes from a
				// peer's key: sizing it must not take a step a tensor.)
				total += (c - 2) * one
				break
			}
		}
		i0 += c
	}
	return total + 1, nil // STOP
}

// AppendEncode appends a pickle of ts to dst and returns the extended slice.
// Every tensor must hold len(Data) == prod(Shape) × element size.
func AppendEncode(dst []byte, ts []Tensor) ([]byte, error) {
	return appendEncode(dst, [][]Tensor{ts}, false)
}

// AppendEncodeGroups appends a pickle of a list of lists of tensors, one
// list per KV group: what a hybrid model's worker unpickles as its groups'
// chunks (plain tensors, which LMCache's multi-group deserializer takes as
// they are).
func AppendEncodeGroups(dst []byte, groups [][]Tensor) ([]byte, error) {
	return appendEncode(dst, groups, true)
}

func appendEncode(dst []byte, groups [][]Tensor, nested bool) ([]byte, error) {
	size, err := encodedSize(groups, nested)
	if err != nil {
		return dst, fmt.Errorf("torchpickle: encode: %w", err)
	}
	start := len(dst)
	if cap(dst)-len(dst) < size {
		nd := make([]byte, len(dst), len(dst)+size)
		copy(nd, dst)
		dst = nd
	}
	dst = append(dst, opPROTO, 4)
	frame := len(dst)
	dst = openFrame(dst)
	dst = append(dst, opEMPTY_LIST)
	if nested && len(groups) > 0 {
		dst = append(dst, opMARK)
	}
	var ms memoSlots
	for _, ts := range groups {
		if nested {
			dst = append(dst, opEMPTY_LIST)
		}
		dst, frame = appendTensors(dst, frame, &ms, ts)
	}
	if nested && len(groups) > 0 {
		dst = append(dst, opAPPENDS)
	}
	dst = append(dst, opSTOP)
	closeFrame(dst, frame)
	if len(dst)-start != size {
		return dst, fmt.Errorf("torchpickle: encode: wrote %d bytes, computed %d", len(dst)-start, size)
	}
	return dst, nil
}

// appendTensors appends the items of the list on top of the stack (MARK,
// the tensors, APPENDS, in batches) inside the frame opened at frame, and
// returns the extended slice and the frame open at its end. The tensors
// must have passed checkTensor.
func appendTensors(dst []byte, frame int, ms *memoSlots, ts []Tensor) ([]byte, int) {
	if len(ts) == 0 {
		return dst, frame
	}
	dst = append(dst, opMARK)
	for i := range ts {
		t := &ts[i]
		dt, _ := dtypeByName(t.Dtype)
		numel := len(t.Data) / dt.size
		// Segment A: rebuild callable, MARK for its argument tuple, loader callable.
		dst = appendGlobal(dst, ms, rebuildSlot(dt))
		dst = append(dst, opMARK)
		dst = appendGlobal(dst, ms, globalRef{slotLoad, strLoadMod, strLoadName})
		closeFrame(dst, frame)
		// The container, unframed.
		c := containerSize(dt, numel, len(t.Data))
		dst = appendBytesHdr(dst, c)
		dst = appendContainer(dst, dt, numel, t.Data)
		frame = len(dst)
		dst = openFrame(dst)
		// Segment B: finish the storage call and the tensor's argument tuple.
		dst = append(dst, opTUPLE1, opREDUCE)
		dst = appendInt(dst, 0) // storage_offset
		dst = append(dst, opMARK)
		for _, d := range t.Shape {
			dst = appendInt(dst, int64(d))
		}
		dst = append(dst, opTUPLE, opMARK)
		for j := range t.Shape {
			dst = appendInt(dst, rowMajorStride(t.Shape, j))
		}
		dst = append(dst, opTUPLE, opNEWFALSE)
		dst = appendGlobal(dst, ms, globalRef{slotOD, strODMod, strODName})
		dst = append(dst, opEMPTY_TUPLE, opREDUCE)
		if untypedInTorch(dt) {
			dst = appendGlobal(dst, ms, dtypeSlot(dt))
		}
		dst = append(dst, opTUPLE, opREDUCE)
		if (i+1)%appendsBatch == 0 && i+1 < len(ts) {
			dst = append(dst, opAPPENDS, opMARK)
		}
	}
	return append(dst, opAPPENDS), frame
}

func checkTensor(t *Tensor, i int) (*dtypeInfo, int, error) {
	return checkMeta(t.Dtype, t.Shape, len(t.Data), true, i)
}

// checkMeta is checkTensor of a tensor described by its dtype, shape and
// (when hasData) its data length.
func checkMeta(dtype string, shape []int, dataLen int, hasData bool, i int) (*dtypeInfo, int, error) {
	dt, ok := dtypeByName(dtype)
	if !ok {
		return nil, 0, fmt.Errorf("tensor %d: dtype %q not supported (%s): %w", i, dtype, supportedDtypes(), ErrInvalidTensor)
	}
	numel := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return nil, 0, fmt.Errorf("tensor %d: negative dimension in shape %v: %w", i, shape, ErrInvalidTensor)
		}
		hi, lo := bits.Mul64(numel, uint64(d))
		if hi != 0 || lo > math.MaxInt64/8 {
			return nil, 0, fmt.Errorf("tensor %d: shape %v too large: %w", i, shape, ErrInvalidTensor)
		}
		numel = lo
	}
	if hasData && uint64(dataLen) != numel*uint64(dt.size) {
		return nil, 0, fmt.Errorf("tensor %d: %d data bytes, shape %v of %s needs %d: %w", i, dataLen, shape, dtype, numel*uint64(dt.size), ErrInvalidTensor)
	}
	return dt, int(numel), nil
}

const frameHdr = 9

func openFrame(dst []byte) []byte {
	return append(dst, opFRAME, 0, 0, 0, 0, 0, 0, 0, 0)
}

// closeFrame writes the length of the frame opened at off.
func closeFrame(dst []byte, off int) {
	binary.LittleEndian.PutUint64(dst[off+1:], uint64(len(dst)-off-frameHdr))
}

// globalRef is a global the encoder writes and its memo slot.
type globalRef struct {
	slot      int
	mod, name string
}

func rebuildSlot(dt *dtypeInfo) globalRef {
	if untypedInTorch(dt) {
		return globalRef{slotRebuildV3, strRebuildMod, strRebuildV3Name}
	}
	return globalRef{slotRebuildV2, strRebuildMod, strRebuildName}
}

func dtypeSlot(dt *dtypeInfo) globalRef {
	i := 0
	for i < len(dtypes) && &dtypes[i] != dt {
		i++
	}
	return globalRef{slotDtype0 + i, strDtypeMod, dt.name}
}

func globalSize(ms *memoSlots, g globalRef) int {
	if _, first := ms.use(g.slot); first {
		return 2 + len(g.mod) + 2 + len(g.name) + 1 + 1 // two strings, STACK_GLOBAL, MEMOIZE
	}
	return 2 // BINGET idx
}

func appendGlobal(dst []byte, ms *memoSlots, g globalRef) []byte {
	idx, first := ms.use(g.slot)
	if !first {
		return append(dst, opBINGET, idx)
	}
	dst = append(dst, opSHORT_BINUNICODE, byte(len(g.mod)))
	dst = append(dst, g.mod...)
	dst = append(dst, opSHORT_BINUNICODE, byte(len(g.name)))
	dst = append(dst, g.name...)
	return append(dst, opSTACK_GLOBAL, opMEMOIZE)
}

func segA(ms *memoSlots, dt *dtypeInfo) int {
	return globalSize(ms, rebuildSlot(dt)) + 1 + globalSize(ms, globalRef{slotLoad, strLoadMod, strLoadName})
}

func segB(ms *memoSlots, shape []int, dt *dtypeInfo) int {
	n := 2 + intSize(0) + 1 // TUPLE1 REDUCE, offset, MARK
	for _, d := range shape {
		n += intSize(int64(d))
	}
	n += 2 // TUPLE MARK
	for j := range shape {
		n += intSize(rowMajorStride(shape, j))
	}
	n += 2 // TUPLE NEWFALSE
	n += globalSize(ms, globalRef{slotOD, strODMod, strODName})
	if untypedInTorch(dt) {
		n += globalSize(ms, dtypeSlot(dt))
	}
	return n + 4 // EMPTY_TUPLE REDUCE TUPLE REDUCE
}

func bytesHdr(n int) int {
	if uint64(n) > math.MaxUint32 {
		return 9
	}
	return 5
}

func appendBytesHdr(dst []byte, n int) []byte {
	if uint64(n) > math.MaxUint32 {
		dst = append(dst, opBINBYTES8)
		return binary.LittleEndian.AppendUint64(dst, uint64(n))
	}
	dst = append(dst, opBINBYTES)
	return binary.LittleEndian.AppendUint32(dst, uint32(n))
}

// intSize and appendInt pick the opcode CPython picks for a non-negative int.
func intSize(v int64) int {
	switch {
	case v >= 0 && v < 1<<8:
		return 2
	case v >= 0 && v < 1<<16:
		return 3
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return 5
	}
	return 2 + len(longBytes(v))
}

func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0 && v < 1<<8:
		return append(dst, opBININT1, byte(v))
	case v >= 0 && v < 1<<16:
		return append(dst, opBININT2, byte(v), byte(v>>8))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		return binary.LittleEndian.AppendUint32(append(dst, opBININT), uint32(int32(v)))
	}
	b := longBytes(v)
	dst = append(dst, opLONG1, byte(len(b)))
	return append(dst, b...)
}

// longBytes is the minimal little-endian two's-complement form (pickle's encode_long).
func longBytes(v int64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(v))
	n := 8
	for n > 1 {
		top, next := b[n-1], b[n-2]
		if (top == 0 && next&0x80 == 0) || (top == 0xff && next&0x80 != 0) {
			n--
			continue
		}
		break
	}
	return b[:n]
}

// Legacy container pieces (protocol 2, as torch.save writes them).

// storageClassOf is the storage class the container names for dt and the
// element count it declares: float8 data travels as a ByteStorage counted in
// bytes, the form torch 2.x loads (torch2.go).
func storageClassOf(dt *dtypeInfo, numel int) (mod, name string, count int) {
	if untypedInTorch(dt) {
		return "torch", "ByteStorage", numel * dt.size
	}
	return "torch", dt.storage, numel
}

func objPickleSize(dt *dtypeInfo, numel int) int {
	// PROTO MARK X"storage"q0 c"<mod>\n<cls>\n"q1 X<key>q2 X"cpu"q3 <numel> N t q4 Q .
	mod, cls, count := storageClassOf(dt, numel)
	return 2 + 1 + (5 + 7 + 2) + (1 + len(mod) + 1 + len(cls) + 1 + 2) + (5 + len(legacyKey) + 2) + (5 + 3 + 2) +
		intSize(int64(count)) + 1 + 1 + 2 + 1 + 1
}

func keysPickleSize() int {
	// PROTO ] q0 X<key> q1 a .
	return 2 + 1 + 2 + 5 + len(legacyKey) + 2 + 1 + 1
}

const magicPickleSize = 2 + 2 + 10 + 1
const versionPickleSize = 2 + 3 + 1

func containerSize(dt *dtypeInfo, numel, dataLen int) int {
	return magicPickleSize + versionPickleSize + len(legacySysInfo) + objPickleSize(dt, numel) + keysPickleSize() + 8 + dataLen
}

func appendBinunicode(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint32(append(dst, opBINUNICODE), uint32(len(s)))
	return append(dst, s...)
}

func appendContainer(dst []byte, dt *dtypeInfo, numel int, data []byte) []byte {
	dst = append(dst, opPROTO, 2, opLONG1, 10)
	dst = append(dst, legacyMagic[:]...)
	dst = append(dst, opSTOP, opPROTO, 2, opBININT2, byte(legacyProtocolVersion&0xff), byte(legacyProtocolVersion>>8), opSTOP)
	dst = append(dst, legacySysInfo...)
	mod, cls, count := storageClassOf(dt, numel)
	dst = append(dst, opPROTO, 2, opMARK)
	dst = append(appendBinunicode(dst, "storage"), opBINPUT, 0, opGLOBAL)
	dst = append(dst, mod...)
	dst = append(dst, '\n')
	dst = append(dst, cls...)
	dst = append(dst, '\n', opBINPUT, 1)
	dst = append(appendBinunicode(dst, legacyKey), opBINPUT, 2)
	dst = append(appendBinunicode(dst, "cpu"), opBINPUT, 3)
	dst = appendInt(dst, int64(count))
	dst = append(dst, opNONE, opTUPLE, opBINPUT, 4, opBINPERSID, opSTOP)
	dst = append(dst, opPROTO, 2, opEMPTY_LIST, opBINPUT, 0)
	dst = append(appendBinunicode(dst, legacyKey), opBINPUT, 1, opAPPEND, opSTOP)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(count))
	return append(dst, data...)
}

// rowMajorStride is the contiguous stride of dimension j.
func rowMajorStride(shape []int, j int) int64 {
	s := int64(1)
	for _, d := range shape[j+1:] {
		s *= int64(d)
	}
	return s
}
