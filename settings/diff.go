package settings

// Class is what applying a changed key costs the running server, weakest first.
type Class int

const (
	// Live keys change in place (eviction, TTLs, log level, refresh).
	Live Class = iota
	// NextStart keys are read once, at start (the log sink, the face): a
	// running kvdock records them and restarts nothing; they take effect
	// when kvdock is started again.
	NextStart
	// Restart keys need the engine restarted (sockets, pools, HTTP); the cache survives.
	Restart
	// Rebuild keys change the pool itself: the cache is lost.
	Rebuild
)

// String is "live", "next-start", "restart" or "rebuild".
func (c Class) String() string {
	switch c {
	case Live:
		return "live"
	case NextStart:
		return "next-start"
	case Restart:
		return "restart"
	case Rebuild:
		return "rebuild"
	}
	return "unknown"
}

// Change is one key that differs between two configs; Old and New are shown
// as in messages (strings quoted, an absent shm_name as auto, a secret that
// is set as Redacted).
type Change struct {
	Key      string
	Old, New string
	Class    Class
}

// Diff lists the keys whose values differ, in file order.
func Diff(old, new Config) []Change {
	var out []Change
	for _, d := range table() {
		o, n := display(d.field(&old)), display(d.field(&new))
		if o == n {
			continue
		}
		if d.secret {
			// Logged on SIGHUP and shown before apply: never the value.
			o, n = redactShown(d, &old), redactShown(d, &new)
		}
		if d.key == KeyAdapters {
			o, n = adaptersText(redactAdapters(old.L2.Adapters)), adaptersText(redactAdapters(new.L2.Adapters))
			if o == n {
				n += " (credentials changed)"
			}
		}
		out = append(out, Change{Key: d.key, Old: o, New: n, Class: d.class})
	}
	return out
}

// Strongest is the costliest class among changes (Live for none).
func Strongest(changes []Change) Class {
	c := Live
	for _, ch := range changes {
		if ch.Class > c {
			c = ch.Class
		}
	}
	return c
}

// redactShown is a secret as a change shows it: Redacted when set, "" when not.
func redactShown(d keyDef, c *Config) string {
	if text(d.field(c)) == "" {
		return display(d.field(c))
	}
	return Redacted
}
