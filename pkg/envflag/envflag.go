// Package envflag registers command-line flags whose defaults come from
// TETHER_* environment variables, and deprecated aliases of renamed flags.
//
// Every service binary reads its configuration through it: a flag -name
// falls back to TETHER_NAME (EnvName) when it is not given, an unparsable
// environment value is an error Parse reports (not a silent default), and
// a renamed flag keeps its old name for one release as an alias that still
// works and is reported by Deprecated so the service can log a warning.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-run/tether/pkg/buildinfo"
)

// EnvName is the environment variable backing a flag: "grpc-addr" →
// "TETHER_GRPC_ADDR".
func EnvName(flagName string) string {
	return "TETHER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// envErrs records unparsable environment values per flag set; aliasUse the
// deprecated aliases given per flag set.
var (
	mu       sync.Mutex
	envErrs  = map[*flag.FlagSet][]error{}
	aliasUse = map[*flag.FlagSet][]string{}
)

func recordEnvErr(fs *flag.FlagSet, err error) {
	mu.Lock()
	defer mu.Unlock()
	envErrs[fs] = append(envErrs[fs], err)
}

// Errors reports the invalid environment fallback values of fs's flags
// registered with this package (nil when there are none).
func Errors(fs *flag.FlagSet) error {
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(envErrs[fs]...)
}

// Parse parses args into fs and reports invalid environment fallback
// values of flags registered with this package's helpers.
//
// A set with a -version flag given -version prints the build on standard
// output and exits 0, as -h prints the usage.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := Errors(fs); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if v := fs.Lookup("version"); v != nil && v.Value.String() == "true" {
		fmt.Println(buildinfo.Read().Line(fs.Name()))
		os.Exit(0)
	}
	return nil
}

// lookupEnv returns the env value for a flag; env "" means EnvName(name).
func lookupEnv(name, env string) (string, string, bool) {
	if env == "" {
		env = EnvName(name)
	}
	v, ok := os.LookupEnv(env)
	return env, v, ok
}

func envDefault[T any](fs *flag.FlagSet, name, env string, def T, parse func(string) (T, error)) T {
	env, v, ok := lookupEnv(name, env)
	if !ok {
		return def
	}
	x, err := parse(v)
	if err != nil {
		recordEnvErr(fs, fmt.Errorf("invalid %s=%q for -%s: %w", env, v, name, err))
		return def
	}
	return x
}

// StringVar registers a string flag whose default comes from env (or
// EnvName(name) when env is "") when set.
func StringVar(fs *flag.FlagSet, p *string, name, env, def, usage string) {
	fs.StringVar(p, name, envDefault(fs, name, env, def, func(s string) (string, error) { return s, nil }), withEnv(usage, name, env))
}

// String is StringVar returning the pointer.
func String(fs *flag.FlagSet, name, env, def, usage string) *string {
	p := new(string)
	StringVar(fs, p, name, env, def, usage)
	return p
}

// DurationVar registers a time.Duration flag with an env fallback.
func DurationVar(fs *flag.FlagSet, p *time.Duration, name, env string, def time.Duration, usage string) {
	fs.DurationVar(p, name, envDefault(fs, name, env, def, time.ParseDuration), withEnv(usage, name, env))
}

// Duration is DurationVar returning the pointer.
func Duration(fs *flag.FlagSet, name, env string, def time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	DurationVar(fs, p, name, env, def, usage)
	return p
}

// IntVar registers an int flag with an env fallback.
func IntVar(fs *flag.FlagSet, p *int, name, env string, def int, usage string) {
	fs.IntVar(p, name, envDefault(fs, name, env, def, strconv.Atoi), withEnv(usage, name, env))
}

// Int is IntVar returning the pointer.
func Int(fs *flag.FlagSet, name, env string, def int, usage string) *int {
	p := new(int)
	IntVar(fs, p, name, env, def, usage)
	return p
}

// BoolVar registers a bool flag with an env fallback (strconv.ParseBool
// syntax: 1, true, 0, false, ...).
func BoolVar(fs *flag.FlagSet, p *bool, name, env string, def bool, usage string) {
	fs.BoolVar(p, name, envDefault(fs, name, env, def, strconv.ParseBool), withEnv(usage, name, env))
}

// Bool is BoolVar returning the pointer.
func Bool(fs *flag.FlagSet, name, env string, def bool, usage string) *bool {
	p := new(bool)
	BoolVar(fs, p, name, env, def, usage)
	return p
}

func withEnv(usage, name, env string) string {
	if env == "" {
		env = EnvName(name)
	}
	return usage + " (env " + env + ")"
}

// List is a repeatable string flag.
type List []string

func (l *List) String() string     { return strings.Join(*l, " ") }
func (l *List) Set(v string) error { *l = append(*l, v); return nil }

// Alias registers old as a deprecated alias of the flag current, which
// must be registered already: setting -old sets -current (the same value,
// repeatable flags append), and Deprecated reports that -old was used.
// The alias is kept for one release, then removed.
func Alias(fs *flag.FlagSet, old, current string) {
	f := fs.Lookup(current)
	if f == nil {
		panic("envflag: alias -" + old + " of unregistered -" + current)
	}
	fs.Var(&alias{fs: fs, old: old, target: f}, old, "deprecated alias of -"+current+" (removed in the next release)")
}

type alias struct {
	fs     *flag.FlagSet
	old    string
	target *flag.Flag
}

func (a *alias) String() string {
	if a == nil || a.target == nil {
		return ""
	}
	return a.target.Value.String()
}

func (a *alias) Set(v string) error {
	mu.Lock()
	if !slices.Contains(aliasUse[a.fs], a.old) {
		aliasUse[a.fs] = append(aliasUse[a.fs], a.old)
	}
	mu.Unlock()
	return a.target.Value.Set(v)
}

// IsBoolFlag lets a boolean target's alias be given without a value.
func (a *alias) IsBoolFlag() bool {
	b, ok := a.target.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Deprecated returns one warning per deprecated alias given to fs, in the
// order they were first given: "-old is deprecated; use -current".
func Deprecated(fs *flag.FlagSet) []string {
	mu.Lock()
	used := slices.Clone(aliasUse[fs])
	mu.Unlock()
	out := make([]string, 0, len(used))
	for _, old := range used {
		a := fs.Lookup(old).Value.(*alias)
		out = append(out, fmt.Sprintf("-%s is deprecated and will be removed in the next release; use -%s", old, a.target.Name))
	}
	return out
}
