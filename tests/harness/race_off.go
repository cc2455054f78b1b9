//go:build !race

package harness

// RaceDetector reports whether the tests run under -race.
const RaceDetector = false
