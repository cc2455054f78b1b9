package torchpickle

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
)

// torch.save's legacy (non-zip) container, as torch.storage._load_from_bytes
// reads it: five protocol-2 pickles — magic number, protocol version, sys_info,
// the saved object (here one storage, as a persistent id), the list of storage
// keys — then, per key, an int64 element count and the raw elements.

// legacyMagic is the LONG1 payload of torch's MAGIC_NUMBER 0x1950a86a20f9469cfc6c.
var legacyMagic = [10]byte{0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19}

const legacyProtocolVersion = 1001

// storageRef is a storage announced by a persistent id, filled by the raw section.
type storageRef struct {
	dt     *dtypeInfo
	numel  int64
	key    string
	filled bool
	s      *storage
}

// loadContainer returns the storage of a torch.save container. The same
// bytes object (a memoised container) yields the same storage and is read
// once, so a small pickle cannot make the decoder read a container again and
// again; distinct containers each occupy their own input bytes.
func (st *decodeState) loadContainer(b []byte) (*storage, error) {
	var id containerID
	if len(b) > 0 {
		id = containerID{&b[0], len(b)}
		if s, ok := st.containers[id]; ok {
			return s, nil
		}
	}
	if st.storages >= st.lim.MaxTensors {
		return nil, fmt.Errorf("more than %d storages: %w", st.lim.MaxTensors, ErrLimit)
	}
	st.storages++
	// What the container's own pickles retain is garbage once it is read.
	held := st.items
	s, err := loadLegacy(b, st)
	if err != nil {
		return nil, err
	}
	st.items = held
	// The storage and the map entry naming it: 4 slots.
	if err := st.retain(4, "storage"); err != nil {
		return nil, err
	}
	if len(b) > 0 {
		if st.containers == nil {
			st.containers = make(map[containerID]*storage)
		}
		st.containers[id] = s
	}
	return s, nil
}

func loadLegacy(b []byte, st *decodeState) (*storage, error) {
	hdr := b
	if len(hdr) > st.lim.MaxStorageHeader {
		hdr = hdr[:st.lim.MaxStorageHeader]
	}
	pos := 0
	if st.inner == nil {
		st.inner = newMachine(nil, st, true) // reused for every pickle of every container
	}
	m := st.inner
	next := func(what string, persid func(any) (any, error)) (any, error) {
		m.reset(hdr[pos:])
		m.persid = persid
		v, err := m.run()
		if err != nil {
			if len(hdr) < len(b) && m.pos >= len(hdr[pos:]) {
				return nil, fmt.Errorf("%s: header longer than %d bytes: %w", what, st.lim.MaxStorageHeader, ErrLimit)
			}
			return nil, fmt.Errorf("%s at byte %d: %w", what, pos, err)
		}
		pos += m.pos
		return v, nil
	}

	v, err := next("magic number", nil)
	if err != nil {
		return nil, err
	}
	if mb, ok := v.(bigInt); !ok || !bytes.Equal(mb, legacyMagic[:]) {
		return nil, fmt.Errorf("not a torch.save legacy container (bad magic number): %w", ErrMalformed)
	}
	if v, err = next("protocol version", nil); err != nil {
		return nil, err
	}
	if pv, ok := v.(int64); !ok || pv != legacyProtocolVersion {
		return nil, fmt.Errorf("torch.save protocol version %v, want %d: %w", v, legacyProtocolVersion, ErrMalformed)
	}
	if v, err = next("sys_info", nil); err != nil {
		return nil, err
	}
	if err := checkSysInfo(v); err != nil {
		return nil, err
	}

	refs := make(map[string]*storageRef)
	persid := func(pid any) (any, error) {
		dt, key, numel, err := storagePID(pid)
		if err != nil {
			return nil, err
		}
		if o, ok := refs[string(key)]; ok {
			if o.dt != dt || o.numel != numel {
				return nil, fmt.Errorf("storage key %q declared twice with different types: %w", printable(o.key), ErrMalformed)
			}
			return o, nil
		}
		if len(refs) >= st.lim.MaxTensors {
			return nil, fmt.Errorf("more than %d storages: %w", st.lim.MaxTensors, ErrLimit)
		}
		// The reference, its key and its map entry.
		if err := st.retain(6+int64(len(key))/bytesPerItem, "storage reference"); err != nil {
			return nil, err
		}
		r := &storageRef{dt: dt, numel: numel, key: string(key)}
		refs[r.key] = r
		return r, nil
	}
	if v, err = next("saved object", persid); err != nil {
		return nil, err
	}
	root, ok := v.(*storageRef)
	if !ok {
		return nil, fmt.Errorf("saved object is %s, want a storage: %w", typeName(v), ErrMalformed)
	}
	if v, err = next("storage keys", nil); err != nil {
		return nil, err
	}
	keys, ok := v.(*list)
	if !ok {
		return nil, fmt.Errorf("storage keys are %s, want a list: %w", typeName(v), ErrMalformed)
	}

	for _, kv := range keys.items {
		k, ok := kv.(str)
		if !ok {
			return nil, fmt.Errorf("storage key is %s, want str: %w", typeName(kv), ErrMalformed)
		}
		r := refs[string(k)]
		if r == nil || r.filled {
			return nil, fmt.Errorf("storage key %q unknown or repeated: %w", printable(string(k)), ErrMalformed)
		}
		if len(b)-pos < 8 {
			return nil, fmt.Errorf("storage %q: element count truncated: %w", printable(r.key), ErrMalformed)
		}
		n := binary.LittleEndian.Uint64(b[pos:])
		pos += 8
		if n != uint64(r.numel) {
			return nil, fmt.Errorf("storage %q: %d elements in data, %d declared: %w", printable(r.key), n, r.numel, ErrMalformed)
		}
		// Checked against the bytes present before slicing; nothing is allocated.
		if n > uint64(len(b)-pos)/uint64(r.dt.size) {
			return nil, fmt.Errorf("storage %q declares %d %s elements, only %d bytes present: %w", printable(r.key), n, r.dt.name, len(b)-pos, ErrMalformed)
		}
		nb := int(n) * r.dt.size
		r.s = &storage{dt: r.dt, data: b[pos : pos+nb : pos+nb]}
		r.filled = true
		pos += nb
	}
	if pos != len(b) {
		return nil, fmt.Errorf("%d bytes after the last storage: %w", len(b)-pos, ErrMalformed)
	}
	if !root.filled {
		return nil, fmt.Errorf("storage %q has no data: %w", printable(root.key), ErrMalformed)
	}
	return root.s, nil
}

