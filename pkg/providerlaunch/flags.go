package providerlaunch

import (
	"flag"
	"fmt"
	"strings"
)

// Flags holds the gateway's per-profile launch flags until Profiles builds
// the Set.
type Flags struct {
	command, version, home map[string]*string
	args, sums             map[string]*multi
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, " ") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// RegisterFlags registers, for every pinned profile name N in Names:
//
//	-N-command PATH       the program launched for the provider
//	-N-arg ARG            an argument (repeatable)
//	-N-version V          the declared version (must be Versions[N])
//	-N-sha256 [PATH=]HEX  a pinned file (repeatable; without PATH= the command)
//	-N-home-template DIR  launch-only files for the provider's home
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{command: map[string]*string{}, version: map[string]*string{}, home: map[string]*string{}, args: map[string]*multi{}, sums: map[string]*multi{}}
	for _, n := range Names {
		f.command[n] = fs.String(n+"-command", "", fmt.Sprintf("program launched for provider %s (its runs are refused while unset)", n))
		f.version[n] = fs.String(n+"-version", "", fmt.Sprintf("declared version of the %s program (must be the pinned %s)", n, pinnedOrNone(n)))
		f.home[n] = fs.String(n+"-home-template", "", fmt.Sprintf("directory of launch-only files copied into each %s provider home before launch (opencode: opencode.json with the provider definitions; never backed up)", n))
		f.args[n], f.sums[n] = &multi{}, &multi{}
		fs.Var(f.args[n], n+"-arg", fmt.Sprintf("argument of -%s-command (repeatable)", n))
		fs.Var(f.sums[n], n+"-sha256", fmt.Sprintf("pinned SHA-256 of -%s-command, or PATH=HEX of another file it runs (repeatable); checked before every launch", n))
	}
	return f
}

func pinnedOrNone(n string) string {
	if v, ok := Versions[n]; ok {
		return v
	}
	return "(none in this build)"
}

// Profiles builds the configured profiles. A configured profile is not
// verified here (Set.For does that before each launch), but its pins must
// parse.
func (f *Flags) Profiles() (Set, error) {
	s := Set{}
	for _, n := range Names {
		p := Profile{Name: n, Command: *f.command[n], Args: append([]string(nil), (*f.args[n])...), Version: *f.version[n], HomeTemplate: *f.home[n]}
		if !p.Configured() {
			if len(*f.args[n]) > 0 || len(*f.sums[n]) > 0 || p.Version != "" || p.HomeTemplate != "" {
				return nil, fmt.Errorf("-%s-arg/-version/-sha256/-home-template need -%s-command", n, n)
			}
			continue
		}
		for _, v := range *f.sums[n] {
			pin, err := ParsePin(v, p.Command)
			if err != nil {
				return nil, fmt.Errorf("-%s-sha256: %w", n, err)
			}
			p.Pins = append(p.Pins, pin)
		}
		s[n] = p
	}
	return s, nil
}
