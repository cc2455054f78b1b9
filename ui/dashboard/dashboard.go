// Package dashboard is kvdock's terminal face: a Bubble Tea program that
// shows the engine's snapshot (endpoint, state, registered worker contexts
// with their SHM or PICKLE mode, the L1 pool, GPU memory, events) and lets an
// operator edit, apply and save settings. It reads the engine through the
// small Engine interface, so tests drive it with a fake.
//
// Keys (the help bar and ? are generated from the same key maps):
//
//	everywhere   tab / shift+tab next/previous pane, 1-5 go to a pane,
//	             ? help (with the log file's path), q quit (asks when workers
//	             are registered or edits are not applied), ctrl+c quit now,
//	             Z zero the statistics (hit ratio, tokens saved, misses,
//	             what-if; y confirms, n cancels)
//	lists        ↑↓/jk move, pgup/pgdn or ctrl+u/ctrl+d page, g/G top/bottom;
//	             "… n more below" when the list goes on
//	2 Pool, 3 GPU, 6 Tiers  the same keys scroll the pane when it does
//	             not fit
//	1 Contexts   shift+letter sorts by that column (figures start with the
//	             largest; again: reverse; the sort column is always shown),
//	             s next shown column, / filter: text matches every text
//	             column (digits the id), col:value one column, the syntax
//	             shown while typing (enter keeps it, esc clears it), enter details, esc close, x remove
//	             the selected worker (y confirms, n cancels); STATE shows
//	             active, idle 5m, reaped or removed, SEEN the last request;
//	             the details show their figures first, charts in the room
//	             left, and pgup/pgdn, g/G scroll them when they do not fit
//	4 Events     ↑↓, pgup/pgdn, g/G scroll the events under the latency
//	             table (newest at the bottom; scrolled back, new events do
//	             not move the view, G follows them again), l minimum
//	             level, / filter text, esc clear filters
//	5 Settings   ↑↓ move, / find a key (enter selects, esc goes back),
//	             enter edit, a apply (shows the diff with each change's class,
//	             y confirms, n cancels), w save the values set here (applied
//	             or pending) into the settings file, r reset the key to its
//	             default, u undo all pending edits
//	editing      enter accept (refused while the value is invalid), esc cancel,
//	             ctrl+u clear the field, ctrl+r put the default back
//
// The model (model.go) draws the header, the tabs, the help bar, the help
// screen and the yes/no questions, and routes keys and the screen to the
// pane on show. Each pane is a component (pane.go) that owns its state,
// keys, Update, View and size; they share the snapshot, the running config,
// the styles, the status line, the event log and the question on screen
// through one programContext (context.go).
//
// Save edits the file in place (settings.SaveFile): its comments, order and
// mode stay, values from the environment and flags never reach it, and
// without a file it creates $XDG_CONFIG_HOME/kvdock/config.yaml (0600).
//
// Header messages (apply, save, undo results) take a line of their own
// under the rates line, never the pool line's, and go after a few seconds. An edited l1.size_gb larger than the host's
// available memory is refused in the editor unless l1.allow_overcommit.
//
// server.shm_name is tri-state. In the editor an empty field (or the two
// characters "") is the empty string, SHM off; "(auto)", which ctrl+r puts
// back, is unset (auto). The list shows them as "" and (auto). Turning SHM
// off from any pane therefore reads:
//
//	5  /  shm_name  enter  enter  ctrl+u  enter  a  y
package dashboard

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"kvdock/core/engine"
	"kvdock/settings"
)

// Engine is what the dashboard needs from the engine.
type Engine interface {
	Snapshot() engine.Snapshot
	Subscribe(buffer int) (<-chan engine.Event, func())
	Apply(ctx context.Context, cfg settings.Config, sources map[string]settings.Source) (engine.ApplyResult, error)
	Config() (settings.Config, map[string]settings.Source)
	// RemoveInstance drops a worker's context on the operator's word.
	RemoveInstance(id int64, by engine.ClearOrigin) error
}

// Options tune the dashboard; the zero value works.
type Options struct {
	// Version is shown in the header when the snapshot carries none.
	Version string
	// ConfigPath is where "save to config file" (w) writes; "" disables it.
	ConfigPath string
	// LogFile is where the logs go, shown in the Settings pane and the
	// help screen; "" when they go to stderr.
	LogFile string
	// Memory reads the host's available memory for the check of an edited
	// l1.size_gb (settings.CheckMemory); nil skips that check.
	Memory settings.MemoryProbe
	// Profile overrides the colour profile (tests use colorprofile.ASCII).
	// Unknown (the zero value) detects it from the terminal, and any
	// non-empty NO_COLOR gives ASCII.
	Profile colorprofile.Profile
	// Refresh is the snapshot interval; 0 follows the engine's ui.refresh
	// (applied live from the settings pane too), 1 s when that is unset.
	Refresh time.Duration
	// Now is the clock for ages ("12s ago"); nil = time.Now.
	Now func() time.Time
	// Location is the zone event times are shown in; nil = time.Local.
	Location *time.Location
	// Environ is the environment consulted for NO_COLOR and the terminal;
	// nil = os.Environ().
	Environ []string
	// Input and Output default to the process's terminal.
	Input  io.Reader
	Output io.Writer
}

func (o Options) withDefaults(eng Engine) Options {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Location == nil {
		o.Location = time.Local
	}
	if o.Environ == nil {
		o.Environ = os.Environ()
	}
	if o.Refresh <= 0 {
		if cfg, _ := eng.Config(); cfg.UI.Refresh > 0 {
			o.Refresh = cfg.UI.Refresh
		} else {
			o.Refresh = time.Second
		}
	}
	return o
}

// profileFor picks the colour profile: the override, else NO_COLOR (any
// non-empty value means no colour; colorprofile alone only reads booleans),
// else what the output supports.
func profileFor(o Options) colorprofile.Profile {
	if o.Profile != colorprofile.Unknown {
		return o.Profile
	}
	for _, kv := range o.Environ {
		if v, ok := strings.CutPrefix(kv, "NO_COLOR="); ok && v != "" {
			return colorprofile.ASCII
		}
	}
	out := o.Output
	if out == nil {
		out = os.Stdout
	}
	return colorprofile.Detect(out, o.Environ)
}

// Run shows the dashboard until the operator quits or ctx ends. It returns
// nil on a normal quit.
func Run(ctx context.Context, eng Engine, opts Options) error {
	follow := opts.Refresh <= 0
	opts = opts.withDefaults(eng)
	profile := profileFor(opts)
	m := newModel(ctx, eng, opts, profile)
	m.followRefresh = follow

	popts := []tea.ProgramOption{
		tea.WithContext(ctx),
		tea.WithColorProfile(profile),
		tea.WithEnvironment(opts.Environ),
		// 20 frames a second is plenty for a 1 s refresh and typing; the
		// default 60 wakes the renderer three times as often.
		tea.WithFPS(20),
	}
	if opts.Input != nil {
		popts = append(popts, tea.WithInput(opts.Input))
	}
	if opts.Output != nil {
		popts = append(popts, tea.WithOutput(opts.Output))
	}
	p := tea.NewProgram(m, popts...)

	events, unsubscribe := eng.Subscribe(64)
	defer unsubscribe()
	fwdCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for {
			select {
			case <-fwdCtx.Done():
				return
			case ev := <-events:
				p.Send(eventMsg(ev))
			}
		}
	}()

	_, err := p.Run()
	if err != nil && ctx.Err() != nil {
		// The program was ended by ctx: that is a normal stop.
		return nil
	}
	if err != nil {
		return fmt.Errorf("dashboard: %w", err)
	}
	return nil
}
