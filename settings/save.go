package settings

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	yamlv3 "go.yaml.in/yaml/v3"
)

// maxFileBytes bounds the settings file a save reads and edits; a real one
// is a few KiB.
const maxFileBytes = 1 << 20

// Edited lists, in file order, the keys src marks as set in the dashboard.
// They are the only values a save writes: values from the file are already
// there, and values from the environment, flags or defaults belong to how
// kvdock was started (a secret among them would otherwise leak to disk).
func Edited(src map[string]Source) []string {
	var out []string
	for _, d := range table() {
		if src[d.key].Kind == SourceDashboard && !d.readOnly {
			out = append(out, d.key)
		}
	}
	return out
}

// UpdateFile returns data, the bytes of a settings file (empty for a new
// one), with every key in keys set to its value in c, and everything else
// kept: comments, the order of groups and keys, blank lines between them,
// and every other value. It edits the YAML node tree, so only the written
// values change. A key at its auto value (server.shm_name absent) is
// removed. A new key goes into its group after the keys that precede it in
// the file order; a new group likewise.
//
// It refuses a file it cannot edit safely (invalid YAML, more than one
// document, unknown or misshapen keys) and checks that the result reads
// back to c's values for keys.
func UpdateFile(data []byte, c Config, keys []string) ([]byte, error) {
	return updateFile("settings file", data, c, keys)
}

func updateFile(name string, data []byte, c Config, keys []string) ([]byte, error) {
	defs := make([]keyDef, 0, len(keys))
	for _, k := range keys {
		d, ok := findDef(k)
		if !ok {
			return nil, fmt.Errorf("unknown setting %q", k)
		}
		if d.readOnly {
			// l2.adapters may hold credentials: never written from here.
			return nil, fmt.Errorf("%s is not saved from here; edit it in the file, or give --%s", k, d.flag)
		}
		defs = append(defs, d)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than a settings file holds (%d); not edited", name, len(data), maxFileBytes)
	}
	docs := 0
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	for {
		var n yamlv3.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		docs++
	}
	if docs > 1 {
		return nil, fmt.Errorf("%s holds %d YAML documents; kvdock reads only the first, and will not rewrite the others: keep one", name, docs)
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if _, probs, err := checkFile(name, data); err != nil {
		return nil, err
	} else if len(probs) > 0 {
		msgs := make([]string, len(probs))
		for i, p := range probs {
			msgs[i] = p.String()
		}
		return nil, fmt.Errorf("%s has problems; fix them before saving: %s", name, strings.Join(msgs, "; "))
	}

	// Empty, or only comments: yaml.v3 keeps no comment without a node to
	// hang it on, so the new mapping goes under the text as it is.
	var prefix []byte
	if doc.Kind == 0 || len(doc.Content) == 0 {
		prefix = data
		if len(prefix) > 0 && prefix[len(prefix)-1] != '\n' {
			prefix = append(append([]byte{}, prefix...), '\n')
		}
		doc = yamlv3.Node{Kind: yamlv3.DocumentNode, Content: []*yamlv3.Node{{Kind: yamlv3.MappingNode, Tag: "!!map"}}}
	}
	keepBlankLines(&doc, data)
	root := doc.Content[0]
	if isNull(root) {
		root.Kind, root.Tag, root.Value, root.Style = yamlv3.MappingNode, "!!map", "", 0
	}

	for _, d := range defs {
		if err := setLeaf(&doc, root, d, &c); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", name, d.key, err)
		}
	}

	var b bytes.Buffer
	b.Write(prefix)
	enc := yamlv3.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("%s: writing YAML: %w", name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("%s: writing YAML: %w", name, err)
	}
	// A blank line kept inside a group comes out as indentation alone;
	// drop that, unless it was part of a multi-line value.
	out := b.Bytes()
	if trimmed := trimBlankLines(out); readsBack(name, trimmed, c, defs) == nil {
		return trimmed, nil
	}
	if err := readsBack(name, out, c, defs); err != nil {
		return nil, err
	}
	return out, nil
}

// trimBlankLines empties the lines that hold only spaces.
func trimBlankLines(data []byte) []byte {
	lines := bytes.Split(data, []byte("\n"))
	for i, l := range lines {
		if len(bytes.TrimLeft(l, " ")) == 0 {
			lines[i] = nil
		}
	}
	return bytes.Join(lines, []byte("\n"))
}

