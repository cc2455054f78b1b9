package torchpickle

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// Values on the machine's stack. Only these types ever exist; nothing refers
// to Python objects or Go functions chosen by the input.
type (
	pyNone  struct{}
	str     []byte // a Python str, still UTF-8, usually a slice of the input
	pyBytes []byte // a Python bytes, usually a slice of the input
	bigInt  []byte // a LONG1 integer wider than 64 bits (little-endian two's complement)
	tuple   struct {
		items []any
		depth int
	}
	list struct{ items []any }
	dict struct {
		keys, vals []any
		depth      int
	}
	orderedDict struct{} // the empty OrderedDict torch passes as backward hooks
	global      int
	// storageClass is torch.<X>Storage, only meaningful inside a persistent id.
	storageClass struct{ dt *dtypeInfo }
	// storage is a typed storage: element type and its raw bytes.
	storage struct {
		dt   *dtypeInfo
		data []byte
	}
	tensorVal struct{ t Tensor }
)

// decodeState is shared by the outer machine and the machine that reads the
// nested storage containers, so limits hold for the whole input.
type decodeState struct {
	lim        Limits
	copyBudget int64
	work       int64 // steps taken, against lim.MaxWork
	items      int64 // 16-byte slots retained, against lim.MaxItems
	peakItems  int64
	tensors    int
	storages   int
	// containers maps a container's bytes (by identity) to its storage: a
	// memoised container loaded many times is read once.
	containers map[containerID]*storage
	inner      *machine // reads every storage container in turn
	emptyTuple *tuple   // shared: tuples are never changed once built
}

// containerID identifies a bytes value by its memory, not its content.
type containerID struct {
	p *byte
	n int
}

// usage reports what a decode spent, for tests.
type usage struct {
	work, maxWork   int64
	items, maxItems int64 // items: the peak retained
}

// charge spends n steps of the work budget.
func (s *decodeState) charge(n int64) error {
	s.work += n
	if s.work > s.lim.MaxWork {
		return fmt.Errorf("work budget of %d steps exhausted (Limits.MaxWork, %d per input byte by default): %w", s.lim.MaxWork, workPerByte, ErrLimit)
	}
	return nil
}

// retain counts n more retained 16-byte slots.
func (s *decodeState) retain(n int64, what string) error {
	s.items += n
	if s.items > s.lim.MaxItems {
		return fmt.Errorf("%s: more than %d values retained (Limits.MaxItems, one per %d input bytes by default): %w", what, s.lim.MaxItems, bytesPerItem, ErrLimit)
	}
	s.peakItems = max(s.peakItems, s.items)
	return nil
}

func (s *decodeState) spend(n int64, what string) error {
	if n < 0 || n > s.copyBudget {
		return fmt.Errorf("%s needs %d bytes, copy budget left %d (Limits.MaxCopyBytes): %w", what, n, s.copyBudget, ErrLimit)
	}
	s.copyBudget -= n
	return nil
}

// Decode reads a pickled list of CPU tensors. It accepts pickle protocols 2–5 as
// torch 1.13 (and later torch versions using the same reduction) writes them.
// Contiguous tensors alias data; non-contiguous views are copied. The result
// is never partially valid: on error it is nil.
func Decode(data []byte, limits Limits) ([]Tensor, error) {
	ts, _, err := decode(data, limits)
	return ts, err
}

func decode(data []byte, limits Limits) ([]Tensor, usage, error) {
	st := &decodeState{lim: limits.resolve(len(data)), emptyTuple: &tuple{depth: 1}}
	st.copyBudget = st.lim.MaxCopyBytes
	ts, err := st.decode(data)
	u := usage{work: st.work, maxWork: st.lim.MaxWork, items: st.peakItems, maxItems: st.lim.MaxItems}
	if err != nil {
		return nil, u, fmt.Errorf("torchpickle: %w", err)
	}
	return ts, u, nil
}

func (st *decodeState) decode(data []byte) ([]Tensor, error) {
	v, err := st.top(data)
	if err != nil {
		return nil, err
	}
	l, ok := v.(*list)
	if !ok {
		return nil, fmt.Errorf("top-level object is %s, want a list of tensors: %w", typeName(v), ErrMalformed)
	}
	out := make([]Tensor, len(l.items))
	for i, it := range l.items {
		tv, ok := it.(*tensorVal)
		if !ok {
			return nil, fmt.Errorf("list item %d is %s, want a tensor: %w", i, typeName(it), ErrMalformed)
		}
		out[i] = tv.t
	}
	return out, nil
}

