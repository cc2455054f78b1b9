// Package restart drives real LMCache workers (py/restart_worker.py, with
// pyzmq, msgpack and torch) across kvdock restarts: SIGTERM with
// --l1-keep-on-exit then the same command line, SIGUSR2 and kvdock ctl
// restart, under a named, an auto and the pickle-mode segment, with a loop
// of stores and retrieves across each restart. Without registering again
// the workers keep every stored prompt and lose no request (the storm of 50
// restarts is tests/interop/storm). docs/RESTART.md gives the figures.
package restart