// setLeaf writes d's value in c into the tree, or removes the key when the
// value is auto.
func setLeaf(doc, root *yamlv3.Node, d keyDef, c *Config) error {
	ptr := d.field(c)
	absent := false
	if p, ok := ptr.(**string); ok && *p == nil {
		absent = true
	}
	gi := findPair(root, d.group())
	if gi < 0 {
		if absent {
			return nil
		}
		pos := insertPos(root, d.group(), groupRank)
		k := &yamlv3.Node{Kind: yamlv3.ScalarNode, Tag: "!!str", Value: d.group()}
		// A file that has blank lines between its groups (config init
		// writes them so) gets one around the new group too.
		if spacedGroups(root) {
			if pos > 0 {
				k.HeadComment = "\n"
			} else if len(root.Content) > 0 {
				root.Content[0].HeadComment = "\n" + root.Content[0].HeadComment
			}
		}
		insertPair(root, pos, k, &yamlv3.Node{Kind: yamlv3.MappingNode, Tag: "!!map"})
		gi = pos
	}
	group := root.Content[gi+1]
	if group.Kind == yamlv3.AliasNode {
		materialize(group)
	}
	if isNull(group) {
		group.Kind, group.Tag, group.Value, group.Style = yamlv3.MappingNode, "!!map", "", 0
	}
	// checkFile accepted the file, so a group is a mapping by now; an
	// anchored one shared with another group is split off before editing.
	if group.Kind != yamlv3.MappingNode {
		return errors.New("its group is not a mapping")
	}
	unshare(doc, group)

	li := findPair(group, d.leaf())
	if absent {
		switch {
		case li < 0:
		case len(group.Content) == 2:
			// Its last key: the group goes too (an empty one would be
			// written "{}"), and the key's comments move up to it.
			k := root.Content[gi]
			k.HeadComment = joinComments(k.HeadComment, strings.TrimLeft(group.Content[0].HeadComment, "\n"))
			unshare(doc, group)
			removePair(root, gi)
		default:
			unshare(doc, group.Content[li+1])
			removePair(group, li)
		}
		return nil
	}
	if li < 0 {
		li = insertPos(group, d.leaf(), leafRank(d.group()))
		insertPair(group, li, &yamlv3.Node{Kind: yamlv3.ScalarNode, Tag: "!!str", Value: d.leaf()}, &yamlv3.Node{})
	}
	v := group.Content[li+1]
	unshare(doc, v)
	setScalar(v, ptr)
	return nil
}

// setScalar makes n the scalar for the field ptr points to, in place so
// the comments on it stay. Strings keep a quoting style the file chose;
// the encoder quotes them when plain text would read back as another type.
func setScalar(n *yamlv3.Node, ptr any) {
	quoted := n.Kind == yamlv3.ScalarNode && n.Style&(yamlv3.SingleQuotedStyle|yamlv3.DoubleQuotedStyle) != 0
	oldStyle := n.Style
	n.Kind, n.Alias, n.Content, n.Anchor, n.Style = yamlv3.ScalarNode, nil, nil, "", 0
	switch p := ptr.(type) {
	case *string:
		n.SetString(*p)
	case **string:
		n.SetString(**p)
	default:
		// Numbers, bools and durations in their canonical text read back
		// as themselves when plain.
		n.Tag, n.Value = "", text(ptr)
		return
	}
	if quoted && !strings.Contains(n.Value, "\n") {
		n.Style = oldStyle &^ yamlv3.TaggedStyle
	}
}

// spacedGroups says whether the file separates its groups by blank lines
// (keepBlankLines marked them).
func spacedGroups(root *yamlv3.Node) bool {
	for i := 2; i+1 < len(root.Content); i += 2 {
		if strings.HasPrefix(root.Content[i].HeadComment, "\n") {
			return true
		}
	}
	return false
}

// groupRank and leafRank order keys as the file does.
func groupRank(name string) int {
	for i, g := range groupOrder {
		if g == name {
			return i
		}
	}
	return len(groupOrder)
}

func leafRank(group string) func(string) int {
	return func(leaf string) int {
		i := 0
		for _, d := range table() {
			if d.group() != group {
				continue
			}
			if d.leaf() == leaf {
				return i
			}
			i++
		}
		return i
	}
}

// findPair returns the index of key's key node in mapping m, or -1.
func findPair(m *yamlv3.Node, key string) int {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if k := deref(m.Content[i]); k.Kind == yamlv3.ScalarNode && k.Value == key {
			return i
		}
	}
	return -1
}