// top runs the machine over the whole input and returns its one object.
func (st *decodeState) top(data []byte) (any, error) {
	m := newMachine(data, st, false)
	v, err := m.run()
	if err != nil {
		return nil, err
	}
	if m.pos != len(data) {
		return nil, fmt.Errorf("%d trailing bytes after STOP: %w", len(data)-m.pos, ErrMalformed)
	}
	return v, nil
}

// DecodeGroups reads the group-major pickle a hybrid model's worker sends:
// a list with one list per KV group, each item a tensor or the tagged pair
// ("tensor", tensor) that LMCache's multi-group serializer writes. Its
// other tag, ("fp8", numpy array, dtype), needs numpy's globals and is
// refused as forbidden, as is every other shape. Limits apply to the whole
// input; the result is never partially valid.
func DecodeGroups(data []byte, limits Limits) ([][]Tensor, error) {
	st := &decodeState{lim: limits.resolve(len(data)), emptyTuple: &tuple{depth: 1}}
	st.copyBudget = st.lim.MaxCopyBytes
	out, err := st.decodeGroups(data)
	if err != nil {
		return nil, fmt.Errorf("torchpickle: %w", err)
	}
	return out, nil
}

func (st *decodeState) decodeGroups(data []byte) ([][]Tensor, error) {
	v, err := st.top(data)
	if err != nil {
		return nil, err
	}
	outer, ok := v.(*list)
	if !ok {
		return nil, fmt.Errorf("top-level object is %s, want a list of groups: %w", typeName(v), ErrMalformed)
	}
	out := make([][]Tensor, len(outer.items))
	total := 0
	for g, it := range outer.items {
		inner, ok := it.(*list)
		if !ok {
			return nil, fmt.Errorf("group %d is %s, want a list of tensors: %w", g, typeName(it), ErrMalformed)
		}
		// Groups may all be one memoised list: the tensors are counted over
		// all of them, so the result is never larger than MaxTensors.
		if total += len(inner.items); total > st.lim.MaxTensors {
			return nil, fmt.Errorf("more than %d tensors over all groups (Limits.MaxTensors): %w", st.lim.MaxTensors, ErrLimit)
		}
		ts := make([]Tensor, len(inner.items))
		for i, item := range inner.items {
			t, err := groupItem(item)
			if err != nil {
				return nil, fmt.Errorf("group %d item %d: %w", g, i, err)
			}
			ts[i] = t
		}
		out[g] = ts
	}
	return out, nil
}

// groupItem unwraps one item of a group: a tensor or ("tensor", tensor).
func groupItem(v any) (Tensor, error) {
	if tv, ok := v.(*tensorVal); ok {
		return tv.t, nil
	}
	tp, ok := v.(*tuple)
	if !ok {
		return Tensor{}, fmt.Errorf("%s, want a tensor or a (\"tensor\", tensor) pair: %w", typeName(v), ErrMalformed)
	}
	if len(tp.items) >= 1 {
		if tag, ok := tp.items[0].(str); ok && string(tag) != "tensor" {
			return Tensor{}, fmt.Errorf("chunk tagged %q: only \"tensor\" is supported: %w", printable(string(tag)), ErrMalformed)
		}
	}
	if len(tp.items) != 2 {
		return Tensor{}, fmt.Errorf("tuple of %d items, want (\"tensor\", tensor): %w", len(tp.items), ErrMalformed)
	}
	tag, ok := tp.items[0].(str)
	tv, ok2 := tp.items[1].(*tensorVal)
	if !ok || string(tag) != "tensor" || !ok2 {
		return Tensor{}, fmt.Errorf("(%s, %s), want (\"tensor\", tensor): %w", typeName(tp.items[0]), typeName(tp.items[1]), ErrMalformed)
	}
	return tv.t, nil
}

