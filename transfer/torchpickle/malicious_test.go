package torchpickle

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// pb builds pickles opcode by opcode for hostile inputs.
type pb []byte

func (p pb) op(b ...byte) pb { return append(p, b...) }

func (p pb) uni(s string) pb {
	p = append(p, opBINUNICODE)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(s)))
	return append(p, s...)
}

func (p pb) short(s string) pb { return append(append(p, opSHORT_BINUNICODE, byte(len(s))), s...) }

func (p pb) global(mod, name string) pb {
	return append(append(p, opGLOBAL), mod+"\n"+name+"\n"...)
}

func (p pb) stackGlobal(mod, name string) pb {
	return p.short(mod).short(name).op(opSTACK_GLOBAL)
}

func (p pb) bytes(b []byte) pb {
	p = binary.LittleEndian.AppendUint32(append(p, opBINBYTES), uint32(len(b)))
	return append(p, b...)
}

// payloads are pickles that, loaded by Python, run a shell command touching
// marker. Each names the global that must appear in Decode's error.
func payloads(marker string) []struct {
	name, global string
	data         []byte
} {
	cmd := "touch " + marker
	evalSrc := "__import__('os').system('" + cmd + "')"
	// A storage container whose saved-object pickle calls os.system: torch's
	// own legacy loader would run it.
	inner := pb{}.op(opPROTO, 2, opLONG1, 10).op(legacyMagic[:]...).op(opSTOP).
		op(opPROTO, 2, opBININT2, 0xe9, 0x03, opSTOP).op([]byte(legacySysInfo)...).
		op(opPROTO, 2).global("os", "system").uni(cmd).op(opTUPLE1, opREDUCE, opSTOP)
	return []struct {
		name, global string
		data         []byte
	}{
		{"GLOBAL os.system", "os.system", pb{}.op(opPROTO, 2).global("os", "system").uni(cmd).op(opTUPLE1, opREDUCE, opSTOP)},
		{"GLOBAL posix.system", "posix.system", pb{}.op(opPROTO, 2).global("posix", "system").uni(cmd).op(opTUPLE1, opREDUCE, opSTOP)},
		{"GLOBAL __builtin__.eval", "__builtin__.eval", pb{}.op(opPROTO, 2).global("__builtin__", "eval").uni(evalSrc).op(opTUPLE1, opREDUCE, opSTOP)},
		{"STACK_GLOBAL os.system", "os.system", pb{}.op(opPROTO, 4).stackGlobal("os", "system").uni(cmd).op(opTUPLE1, opREDUCE, opSTOP)},
		{"STACK_GLOBAL posix.system", "posix.system", pb{}.op(opPROTO, 4).stackGlobal("posix", "system").uni(cmd).op(opTUPLE1, opREDUCE, opSTOP)},
		{"STACK_GLOBAL builtins.eval", "builtins.eval", pb{}.op(opPROTO, 4).stackGlobal("builtins", "eval").uni(evalSrc).op(opTUPLE1, opREDUCE, opSTOP)},
		{"inside a list of tensors", "builtins.eval", pb{}.op(opPROTO, 4, opEMPTY_LIST, opMARK).stackGlobal("builtins", "eval").uni(evalSrc).op(opTUPLE1, opREDUCE, opAPPENDS, opSTOP)},
		{"os.system inside a storage container", "os.system",
			pb{}.op(opPROTO, 4).stackGlobal("torch.storage", "_load_from_bytes").bytes(inner).op(opTUPLE1, opREDUCE, opSTOP)},
	}
}

func TestMaliciousGlobalsRejectedAndNotRun(t *testing.T) {
	dir := t.TempDir()
	for _, p := range payloads(filepath.Join(dir, "pwned")) {
		_, err := Decode(p.data, Limits{})
		if !errors.Is(err, ErrForbidden) {
			t.Errorf("%s: %v, want ErrForbidden", p.name, err)
			continue
		}
		if !strings.Contains(err.Error(), "global "+p.global+" ") {
			t.Errorf("%s: error %q does not name global %s", p.name, err, p.global)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "pwned")); !os.IsNotExist(err) {
		t.Fatalf("marker file exists after decoding hostile pickles (stat: %v)", err)
	}
}