// insertPos is where key goes in m: after the last key ranked before it.
func insertPos(m *yamlv3.Node, key string, rank func(string) int) int {
	pos := 0
	for i := 0; i+1 < len(m.Content); i += 2 {
		if rank(deref(m.Content[i]).Value) < rank(key) {
			pos = i + 2
		}
	}
	return pos
}

func insertPair(m *yamlv3.Node, pos int, k, v *yamlv3.Node) {
	m.Content = append(m.Content, nil, nil)
	copy(m.Content[pos+2:], m.Content[pos:])
	m.Content[pos], m.Content[pos+1] = k, v
}

// removePair drops the pair at i; the comments above the key move to the
// next key (or under the previous one), so a removed key takes only its
// own line with it.
func removePair(m *yamlv3.Node, i int) {
	head := m.Content[i].HeadComment
	m.Content = append(m.Content[:i], m.Content[i+2:]...)
	if strings.Trim(head, "\n") == "" {
		return
	}
	switch {
	case i < len(m.Content):
		next := m.Content[i]
		next.HeadComment = joinComments(head, next.HeadComment)
	case i >= 2:
		prev := m.Content[i-2]
		prev.FootComment = joinComments(prev.FootComment, strings.TrimLeft(head, "\n"))
	default:
		m.HeadComment = joinComments(m.HeadComment, head)
	}
}

func joinComments(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "\n" + b
}

// keepBlankLines marks every mapping key after the first that had a blank
// line above it (above its comments) so the encoder writes one there too:
// yaml.v3 drops blank lines that no comment holds.
func keepBlankLines(doc *yamlv3.Node, data []byte) {
	lines := strings.Split(string(data), "\n")
	blankBefore := func(line int) bool { // 1-based line
		return line >= 2 && line-2 < len(lines) && strings.TrimSpace(lines[line-2]) == ""
	}
	var walk func(n *yamlv3.Node, depth int)
	walk = func(n *yamlv3.Node, depth int) {
		if n == nil || depth > 64 {
			return
		}
		if n.Kind == yamlv3.MappingNode && n.Style&yamlv3.FlowStyle == 0 {
			for i := 2; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Line == 0 || strings.HasPrefix(k.HeadComment, "\n") {
					continue
				}
				first := k.Line
				if k.HeadComment != "" {
					first -= strings.Count(k.HeadComment, "\n") + 1
				}
				if blankBefore(first) {
					k.HeadComment = "\n" + k.HeadComment
				}
			}
		}
		for _, c := range n.Content {
			walk(c, depth+1)
		}
	}
	walk(doc, 0)
}

// unshare gives n its own value before it is edited: every alias of it
// elsewhere in the document becomes a copy of what it was, and n loses its
// anchor, so editing one key never changes another.
func unshare(doc, n *yamlv3.Node) {
	if n.Anchor == "" {
		return
	}
	var walk func(x *yamlv3.Node, depth int)
	walk = func(x *yamlv3.Node, depth int) {
		if x == nil || depth > 64 {
			return
		}
		if x.Kind == yamlv3.AliasNode && x.Alias == n {
			materialize(x)
			return
		}
		for _, c := range x.Content {
			walk(c, depth+1)
		}
	}
	walk(doc, 0)
	n.Anchor = ""
}

// materialize turns alias node a into a copy of what it points to, keeping
// a's own comments.
func materialize(a *yamlv3.Node) {
	target := deref(a)
	if target == nil || target == a || target.Kind == yamlv3.AliasNode {
		return
	}
	cp := copyNode(target, 0)
	cp.HeadComment, cp.LineComment, cp.FootComment = a.HeadComment, a.LineComment, a.FootComment
	cp.Line, cp.Column = a.Line, a.Column
	*a = *cp
}

// copyNode copies a tree without its anchors (aliases inside still point
// to their original targets).
func copyNode(n *yamlv3.Node, depth int) *yamlv3.Node {
	cp := *n
	cp.Anchor = ""
	if depth > 64 {
		return &cp
	}
	cp.Content = make([]*yamlv3.Node, len(n.Content))
	for i, c := range n.Content {
		cp.Content[i] = copyNode(c, depth+1)
	}
	return &cp
}