// storagePID validates ('storage', torch.<T>Storage, key, 'cpu', numel, None).
// It allocates nothing: most persistent ids name a storage already seen.
func storagePID(pid any) (*dtypeInfo, str, int64, error) {
	t, ok := pid.(*tuple)
	if !ok || len(t.items) != 6 {
		return nil, nil, 0, fmt.Errorf("persistent id is %s, want ('storage', type, key, location, numel, None): %w", typeName(pid), ErrMalformed)
	}
	it := t.items
	if tag, ok := it[0].(str); !ok || string(tag) != "storage" {
		return nil, nil, 0, fmt.Errorf("persistent id kind %v, only 'storage' is supported: %w", typeName(it[0]), ErrForbidden)
	}
	sc, ok := it[1].(storageClass)
	if !ok {
		return nil, nil, 0, fmt.Errorf("storage type is %s: %w", typeName(it[1]), ErrMalformed)
	}
	key, ok := it[2].(str)
	if !ok {
		return nil, nil, 0, fmt.Errorf("storage key is %s: %w", typeName(it[2]), ErrMalformed)
	}
	loc, ok := it[3].(str)
	if !ok || string(loc) != "cpu" {
		return nil, nil, 0, fmt.Errorf("storage location %s, only 'cpu' is supported: %w", printable(string(loc)), ErrMalformed)
	}
	numel, ok := it[4].(int64)
	if !ok || numel < 0 || numel > math.MaxInt64/int64(sc.dt.size) {
		return nil, nil, 0, fmt.Errorf("storage element count is %s %v: %w", typeName(it[4]), it[4], ErrMalformed)
	}
	if _, ok := it[5].(pyNone); !ok {
		return nil, nil, 0, fmt.Errorf("storage view metadata is %s, only None is supported: %w", typeName(it[5]), ErrMalformed)
	}
	return sc.dt, key, numel, nil
}

// checkSysInfo requires a little-endian writer; the element data is read as such.
func checkSysInfo(v any) error {
	d, ok := v.(*dict)
	if !ok {
		return fmt.Errorf("sys_info is %s, want a dict: %w", typeName(v), ErrMalformed)
	}
	for i, k := range d.keys {
		if ks, ok := k.(str); ok && string(ks) == "little_endian" {
			if le, ok := d.vals[i].(bool); ok && le {
				return nil
			}
			return fmt.Errorf("storage written on a big-endian machine: %w", ErrMalformed)
		}
	}
	return fmt.Errorf("sys_info without little_endian: %w", ErrMalformed)
}
