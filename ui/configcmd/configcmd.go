// Package configcmd is the `kvdock config` face: init writes the annotated
// default settings file (every key commented out at its default), show prints the settings kvdock would run with (and
// where each value came from), check validates a settings file.
package configcmd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"kvdock/core/hostmem"
	"kvdock/settings"
)

// Exit codes of Run.
const (
	ExitOK      = 0
	ExitFailure = 1 // could not read or write a file
	ExitInvalid = 2 // invalid settings or usage
)

const usage = `Usage: kvdock config <command> [options]

Commands:
  init [PATH]   write the annotated default settings file
  show          print the settings kvdock would run with
  check PATH    validate a settings file

Run 'kvdock config <command> --help' for a command's options.
`

// Run runs `kvdock config` with args (the words after "config") and the
// process environment environ ("NAME=value"). It returns the exit code:
// 0 ok, 1 a file could not be read or written, 2 invalid settings or usage.
func Run(args []string, stdout, stderr io.Writer, environ []string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitInvalid
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	case "init":
		return runInit(args[1:], stdout, stderr, environ)
	case "show":
		return runShow(args[1:], stdout, stderr, environ)
	case "check":
		return runCheck(args[1:], stdout, stderr, environ)
	}
	fmt.Fprintf(stderr, "kvdock config: unknown command %q\n\n%s", args[0], usage)
	return ExitInvalid
}

// parse parses args into fs, printing help to stdout for --help. done is
// true when Run should return code.
func parse(fs *pflag.FlagSet, help string, args []string, stdout, stderr io.Writer) (code int, done bool) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, pflag.ErrHelp):
		fmt.Fprintf(stdout, "%s\nOptions:\n%s", help, fs.FlagUsages())
		return ExitOK, true
	case err != nil:
		usageLine, _, _ := strings.Cut(help, "\n")
		fmt.Fprintf(stderr, "%s: %v%s\n%s (%s --help for more)\n", fs.Name(), err, settings.FlagHint(fs, err), strings.ToLower(usageLine[:1])+usageLine[1:], fs.Name())
		return ExitInvalid, true
	}
	return 0, false
}

const initHelp = `Usage: kvdock config init [--force] [PATH]

Writes the annotated default settings file (every key commented out at its
default, with what it does, its flag and its environment variable) to PATH, by default $XDG_CONFIG_HOME/kvdock/config.yaml (or
~/.config/kvdock/config.yaml), creating its directories. An existing file is
left alone unless --force is given.
`

func runInit(args []string, stdout, stderr io.Writer, environ []string) int {
	fs := pflag.NewFlagSet("kvdock config init", pflag.ContinueOnError)
	force := fs.Bool("force", false, "overwrite an existing file")
	if code, done := parse(fs, initHelp, args, stdout, stderr); done {
		return code
	}
	var path string
	switch fs.NArg() {
	case 0:
		p, err := settings.DefaultPath(environ)
		if err != nil {
			fmt.Fprintf(stderr, "kvdock config init: %v; give a PATH\n", err)
			return ExitInvalid
		}
		path = p
	case 1:
		path = fs.Arg(0)
	default:
		fmt.Fprintf(stderr, "kvdock config init: one PATH at most, got %q\n", fs.Args())
		return ExitInvalid
	}
	if err := writeConfig(path, *force); err != nil {
		fmt.Fprintf(stderr, "kvdock config init: %v\n", err)
		return ExitFailure
	}
	fmt.Fprintf(stdout, "wrote %s\n", path)
	return ExitOK
}

// writeConfig writes the commented default file; 0600 because an operator
// may later put the HTTP token in it.
func writeConfig(path string, force bool) error {
	body, err := initFile()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating the directory of %s: %w", path, err)
	}
	flag := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flag = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s already exists; use --force to overwrite it", path)
	}
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	if _, err := f.Write(body); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

