package bench

import (
	"fmt"
	"slices"
	"strings"

	"kvdock/core/layout"
)

// Model is the KV layout a benchmark worker registers.
type Model struct {
	Name   string `json:"name"`
	Layers int    `json:"layers"`
	Hidden int    `json:"hidden"`
	Dtype  string `json:"dtype"`
	MLA    bool   `json:"mla"`
}

// presets are the --model choices; a function, not a package variable, so
// nothing mutable is shared.
func presets() map[string]Model {
	return map[string]Model{
		// 8 KV heads × 128 = 1024; 2×32×256×1024×2 B = 32 MiB per 256-token chunk.
		"llama-3.1-8b": {Name: "llama-3.1-8b", Layers: 32, Hidden: 1024, Dtype: "bfloat16"},
		// 2 KV heads × 128 = 256.
		"qwen2.5-1.5b": {Name: "qwen2.5-1.5b", Layers: 28, Hidden: 256, Dtype: "bfloat16"},
		// MLA: one latent of 512 + 64 rope dims per token and layer.
		"deepseek-v2-lite": {Name: "deepseek-v2-lite", Layers: 27, Hidden: 576, Dtype: "bfloat16", MLA: true},
	}
}

// presetNames lists the presets, sorted, for help and errors.
func presetNames() []string {
	names := make([]string, 0, 3)
	for n := range presets() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// resolveModel applies explicit --layers/--hidden/--dtype/--mla over the preset.
func resolveModel(name string, layers, hidden int, dtype string, mla, mlaSet bool) (Model, error) {
	m, ok := presets()[name]
	if !ok {
		return Model{}, fmt.Errorf("--model %q: unknown (known: %s)", name, strings.Join(presetNames(), ", "))
	}
	custom := false
	if layers != 0 {
		m.Layers, custom = layers, true
	}
	if hidden != 0 {
		m.Hidden, custom = hidden, true
	}
	if dtype != "" {
		m.Dtype, custom = dtype, true
	}
	if mlaSet {
		m.MLA, custom = mla, true
	}
	if custom {
		m.Name = "custom"
	}
	if _, err := layout.New(m.Layers, 256, m.Hidden, m.Dtype, m.MLA); err != nil {
		return Model{}, err
	}
	return m, nil
}

// chunkLayout is the layout of one chunk of chunkTokens tokens.
func (m Model) chunkLayout(chunkTokens int) (layout.Layout, error) {
	return layout.New(m.Layers, chunkTokens, m.Hidden, m.Dtype, m.MLA)
}