type machine struct {
	data  []byte
	pos   int
	op    int // offset of the opcode being run, for errors
	st    *decodeState
	stack []any
	marks []int
	// High-water marks of stack and marks: growth is paid for once.
	stackPeak, marksPeak int
	// The memo: picklers number entries 0, 1, 2, … so they live in a slice
	// (a nil slot is unset); far-off indices go to a map.
	memo     []any
	sparse   map[uint32]any
	memoSize int // entries set, in both
	// inner: reading a legacy torch.save container (storage classes and
	// BINPERSID allowed, outer globals not).
	inner  bool
	persid func(any) (any, error)
}

func newMachine(data []byte, st *decodeState, inner bool) *machine {
	return &machine{data: data, st: st, inner: inner, stack: make([]any, 0, 16)}
}

// reset prepares the machine for the next pickle in data.
func (m *machine) reset(data []byte) {
	m.data, m.pos, m.op = data, 0, 0
	// A stack, mark stack or memo that grew large is dropped rather than
	// cleared and kept: one big container's pickle does not make every later
	// one pay for its size, and what the next pickle grows it pays for again.
	m.stackPeak, m.marksPeak = 0, 0
	if cap(m.stack) > 64 {
		m.stack = nil
	}
	if cap(m.marks) > 64 {
		m.marks = nil
	}
	m.stack = m.stack[:0]
	m.marks = m.marks[:0]
	if cap(m.memo) > 64 {
		m.memo = nil
	} else {
		clear(m.memo)
		m.memo = m.memo[:0]
	}
	m.sparse = nil
	m.memoSize = 0
}

func (m *machine) errf(kind error, format string, a ...any) error {
	return fmt.Errorf("offset %d: %s: %w", m.op, fmt.Sprintf(format, a...), kind)
}

// at adds the opcode offset to an error that already says what it is about.
func (m *machine) at(err error) error {
	return fmt.Errorf("offset %d: %w", m.op, err)
}

// wrap adds the opcode offset and context to an error that already carries its kind.
func (m *machine) wrap(err error, context string) error {
	return fmt.Errorf("offset %d: %s: %w", m.op, context, err)
}

func (m *machine) take(n uint64) ([]byte, error) {
	if n > uint64(len(m.data)-m.pos) {
		return nil, m.errf(ErrMalformed, "%s needs %d bytes, %d left (truncated input)", opName(m.data[m.op]), n, len(m.data)-m.pos)
	}
	b := m.data[m.pos : m.pos+int(n) : m.pos+int(n)]
	m.pos += int(n)
	return b, nil
}

func (m *machine) push(v any) error {
	if len(m.stack) >= m.st.lim.MaxStack {
		return m.errf(ErrLimit, "stack deeper than %d", m.st.lim.MaxStack)
	}
	if len(m.stack) == m.stackPeak {
		// A new slot, with its share of the slice's growth.
		if err := m.st.retain(2, "stack"); err != nil {
			return m.at(err)
		}
		m.stackPeak++
	}
	m.stack = append(m.stack, v)
	return nil
}

// pushBoxed pushes a value whose boxing allocates (a slice header, 24 bytes).
func (m *machine) pushBoxed(v any) error {
	if err := m.st.retain(2, "value"); err != nil {
		return m.at(err)
	}
	return m.push(v)
}

func (m *machine) pop() (any, error) {
	if len(m.stack) == 0 || (len(m.marks) > 0 && len(m.stack) <= m.marks[len(m.marks)-1]) {
		return nil, m.errf(ErrMalformed, "%s on empty stack", opName(m.data[m.op]))
	}
	v := m.stack[len(m.stack)-1]
	m.stack = m.stack[:len(m.stack)-1]
	return v, nil
}

func (m *machine) top() (any, error) {
	if len(m.stack) == 0 || (len(m.marks) > 0 && len(m.stack) <= m.marks[len(m.marks)-1]) {
		return nil, m.errf(ErrMalformed, "%s on empty stack", opName(m.data[m.op]))
	}
	return m.stack[len(m.stack)-1], nil
}

// popMark returns the items above the last mark (aliasing the stack; callers
// copy what they keep) and removes them and the mark.
func (m *machine) popMark() ([]any, error) {
	if len(m.marks) == 0 {
		return nil, m.errf(ErrMalformed, "%s without MARK", opName(m.data[m.op]))
	}
	k := m.marks[len(m.marks)-1]
	m.marks = m.marks[:len(m.marks)-1]
	items := m.stack[k:]
	m.stack = m.stack[:k]
	return items, nil
}