// TestMaliciousPayloadsAreLive proves the payloads above are real: Python's
// pickle.loads (with torch for the nested container) runs each one.
func TestMaliciousPayloadsAreLive(t *testing.T) {
	dir := t.TempDir()
	n := len(payloads(""))
	for i := 0; i < n; i++ {
		p := payloads(filepath.Join(dir, "marker"+string(rune('a'+i))))[i]
		if err := os.WriteFile(filepath.Join(dir, "p"+string(rune('a'+i))+".pkl"), p.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	script := `
import glob, pickle, sys, torch
for f in sorted(glob.glob(sys.argv[1] + "/p*.pkl")):
    try:
        pickle.loads(open(f, "rb").read())
    except Exception:
        pass
`
	out, err := exec.Command(pythonPath, "-c", script, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	for i := 0; i < n; i++ {
		if _, err := os.Stat(filepath.Join(dir, "marker"+string(rune('a'+i)))); err != nil {
			t.Errorf("payload %q did not run under Python (%v): the rejection test would prove nothing", payloads("")[i].name, err)
		}
	}
}

func TestForbiddenOpcodes(t *testing.T) {
	cases := map[string][]byte{
		"INST":            pb{}.op(opPROTO, 2, opMARK, opINST).op([]byte("os\nsystem\n")...).op(opSTOP),
		"OBJ":             pb{}.op(opPROTO, 2, opMARK).global("collections", "OrderedDict").op(opOBJ, opSTOP),
		"BUILD":           pb{}.op(opPROTO, 2).global("collections", "OrderedDict").op(opEMPTY_TUPLE, opREDUCE, opEMPTY_DICT, opBUILD, opSTOP),
		"EXT1":            pb{}.op(opPROTO, 2, opEXT1, 1, opSTOP),
		"EXT2":            pb{}.op(opPROTO, 2, opEXT2, 1, 0, opSTOP),
		"EXT4":            pb{}.op(opPROTO, 2, opEXT4, 1, 0, 0, 0, opSTOP),
		"NEWOBJ":          pb{}.op(opPROTO, 2).global("collections", "OrderedDict").op(opEMPTY_TUPLE, opNEWOBJ, opSTOP),
		"PERSID":          pb{}.op(opPROTO, 2, opPERSID).op([]byte("x\n")...).op(opSTOP),
		"BINPERSID":       pb{}.op(opPROTO, 2).uni("x").op(opBINPERSID, opSTOP),
		"NEXT_BUFFER":     pb{}.op(opPROTO, 5, opNEXT_BUFFER, opSTOP),
		"READONLY_BUFFER": pb{}.op(opPROTO, 5).bytes([]byte("x")).op(opREADONLY_BUFFER, opSTOP),
		"BINFLOAT":        pb{}.op(opPROTO, 2, opBINFLOAT, 0, 0, 0, 0, 0, 0, 0, 0, opSTOP),
		"LONG4":           pb{}.op(opPROTO, 2, opLONG4, 1, 0, 0, 0, 1, opSTOP),
		"STRING":          pb{}.op(opPROTO, 2, opSTRING).op([]byte("'a'\n")...).op(opSTOP),
	}
	for name, data := range cases {
		_, err := Decode(data, Limits{})
		if !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want ErrForbidden naming %s", name, err, name)
		}
	}
}

func TestReduceOnlyAllowedCallables(t *testing.T) {
	// A storage class is allowed as a name inside a container but never callable.
	inner := pb{}.op(opPROTO, 2, opLONG1, 10).op(legacyMagic[:]...).op(opSTOP).
		op(opPROTO, 2, opBININT2, 0xe9, 0x03, opSTOP).op([]byte(legacySysInfo)...).
		op(opPROTO, 2).global("torch", "FloatStorage").op(opEMPTY_TUPLE, opREDUCE, opSTOP)
	data := pb{}.op(opPROTO, 4).stackGlobal("torch.storage", "_load_from_bytes").bytes(inner).op(opTUPLE1, opREDUCE, opSTOP)
	_, err := Decode(data, Limits{})
	if !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), "REDUCE on torch.FloatStorage") {
		t.Errorf("calling torch.FloatStorage: %v, want ErrForbidden naming it", err)
	}
	// The outer allowed globals are not allowed inside a container.
	inner2 := pb{}.op(opPROTO, 2).global("torch.storage", "_load_from_bytes").op(opSTOP)
	data = pb{}.op(opPROTO, 4).stackGlobal("torch.storage", "_load_from_bytes").bytes(inner2).op(opTUPLE1, opREDUCE, opSTOP)
	if _, err := Decode(data, Limits{}); !errors.Is(err, ErrForbidden) {
		t.Errorf("nested _load_from_bytes: %v, want ErrForbidden", err)
	}
	// Calling a non-callable (a str).
	data = pb{}.op(opPROTO, 4).short("x").op(opEMPTY_TUPLE, opREDUCE, opSTOP)
	if _, err := Decode(data, Limits{}); !errors.Is(err, ErrForbidden) {
		t.Errorf("REDUCE on str: %v, want ErrForbidden", err)
	}
}

