// Package restart drives real LMCache workers (py/restart_worker.py, with
// pyzmq, msgpack and torch) across kvdock restarts: SIGTERM with
// --l1-keep-on-exit then the same command line, SIGUSR2 and kvdock ctl
// restart, under a named, an auto and the pickle-mode segment, once and
// in a storm of 50 under load. Without registering again the workers keep
// every stored prompt and lose no request. docs/RESTART.md gives the
// figures.
package restart
