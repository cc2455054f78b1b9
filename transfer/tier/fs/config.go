package fs

import (
	"cmp"
	"fmt"
	"path/filepath"

	"kvdock/settings"
)

// DefaultCapacityGB is the capacity of an adapter that gives none.
const DefaultCapacityGB = 10

// FSConfig is what the tier runs with: an fs adapter (settings.FSAdapter
// says what each field means) with its defaults applied.
type FSConfig struct {
	BasePath       string // absolute, cleaned
	CapacityBytes  int64
	RelativeTmpDir string // cleaned; "" = stage in the shard directory
	RecoverOnStart bool
}

// FromAdapter is the config of an adapter settings validated; a relative
// base_path is made absolute against the working directory.
func FromAdapter(a settings.FSAdapter) (FSConfig, error) {
	abs, err := filepath.Abs(a.BasePath)
	if err != nil {
		return FSConfig{}, fmt.Errorf("fs adapter: base_path %q: %w", a.BasePath, err)
	}
	c := FSConfig{
		BasePath:       abs,
		CapacityBytes:  int64(cmp.Or(a.MaxCapacityGB, DefaultCapacityGB) * (1 << 30)),
		RecoverOnStart: a.RecoverOnStart == nil || *a.RecoverOnStart,
	}
	if a.RelativeTmpDir != "" {
		c.RelativeTmpDir = filepath.Clean(a.RelativeTmpDir)
	}
	return c, nil
}