func TestBombsHitLimits(t *testing.T) {
	deep := pb{}.op(opPROTO, 4, opEMPTY_TUPLE)
	for i := 0; i < 10000; i++ {
		deep = deep.op(opTUPLE1)
	}
	marks := pb{}.op(opPROTO, 4)
	for i := 0; i < 100000; i++ {
		marks = marks.op(opMARK)
	}
	nones := pb{}.op(opPROTO, 4)
	for i := 0; i < 100000; i++ {
		nones = nones.op(opNONE)
	}
	memo := pb{}.op(opPROTO, 4, opNONE)
	for i := 0; i < 100000; i++ {
		memo = binary.LittleEndian.AppendUint32(memo.op(opLONG_BINPUT), uint32(i*7919))
	}
	// Repeated latin-1 decoding of one memoized 1 MiB str: each call would allocate.
	big := strings.Repeat("a", 1<<20)
	latin := pb{}.op(opPROTO, 2).global("_codecs", "encode").op(opBINPUT, 0).uni(big).op(opBINPUT, 1, opPOP, opPOP)
	for i := 0; i < 1000; i++ {
		latin = latin.op(opBINGET, 0, opBINGET, 1).short("latin1").op(opTUPLE2, opREDUCE, opPOP)
	}
	// A list that contains itself (billion laughs through lists).
	laughs := pb{}.op(opPROTO, 4, opEMPTY_LIST, opMEMOIZE, opMARK, opBINGET, 0, opBINGET, 0, opAPPENDS, opSTOP)
	cases := []struct {
		name string
		data []byte
		want error
		msg  string
	}{
		{"nested tuples", deep, ErrLimit, "nesting deeper"},
		{"marks", marks, ErrLimit, "marks"},
		{"stack", nones, ErrLimit, "stack deeper"},
		{"memo", memo, ErrLimit, "memo"},
		{"latin-1 reduce bomb", latin, ErrLimit, "copy budget"},
		{"self-containing list", laughs, ErrMalformed, "list item 0 is list"},
		{"unset memo", pb{}.op(opPROTO, 4, opBINGET, 7, opSTOP), ErrMalformed, "memo index 7"},
		{"pop empty", pb{}.op(opPROTO, 4, opPOP, opSTOP), ErrMalformed, "without MARK"},
		{"mark then tuple1", pb{}.op(opPROTO, 4, opNONE, opMARK, opTUPLE1, opSTOP), ErrMalformed, "TUPLE1"},
		{"dict in itself", pb{}.op(opPROTO, 4, opEMPTY_DICT, opMEMOIZE).short("k").op(opBINGET, 0, opSETITEM, opSTOP), ErrMalformed, "itself"},
		{"huge BINBYTES8", binary.LittleEndian.AppendUint64(pb{}.op(opPROTO, 4, opBINBYTES8), 1<<60), ErrMalformed, "truncated"},
		{"huge BINUNICODE8", binary.LittleEndian.AppendUint64(pb{}.op(opPROTO, 4, opBINUNICODE8), 1<<63), ErrMalformed, "truncated"},
		{"huge FRAME", binary.LittleEndian.AppendUint64(pb{}.op(opPROTO, 4, opFRAME), 1<<62), ErrMalformed, "FRAME"},
		{"protocol 0", pb{}.op(opPROTO, 0, opNONE, opSTOP), ErrMalformed, "protocol 0"},
		{"no STOP", pb{}.op(opPROTO, 4, opEMPTY_LIST), ErrMalformed, "before STOP"},
		{"not a list", pb{}.op(opPROTO, 4, opNONE, opSTOP), ErrMalformed, "top-level object is None"},
	}
	for _, c := range cases {
		start := time.Now()
		_, err := Decode(c.data, Limits{})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %v mentioning %q", c.name, err, c.want, c.msg)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: took %v", c.name, d)
		}
	}
}