// Memo indices up to this far past the end of the dense memo extend it;
// the gap's slots are paid for like entries.
const memoGap = 64

func (m *machine) memoPut(idx uint32, v any) error {
	if int64(idx) < int64(len(m.memo)) && m.memo[idx] != nil {
		m.memo[idx] = v
		return nil
	}
	if _, ok := m.sparse[idx]; ok {
		m.sparse[idx] = v
		return nil
	}
	if m.memoSize >= m.st.lim.MaxMemo {
		return m.errf(ErrLimit, "memo larger than %d entries", m.st.lim.MaxMemo)
	}
	m.memoSize++
	if int64(idx) < int64(len(m.memo))+memoGap {
		// A slot and its share of the slice's growth: 2 per slot added.
		if n := int64(idx) + 1 - int64(len(m.memo)); n > 0 {
			if err := m.st.retain(2*n, "memo"); err != nil {
				return m.at(err)
			}
			m.memo = append(m.memo, make([]any, n)...)
		}
		m.memo[idx] = v
		return nil
	}
	// A map entry with its share of the table's growth: about 80 bytes.
	if err := m.st.retain(5, "memo"); err != nil {
		return m.at(err)
	}
	if m.sparse == nil {
		m.sparse = make(map[uint32]any)
	}
	m.sparse[idx] = v
	return nil
}

func (m *machine) memoGet(idx uint32) error {
	var v any
	if int64(idx) < int64(len(m.memo)) {
		v = m.memo[idx]
	}
	if v == nil {
		v = m.sparse[idx] // also a gap in the dense part set before the gap was
	}
	if v == nil {
		return m.errf(ErrMalformed, "memo index %d not set", idx)
	}
	return m.push(v)
}

func depthOf(v any) int {
	switch x := v.(type) {
	case *tuple:
		return x.depth
	case *dict:
		return x.depth
	}
	return 0
}

func (m *machine) newTuple(items []any) (*tuple, error) {
	if len(items) == 0 {
		return m.st.emptyTuple, nil
	}
	if err := m.st.charge(int64(len(items))); err != nil {
		return nil, m.at(err)
	}
	// The tuple header is 32 bytes (2 slots), then one slot per item.
	if err := m.st.retain(2+int64(len(items)), "tuple"); err != nil {
		return nil, m.at(err)
	}
	d := 0
	for _, it := range items {
		if dd := depthOf(it); dd > d {
			d = dd
		}
	}
	if d+1 > m.st.lim.MaxDepth {
		return nil, m.errf(ErrLimit, "nesting deeper than %d", m.st.lim.MaxDepth)
	}
	return &tuple{items: append([]any(nil), items...), depth: d + 1}, nil
}

// run executes opcodes until STOP and returns the top of the stack.
func (m *machine) run() (any, error) {
	for {
		if m.pos >= len(m.data) {
			return nil, fmt.Errorf("offset %d: input ended before STOP (truncated input): %w", m.pos, ErrMalformed)
		}
		m.op = m.pos
		code := m.data[m.pos]
		m.pos++
		if m.st.work++; m.st.work > m.st.lim.MaxWork {
			return nil, m.at(m.st.charge(0))
		}
		done, err := m.step(code)
		if err != nil {
			return nil, err
		}
		if done {
			if len(m.marks) != 0 || len(m.stack) != 1 {
				return nil, m.errf(ErrMalformed, "STOP with %d stack items and %d marks, want 1 and 0", len(m.stack), len(m.marks))
			}
			return m.stack[0], nil
		}
	}
}

