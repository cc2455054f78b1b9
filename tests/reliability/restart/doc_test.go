// Package restart holds kvdock's restart tests: an in-process engine
// applying a restart or rebuild under load, and the real binary kept across
// SIGTERM, SIGUSR2 and kvdock ctl restart while Go workers store and read
// (no request lost, every kept byte the same), with hostile restarts (a
// storm of signals, bad settings, a broken binary, two starts at once on
// one kept pool). docs/RESTART.md and docs/RELIABILITY.md give the figures.
package restart
