package main

import (
	"log/slog"

	"kvdock/settings"
)

// logOverridden says which of the file's values a flag or an environment
// variable overrides: a reload reads the file, and a change there that
// does nothing because --flag wins must not pass in silence.
func logOverridden(loaded *settings.Loaded, logger *slog.Logger) {
	if loaded.File == "" {
		return
	}
	// The file alone over the defaults; its own problems were reported by
	// the full load already (a flag may mend them), so a partial result
	// is fine here.
	fileOnly, _ := settings.Load(settings.LoadOptions{ConfigPath: loaded.File})
	if fileOnly == nil {
		return
	}
	for _, c := range settings.Diff(fileOnly.Config, loaded.Config) {
		won := loaded.Sources[c.Key]
		if fileOnly.Sources[c.Key].Kind != settings.SourceFile || (won.Kind != settings.SourceFlag && won.Kind != settings.SourceEnv) {
			continue
		}
		logger.Warn("SIGHUP: the file's value is overridden", "key", c.Key, "file", plainValue(c.Old),
			"used", plainValue(c.New), "from", won.String())
	}
}