// readsBack checks that out is a settings file that gives every key in defs
// its value in c, decoded as Load decodes it.
func readsBack(name string, out []byte, c Config, defs []keyDef) error {
	leaves, probs, err := checkFile(name, out)
	if err != nil {
		return fmt.Errorf("%s: the edited file would not read back: %w; not saved", name, err)
	}
	if len(probs) > 0 {
		return fmt.Errorf("%s: the edited file would not read back (%s); not saved", name, probs[0])
	}
	var tree map[string]map[string]any
	if err := yamlv3.Unmarshal(out, &tree); err != nil {
		return fmt.Errorf("%s: the edited file would not read back: %w", name, err)
	}
	for _, d := range defs {
		want := display(d.field(&c))
		got := Default()
		ptr := d.field(&got)
		leaf, ok := leaves[d.key]
		switch p := ptr.(type) {
		case **string:
			*p = nil
			if ok {
				s := leaf.raw
				*p = &s
			}
		case *string:
			if !ok {
				return fmt.Errorf("%s: %s would not read back; not saved", name, d.key)
			}
			*p = leaf.raw
		default:
			if !ok || assign(ptr, tree[d.group()][d.leaf()]) != "" {
				return fmt.Errorf("%s: %s would not read back; not saved", name, d.key)
			}
		}
		if display(ptr) != want {
			return fmt.Errorf("%s: %s would read back as another value; not saved", name, d.key)
		}
	}
	return nil
}

// SaveResult says what SaveFile did.
type SaveResult struct {
	// Path is the file written: the target when the path is a symlink.
	Path string
	// Keys are the keys written, in file order; none means nothing was
	// written.
	Keys []string
	// Created is true when the file did not exist before.
	Created bool
	// Mode is the file's permission bits now.
	Mode fs.FileMode
}

// SaveFile writes into the settings file at path the values src marks as
// set in the dashboard (see Edited), taking them from c and keeping the
// rest of the file (see UpdateFile). Values from the environment, flags and
// defaults are never written, nor is any other secret.
//
// The file keeps its mode and, where allowed, its owner; a new one (and its directory, 0700, when
// missing) is created with mode 0600, and a file that now holds a secret
// written here loses its group and other bits. The write is atomic: a
// temporary file in the same directory, synced, then renamed over it.
// With nothing to write it writes nothing.
func SaveFile(path string, c Config, src map[string]Source) (SaveResult, error) {
	res := SaveResult{Path: path, Keys: Edited(src)}
	if path == "" {
		return res, errors.New("no settings file path to save to")
	}
	if len(res.Keys) == 0 {
		return res, nil
	}
	if target, err := filepath.EvalSymlinks(path); err == nil {
		res.Path = target
	} else if !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("save %s: %w", path, err)
	}
	path = res.Path

	var data []byte
	mode := fs.FileMode(0o600)
	owner := [2]int{-1, -1} // uid, gid; -1 leaves it as created
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		res.Created = true
	case err != nil:
		return res, fmt.Errorf("save %s: %w", path, err)
	default:
		fi, serr := f.Stat()
		if serr == nil && !fi.Mode().IsRegular() {
			serr = errors.New("not a regular file")
		}
		if serr == nil {
			mode = fi.Mode().Perm()
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				owner = [2]int{int(st.Uid), int(st.Gid)}
			}
			data, serr = io.ReadAll(io.LimitReader(f, maxFileBytes+1))
		}
		f.Close()
		if serr != nil {
			return res, fmt.Errorf("save %s: %w", path, serr)
		}
	}

	out, err := updateFile(path, data, c, res.Keys)
	if err != nil {
		return res, fmt.Errorf("save: %w", err)
	}
	for _, k := range res.Keys {
		if d, _ := findDef(k); d.secret && text(d.field(&c)) != "" {
			mode &^= 0o077
		}
	}
	if res.Created {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return res, fmt.Errorf("save %s: creating its directory: %w", path, err)
		}
	}
	if err := writeAtomic(path, out, mode, owner); err != nil {
		return res, err
	}
	res.Mode = mode
	return res, nil
}

// writeAtomic replaces path with data through a temporary file in the same
// directory (created 0600, so a secret is never readable by others on the
// way), synced before the rename and the directory synced after it, so a
// crash leaves the old file or the new one, never half of one. The new file
// gets owner's uid and gid where allowed (root saving a user's file leaves
// it the user's); a refusal leaves it the saver's.
func writeAtomic(path string, data []byte, mode fs.FileMode, owner [2]int) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if owner[0] >= 0 && (owner[0] != os.Geteuid() || owner[1] != os.Getegid()) {
		_ = f.Chown(owner[0], owner[1])
	}
	merr := f.Chmod(mode)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, merr, serr, cerr); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		// The rename is durable once the directory is; a failure here
		// leaves the new file in place, so it is not an error.
		_ = d.Sync()
		d.Close()
	}
	return nil
}