func (m *machine) step(code byte) (bool, error) {
	switch code {
	case opPROTO:
		b, err := m.take(1)
		if err != nil {
			return false, err
		}
		if b[0] < 2 || b[0] > 5 {
			return false, m.errf(ErrMalformed, "pickle protocol %d not supported (2–5)", b[0])
		}
	case opFRAME:
		b, err := m.take(8)
		if err != nil {
			return false, err
		}
		// Frames only group opcodes for buffered readers; the whole input is in memory.
		if n := binary.LittleEndian.Uint64(b); n > uint64(len(m.data)-m.pos) {
			return false, m.errf(ErrMalformed, "FRAME of %d bytes, %d left (truncated input)", n, len(m.data)-m.pos)
		}
	case opSTOP:
		return true, nil
	case opMARK:
		if len(m.marks) >= m.st.lim.MaxStack {
			return false, m.errf(ErrLimit, "more than %d marks", m.st.lim.MaxStack)
		}
		if len(m.marks) == m.marksPeak {
			if err := m.st.retain(1, "marks"); err != nil {
				return false, m.at(err)
			}
			m.marksPeak++
		}
		m.marks = append(m.marks, len(m.stack))
	case opPOP:
		if len(m.stack) > 0 && (len(m.marks) == 0 || len(m.stack) > m.marks[len(m.marks)-1]) {
			_, err := m.pop()
			return false, err
		}
		// POP of an empty frame discards the mark, as CPython does.
		if _, err := m.popMark(); err != nil {
			return false, err
		}
	case opPOP_MARK:
		if _, err := m.popMark(); err != nil {
			return false, err
		}
	case opDUP:
		v, err := m.top()
		if err != nil {
			return false, err
		}
		return false, m.push(v)
	case opNONE:
		return false, m.push(pyNone{})
	case opNEWTRUE:
		return false, m.push(true)
	case opNEWFALSE:
		return false, m.push(false)
	case opBININT:
		b, err := m.take(4)
		if err != nil {
			return false, err
		}
		return false, m.push(int64(int32(binary.LittleEndian.Uint32(b))))
	case opBININT1:
		b, err := m.take(1)
		if err != nil {
			return false, err
		}
		return false, m.push(int64(b[0]))
	case opBININT2:
		b, err := m.take(2)
		if err != nil {
			return false, err
		}
		return false, m.push(int64(binary.LittleEndian.Uint16(b)))
	case opLONG1:
		nb, err := m.take(1)
		if err != nil {
			return false, err
		}
		b, err := m.take(uint64(nb[0]))
		if err != nil {
			return false, err
		}
		v := decodeLong(b)
		if _, ok := v.(bigInt); ok {
			return false, m.pushBoxed(v)
		}
		return false, m.push(v)
	case opSHORT_BINUNICODE, opBINUNICODE, opBINUNICODE8:
		b, err := m.takeSized(code)
		if err != nil {
			return false, err
		}
		return false, m.pushBoxed(str(b))
	case opSHORT_BINBYTES, opBINBYTES, opBINBYTES8:
		b, err := m.takeSized(code)
		if err != nil {
			return false, err
		}
		return false, m.pushBoxed(pyBytes(b))
	case opEMPTY_LIST:
		if err := m.st.retain(2, "list"); err != nil {
			return false, m.at(err)
		}
		return false, m.push(&list{})
	case opEMPTY_TUPLE:
		return false, m.push(m.st.emptyTuple)
	case opEMPTY_DICT:
		if err := m.st.retain(4, "dict"); err != nil {
			return false, m.at(err)
		}
		return false, m.push(&dict{depth: 1})
	case opTUPLE:
		items, err := m.popMark()
		if err != nil {
			return false, err
		}
		t, err := m.newTuple(items)
		if err != nil {
			return false, err
		}
		return false, m.push(t)
	case opTUPLE1, opTUPLE2, opTUPLE3:
		n := int(code-opTUPLE1) + 1
		if len(m.stack) < n || (len(m.marks) > 0 && len(m.stack)-n < m.marks[len(m.marks)-1]) {
			return false, m.errf(ErrMalformed, "%s needs %d stack items", opName(code), n)
		}
		t, err := m.newTuple(m.stack[len(m.stack)-n:])
		if err != nil {
			return false, err
		}
		m.stack = m.stack[:len(m.stack)-n]
		return false, m.push(t)
	case opAPPEND:
		v, err := m.pop()
		if err != nil {
			return false, err
		}
		one := [1]any{v}
		return false, m.appendTo(one[:])
	case opAPPENDS:
		items, err := m.popMark()
		if err != nil {
			return false, err
		}
		return false, m.appendTo(items)
	case opSETITEM:
		v, err := m.pop()
		if err != nil {
			return false, err
		}
		k, err := m.pop()
		if err != nil {
			return false, err
		}
		pair := [2]any{k, v}
		return false, m.setItems(pair[:])
	case opSETITEMS:
		items, err := m.popMark()
		if err != nil {
			return false, err
		}
		if len(items)%2 != 0 {
			return false, m.errf(ErrMalformed, "SETITEMS with an odd number of items")
		}
		return false, m.setItems(items)
	case opBINPUT:
		b, err := m.take(1)
		if err != nil {
			return false, err
		}
		v, err := m.top()
		if err != nil {
			return false, err
		}
		return false, m.memoPut(uint32(b[0]), v)
	case opLONG_BINPUT:
		b, err := m.take(4)
		if err != nil {
			return false, err
		}
		v, err := m.top()
		if err != nil {
			return false, err
		}
		return false, m.memoPut(binary.LittleEndian.Uint32(b), v)
	case opMEMOIZE:
		v, err := m.top()
		if err != nil {
			return false, err
		}
		return false, m.memoPut(uint32(m.memoSize), v)
	case opBINGET:
		b, err := m.take(1)
		if err != nil {
			return false, err
		}
		return false, m.memoGet(uint32(b[0]))
	case opLONG_BINGET:
		b, err := m.take(4)
		if err != nil {
			return false, err
		}
		return false, m.memoGet(binary.LittleEndian.Uint32(b))
	case opGLOBAL:
		mod, err := m.line()
		if err != nil {
			return false, err
		}
		name, err := m.line()
		if err != nil {
			return false, err
		}
		g, err := m.resolve(mod, name)
		if err != nil {
			return false, err
		}
		return false, m.push(g)
	case opSTACK_GLOBAL:
		nv, err := m.pop()
		if err != nil {
			return false, err
		}
		mv, err := m.pop()
		if err != nil {
			return false, err
		}
		name, ok1 := nv.(str)
		mod, ok2 := mv.(str)
		if !ok1 || !ok2 {
			return false, m.errf(ErrMalformed, "STACK_GLOBAL needs two str, got %s and %s", typeName(mv), typeName(nv))
		}
		g, err := m.resolve(mod, name)
		if err != nil {
			return false, err
		}
		return false, m.push(g)
	case opREDUCE:
		av, err := m.pop()
		if err != nil {
			return false, err
		}
		fv, err := m.pop()
		if err != nil {
			return false, err
		}
		args, ok := av.(*tuple)
		if !ok {
			return false, m.errf(ErrMalformed, "REDUCE arguments are %s, want a tuple", typeName(av))
		}
		r, err := m.call(fv, args.items)
		if err != nil {
			return false, err
		}
		return false, m.push(r)
	case opBINPERSID:
		if !m.inner || m.persid == nil {
			return false, m.errf(ErrForbidden, "opcode BINPERSID (0x51) not allowed here (persistent ids only occur inside a storage container)")
		}
		pid, err := m.pop()
		if err != nil {
			return false, err
		}
		v, err := m.persid(pid)
		if err != nil {
			return false, err
		}
		return false, m.push(v)
	default:
		return false, m.errf(ErrForbidden, "opcode %s (0x%02x) not allowed", opName(code), code)
	}
	return false, nil
}