const showHelp = `Usage: kvdock config show [--sources] [--config PATH] [setting flags]

Prints, as a settings file, the settings kvdock would run with under the same
flags, KVDOCK_* environment variables and settings file. With --sources every
value is followed by where it came from (default, file:line, env var, flag).
Exits 2, naming every problem and its source, when the settings are invalid.
`

func runShow(args []string, stdout, stderr io.Writer, environ []string) int {
	fs := pflag.NewFlagSet("kvdock config show", pflag.ContinueOnError)
	settings.RegisterFlags(fs)
	sources := fs.Bool("sources", false, "follow each value with its source")
	if code, done := parse(fs, showHelp, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvdock config show: unexpected arguments %q\n", fs.Args())
		return ExitInvalid
	}
	l, err := settings.Load(settings.LoadOptions{Flags: fs, Environ: environ})
	if err != nil {
		return loadFailed("kvdock config show", err, stderr)
	}
	for _, w := range l.Warnings {
		fmt.Fprintf(stderr, "kvdock config show: warning: %s\n", w)
	}
	var src map[string]settings.Source
	if *sources {
		src = l.Sources
	}
	if l.File != "" {
		fmt.Fprintf(stdout, "# kvdock settings; file %s (from %s)\n", l.File, l.FileSource)
	} else {
		fmt.Fprintln(stdout, "# kvdock settings; no settings file")
	}
	// A secret does not belong on a terminal or in a pasted bug report.
	shown := settings.Redact(l.Config)
	if _, err := stdout.Write(settings.Render(shown, src)); err != nil {
		fmt.Fprintf(stderr, "kvdock config show: %v\n", err)
		return ExitFailure
	}
	return ExitOK
}

const checkHelp = `Usage: kvdock config check [setting flags] PATH

Validates what kvdock serve would run with, PATH as its settings file, under
the same KVDOCK_* environment variables and setting flags: prints "ok" and
exits 0, or lists every problem serve would refuse (each with its source:
file:line, variable or flag; a pool larger than this host's available
memory included) and exits 2. A pool above 80 % of the available memory is
warned about on stderr.
`

func runCheck(args []string, stdout, stderr io.Writer, environ []string) int {
	fs := pflag.NewFlagSet("kvdock config check", pflag.ContinueOnError)
	settings.RegisterFlags(fs)
	_ = fs.MarkHidden(settings.ConfigFlag) // PATH is the file
	if code, done := parse(fs, checkHelp, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() != 1 || fs.Arg(0) == "" {
		fmt.Fprintf(stderr, "kvdock config check: want one PATH\n\n%s", checkHelp)
		return ExitInvalid
	}
	path := fs.Arg(0)
	// Unreadable meminfo (0) checks nothing, as in serve.
	avail, _ := hostmem.Probe{}.MemAvailable()
	l, err := settings.LoadForServe(settings.LoadOptions{ConfigPath: path, Flags: fs, Environ: environ}, avail)
	if err != nil {
		return loadFailed("kvdock config check", err, stderr)
	}
	for _, w := range l.Warnings {
		fmt.Fprintf(stderr, "kvdock config check: warning: %s\n", w)
	}
	// Short of a refusal, a pool that would leave the host little is
	// worth saying before a start.
	if w := settings.MemoryWarning(l.Config, avail); w != "" {
		fmt.Fprintf(stderr, "kvdock config check: warning: %s\n", w)
	}
	fmt.Fprintf(stdout, "%s: ok\n", path)
	return ExitOK
}

// loadFailed reports a Load error: a file that cannot be read is a failure
// (1), anything about the settings themselves is invalid (2).
func loadFailed(cmd string, err error, stderr io.Writer) int {
	fmt.Fprintf(stderr, "%s: %s\n", cmd, strings.TrimSpace(err.Error()))
	var ve *settings.ValidationError
	if !errors.As(err, &ve) && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)) {
		return ExitFailure
	}
	return ExitInvalid
}