func TestSharedTupleDoublingIsCheap(t *testing.T) {
	// 2^60 leaves if expanded; the machine never walks values, so it is linear.
	p := pb{}.op(opPROTO, 4, opEMPTY_TUPLE)
	for i := 0; i < 60; i++ {
		p = p.op(opDUP, opTUPLE2)
	}
	start := time.Now()
	_, err := Decode(p.op(opSTOP), Limits{MaxDepth: 100})
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "top-level object is tuple") {
		t.Fatalf("%v, want a top-level type error", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}

// container builds a legacy storage container with the given declarations.
func container(class string, declared uint64, rawCount uint64, data []byte) []byte {
	p := pb{}.op(opPROTO, 2, opLONG1, 10).op(legacyMagic[:]...).op(opSTOP).
		op(opPROTO, 2, opBININT2, 0xe9, 0x03, opSTOP).op([]byte(legacySysInfo)...).
		op(opPROTO, 2, opMARK).uni("storage").global("torch", class).uni("k").uni("cpu")
	p = p.op(opLONG1, 8)
	p = binary.LittleEndian.AppendUint64(p, declared)
	p = p.op(opNONE, opTUPLE, opBINPERSID, opSTOP)
	p = p.op(opPROTO, 2, opEMPTY_LIST).uni("k").op(opAPPEND, opSTOP)
	p = binary.LittleEndian.AppendUint64(p, rawCount)
	return append(p, data...)
}

func tensorPickle(cont []byte, offset int64, size, stride []int64) []byte {
	return rebuildArgs("_rebuild_tensor_v2", cont, offset, size, stride).op(opTUPLE, opREDUCE, opAPPEND, opSTOP)
}

// rebuildArgs starts [torch._utils.<rebuild>(_load_from_bytes(cont), offset,
// size, stride, False, OrderedDict() at protocol 4: the arguments every
// tensor rebuild takes, before the version's own ones and the call.
func rebuildArgs(rebuild string, cont []byte, offset int64, size, stride []int64) pb {
	p := pb{}.op(opPROTO, 4, opEMPTY_LIST).stackGlobal("torch._utils", rebuild).op(opMARK).
		stackGlobal("torch.storage", "_load_from_bytes").bytes(cont).op(opTUPLE1, opREDUCE)
	p = appendInt(p, offset)
	p = p.op(opMARK)
	for _, s := range size {
		p = appendInt(p, s)
	}
	p = p.op(opTUPLE, opMARK)
	for _, s := range stride {
		p = appendInt(p, s)
	}
	return p.op(opTUPLE, opNEWFALSE).stackGlobal("collections", "OrderedDict").op(opEMPTY_TUPLE, opREDUCE)
}

func TestHugeDeclaredSizesRejectedWithoutAllocation(t *testing.T) {
	data := make([]byte, 64)
	ok := tensorPickle(container("FloatStorage", 16, 16, data), 0, []int64{4, 4}, []int64{4, 1})
	if ts, err := Decode(ok, Limits{}); err != nil || len(ts) != 1 {
		t.Fatalf("control pickle: %v", err)
	}
	cases := []struct {
		name string
		data []byte
		msg  string
	}{
		{"2^60 elements declared and counted", tensorPickle(container("FloatStorage", 1<<60, 1<<60, data), 0, []int64{4}, []int64{1}), "declares"},
		{"count differs from declaration", tensorPickle(container("FloatStorage", 16, 1<<60, data), 0, []int64{4}, []int64{1}), "declared"},
		{"declared overflow", tensorPickle(container("DoubleStorage", 1<<63-1, 1<<63-1, data), 0, []int64{4}, []int64{1}), "element count"},
		{"view beyond storage", tensorPickle(container("FloatStorage", 16, 16, data), 0, []int64{1 << 40}, []int64{1}), "reaches element"},
		{"offset beyond storage", tensorPickle(container("FloatStorage", 16, 16, data), 17, []int64{0}, []int64{1}), "storage offset"},
		{"size overflow", tensorPickle(container("FloatStorage", 16, 16, data), 0, []int64{1 << 40, 1 << 40}, []int64{0, 0}), "overflows"},
		{"expanded 4 TiB copy", tensorPickle(container("FloatStorage", 16, 16, data), 0, []int64{1 << 40}, []int64{0}), "copy budget"},
		{"stride mismatch dims", tensorPickle(container("FloatStorage", 16, 16, data), 0, []int64{4, 4}, []int64{1}), "dims"},
		{"trailing data", tensorPickle(container("FloatStorage", 16, 16, append(data, 1)), 0, []int64{4}, []int64{1}), "after the last storage"},
		{"unknown storage class", tensorPickle(container("ComplexFloatStorage", 8, 8, data), 0, []int64{4}, []int64{1}), "torch.ComplexFloatStorage"},
	}
	var before, after runtime.MemStats
	for _, c := range cases {
		runtime.ReadMemStats(&before)
		_, err := Decode(c.data, Limits{})
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want an error mentioning %q", c.name, err, c.msg)
		}
		if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
			t.Errorf("%s: allocated %d bytes", c.name, d)
		}
	}
}