func (m *machine) takeSized(code byte) ([]byte, error) {
	var n uint64
	switch code {
	case opSHORT_BINUNICODE, opSHORT_BINBYTES:
		b, err := m.take(1)
		if err != nil {
			return nil, err
		}
		n = uint64(b[0])
	case opBINUNICODE, opBINBYTES:
		b, err := m.take(4)
		if err != nil {
			return nil, err
		}
		n = uint64(binary.LittleEndian.Uint32(b))
	default:
		b, err := m.take(8)
		if err != nil {
			return nil, err
		}
		n = binary.LittleEndian.Uint64(b)
	}
	return m.take(n)
}

// line reads a newline-terminated GLOBAL argument.
func (m *machine) line() ([]byte, error) {
	for i := m.pos; i < len(m.data) && i-m.pos < 256; i++ {
		if m.data[i] == '\n' {
			b := m.data[m.pos:i]
			m.pos = i + 1
			return b, nil
		}
	}
	return nil, m.errf(ErrMalformed, "GLOBAL argument without newline within 256 bytes")
}

func (m *machine) appendTo(items []any) error {
	lv, err := m.top()
	if err != nil {
		return err
	}
	l, ok := lv.(*list)
	if !ok {
		return m.errf(ErrMalformed, "%s to %s, want a list", opName(m.data[m.op]), typeName(lv))
	}
	// The only lists are the tensors of a message, a hybrid model's groups
	// (lists of tensors or of ("tensor", tensor) pairs) and a container's
	// storage keys. Nothing walks a list's items recursively, so a list
	// that holds itself costs no more than any other.
	if len(items) > m.st.lim.MaxTensors-len(l.items) {
		return m.errf(ErrLimit, "list longer than %d items (Limits.MaxTensors)", m.st.lim.MaxTensors)
	}
	if err := m.st.charge(int64(len(items))); err != nil {
		return m.at(err)
	}
	if err := m.st.retain(int64(len(items)), "list"); err != nil {
		return m.at(err)
	}
	for _, it := range items {
		switch it.(type) {
		case *tensorVal, str, int64, *list, *tuple:
		default:
			return m.errf(ErrMalformed, "list item of type %s not supported", typeName(it))
		}
	}
	l.items = append(l.items, items...)
	return nil
}

