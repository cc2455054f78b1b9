//go:build !race

package l1

// raceDetector reports whether the tests run under -race.
const raceDetector = false
