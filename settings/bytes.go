package settings

import "fmt"

// BytesText prints a byte count with a binary unit ("512 B", "1.5 GiB",
// "141 GiB"): one decimal below 100 of a unit, none above; "n/a" for a
// negative count (a figure not known). Every face and log line that shows a
// size uses it, so the same count reads the same everywhere.
func BytesText(n int64) string {
	if n < 0 {
		return "n/a"
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, exp := float64(n)/unit, 0
	for v >= unit && exp < 5 {
		v /= unit
		exp++
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f %ciB", v, "KMGTPE"[exp])
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[exp])
}