func (m *machine) setItems(items []any) error {
	dv, err := m.top()
	if err != nil {
		return err
	}
	d, ok := dv.(*dict)
	if !ok {
		return m.errf(ErrMalformed, "%s on %s, want a dict", opName(m.data[m.op]), typeName(dv))
	}
	// torch only pickles small dicts here (sys_info, empty metadata).
	if len(items)/2 > maxDictItems-len(d.keys) {
		return m.errf(ErrLimit, "dict with more than %d entries", maxDictItems)
	}
	if err := m.st.charge(int64(len(items))); err != nil {
		return m.at(err)
	}
	if err := m.st.retain(int64(len(items)), "dict"); err != nil {
		return m.at(err)
	}
	for i := 0; i < len(items); i += 2 {
		k, v := items[i], items[i+1]
		switch k.(type) {
		case str, int64:
		default:
			return m.errf(ErrMalformed, "dict key of type %s not supported", typeName(k))
		}
		switch x := v.(type) {
		case str, int64, bool, pyNone:
		case *dict:
			if x == d {
				return m.errf(ErrMalformed, "dict containing itself")
			}
			if x.depth+1 > m.st.lim.MaxDepth {
				return m.errf(ErrLimit, "nesting deeper than %d", m.st.lim.MaxDepth)
			}
			d.depth = max(d.depth, x.depth+1)
		default:
			return m.errf(ErrMalformed, "dict value of type %s not supported", typeName(v))
		}
		d.keys = append(d.keys, k)
		d.vals = append(d.vals, v)
	}
	return nil
}

// decodeLong turns LONG1 bytes into int64 when it fits, else bigInt.
func decodeLong(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	if len(b) > 8 {
		return bigInt(b)
	}
	var u uint64
	for i := len(b) - 1; i >= 0; i-- {
		u = u<<8 | uint64(b[i])
	}
	if shift := 64 - 8*uint(len(b)); shift > 0 {
		return int64(u<<shift) >> shift
	}
	return int64(u)
}

func typeName(v any) string {
	switch x := v.(type) {
	case nil:
		return "nothing"
	case pyNone:
		return "None"
	case bool:
		return "bool"
	case int64, bigInt:
		return "int"
	case str:
		return "str"
	case pyBytes:
		return "bytes"
	case *tuple:
		return "tuple"
	case *list:
		return "list"
	case *dict:
		return "dict"
	case orderedDict:
		return "OrderedDict"
	case global:
		return x.String()
	case storageClass:
		return "torch." + x.dt.storage
	case dtypeVal:
		return "torch." + x.dt.name
	case *storage:
		return "storage"
	case *tensorVal:
		return "tensor"
	case *storageRef:
		return "storage reference"
	}
	return fmt.Sprintf("%T", v)
}

// printable keeps error messages readable when names carry control bytes.
func printable(s string) string {
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return fmt.Sprintf("%q", s)
		}
	}
	return s
}
