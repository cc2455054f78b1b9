package fs

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strings"

	"kvdock/transfer/tier"
)

// Defaults and bounds of the fs adapter's fields.
const (
	DefaultCapacityGB = 10
	maxCapacityGB     = 1 << 20 // 1 PiB: keeps the byte count far from int64 overflow
	gib               = 1 << 30
)

// FSConfig is one `{"type": "fs", …}` L2 adapter, parsed.
//
// Fields accepted (upstream LMCache's FSL2AdapterConfig names, same meaning
// unless said):
//   - base_path (string, required): the directory holding the chunk files;
//     created (0700) when missing, made absolute.
//   - max_capacity_gb (number > 0, default 10): the tier's capacity in GiB
//     (upstream counts 1024**3 bytes too), enforced by LRU eviction of our
//     own files. Upstream's 0 = "unbounded" is refused: kvdock bounds every
//     resource, and the in-memory index is bounded by this capacity.
//   - relative_tmp_dir (string, optional): a sub-directory of base_path
//     where writes are staged before the rename into place (same file
//     system, so the rename stays atomic). Default: the chunk's own shard
//     directory.
//   - recover_on_start (bool, default true): rebuild the index from the
//     chunk files a previous run left, so kvdock restarts warm. false starts
//     cold; unlike upstream (which leaves such files uncounted on disk) the
//     previous run's chunk files are then removed at start, so the capacity
//     stays true. scan_on_startup, upstream's older name, is an alias.
//
// Upstream fields refused, with the reason in the error: read_ahead_size
// (a hint for network file systems; Go issues one read for the whole value)
// and use_odirect (needs block-aligned buffers and lengths, which values
// carrying a header are not).
type FSConfig struct {
	BasePath       string // absolute, cleaned
	CapacityBytes  int64
	RelativeTmpDir string // "" = stage in the shard directory
	RecoverOnStart bool
}

// ParseConfig reads one fs adapter object (as decoded from JSON or YAML).
// Every problem is reported, naming the field.
func ParseConfig(m map[string]any) (FSConfig, error) {
	cfg := FSConfig{CapacityBytes: DefaultCapacityGB * gib, RecoverOnStart: true}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	recoverSet := ""
	for _, k := range names {
		v := m[k]
		switch k {
		case "type":
			if s, ok := v.(string); !ok || s != "fs" {
				bad("type: want \"fs\", got %v", v)
			}
		case "base_path":
			s, ok := v.(string)
			if !ok || strings.TrimSpace(s) == "" {
				bad("base_path: want a non-empty path, got %v", v)
				continue
			}
			if strings.IndexByte(s, 0) >= 0 {
				bad("base_path: contains a NUL byte")
				continue
			}
			abs, err := filepath.Abs(s)
			if err != nil {
				bad("base_path %q: %v", s, err)
				continue
			}
			cfg.BasePath = abs
		case "max_capacity_gb":
			f, ok := tier.Number(v)
			if !ok || math.IsNaN(f) || f <= 0 || f > maxCapacityGB {
				bad("max_capacity_gb: want a number of GiB in (0, %d], got %v (upstream's 0 = unbounded is not supported: every tier is bounded)", maxCapacityGB, v)
				continue
			}
			cfg.CapacityBytes = int64(f * gib)
			if cfg.CapacityBytes < 1<<20 {
				bad("max_capacity_gb: %v is under 1 MiB", v)
			}
		case "relative_tmp_dir":
			s, ok := v.(string)
			if !ok {
				bad("relative_tmp_dir: want a string, got %v", v)
				continue
			}
			c := filepath.Clean(s)
			if s == "" || filepath.IsAbs(s) || c == "." || c == ".." || strings.HasPrefix(c, "../") || strings.IndexByte(s, 0) >= 0 {
				bad("relative_tmp_dir: want a sub-directory of base_path, got %q", s)
				continue
			}
			cfg.RelativeTmpDir = c
		case "recover_on_start", "scan_on_startup":
			b, ok := v.(bool)
			if !ok {
				bad("%s: want true or false, got %v", k, v)
				continue
			}
			if recoverSet != "" && b != cfg.RecoverOnStart {
				bad("%s and %s disagree", recoverSet, k)
			}
			recoverSet, cfg.RecoverOnStart = k, b
		case "read_ahead_size":
			bad("read_ahead_size: not supported by kvdock's fs tier (a read-ahead hint for network file systems; each value is read with one request)")
		case "use_odirect":
			bad("use_odirect: not supported by kvdock's fs tier (O_DIRECT needs block-aligned buffers and lengths)")
		default:
			bad("%s: unknown field (fs accepts type, base_path, max_capacity_gb, relative_tmp_dir, recover_on_start)", k)
		}
	}
	if _, ok := m["base_path"]; !ok {
		bad("base_path: required")
	}
	if len(problems) > 0 {
		return FSConfig{}, fmt.Errorf("fs adapter: %s", strings.Join(problems, "; "))
	}
	return cfg, nil
}
