package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
)

// Profiles (SPEC U1): a JSON file of named connection settings, so that
// an operator of several executors (or one person acting for several
// companies) picks one with -profile NAME or TETHER_PROFILE instead of
// repeating -addr, -ca, -cert, -key, -token and -company. The file is
// -config, else TETHER_CONFIG, else $XDG_CONFIG_HOME/tether/config.json
// (~/.config/tether/config.json):
//
//	{
//	  "default_profile": "local",
//	  "profiles": {
//	    "local": {"address": "127.0.0.1:7400", "company": "acme"},
//	    "prod":  {"address": "executor.example:7400", "ca": "/etc/tether/ca.pem",
//	              "token_file": "~/.config/tether/acme-writer.token", "company": "acme"}
//	  }
//	}
//
// A flag (or its environment variable) overrides the profile's value; the
// profile overrides the built-in default. Relative paths and a leading ~/
// are resolved against the config file's directory and $HOME.

// Profile is one named set of connection settings.
type Profile struct {
	// Address is the executor's gRPC address (-addr; several comma
	// separated are replicas).
	Address string `json:"address,omitempty"`
	// CA, Cert and Key are TLS files (-ca, -cert, -key).
	CA   string `json:"ca,omitempty"`
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// Token is a bearer token; TokenFile a file holding one (-token).
	Token     string `json:"token,omitempty"`
	TokenFile string `json:"token_file,omitempty"`
	// Company is the company commands act for when -company is not given.
	Company string `json:"company,omitempty"`
}

// Config is the profiles file.
type Config struct {
	DefaultProfile string             `json:"default_profile,omitempty"`
	Profiles       map[string]Profile `json:"profiles"`
}

// defaultConfigPath is where the profiles file is when neither -config nor
// TETHER_CONFIG names one.
func defaultConfigPath() string {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "tether", "config.json")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".config", "tether", "config.json")
	}
	return ""
}

// loadConfig reads the profiles file; a missing file is an empty config
// unless it was named explicitly.
func loadConfig(path string, explicit bool) (*Config, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return &Config{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("profiles: %w", err)
	}
	var c Config
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("profiles: %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	for name, p := range c.Profiles {
		p.CA, p.Cert, p.Key, p.TokenFile = resolvePath(dir, p.CA), resolvePath(dir, p.Cert), resolvePath(dir, p.Key), resolvePath(dir, p.TokenFile)
		c.Profiles[name] = p
	}
	return &c, nil
}

func resolvePath(dir, p string) string {
	switch {
	case p == "", filepath.IsAbs(p):
		return p
	case strings.HasPrefix(p, "~/"):
		if h, err := os.UserHomeDir(); err == nil {
			return filepath.Join(h, p[2:])
		}
	}
	return filepath.Join(dir, p)
}

// selectProfile returns the profile named by name (-profile or
// TETHER_PROFILE), else the config's default one, else none. A named
// profile that does not exist is an error.
func (c *Config) selectProfile(name, path string) (string, Profile, error) {
	if name == "" {
		name = c.DefaultProfile
		if name == "" {
			return "", Profile{}, nil
		}
	}
	p, ok := c.Profiles[name]
	if !ok {
		return "", Profile{}, fmt.Errorf("profile %q is not in %s (tetherctl profiles lists them)", name, path)
	}
	return name, p, nil
}

// token returns the profile's bearer token (from token_file when set).
func (p Profile) token() (string, error) {
	if p.TokenFile == "" {
		return p.Token, nil
	}
	b, err := os.ReadFile(p.TokenFile)
	if err != nil {
		return "", fmt.Errorf("profile token_file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// profilesCmd lists the profiles of the config file and marks the selected one.
func profilesCmd(c *Config, path, selected string, args []string, w io.Writer) error {
	fs := newFlagSet("profiles")
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Path     string `json:"path"`
			Selected string `json:"selected,omitempty"`
			*Config
		}{path, selected, c})
	}
	names := make([]string, 0, len(c.Profiles))
	for n := range c.Profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "profiles file: %s\n", path)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\tPROFILE\tADDRESS\tCOMPANY\tTLS\tTOKEN")
	for _, n := range names {
		p := c.Profiles[n]
		mark := ""
		if n == selected {
			mark = "*"
		}
		tls := "-"
		if p.CA != "" {
			tls = "ca"
			if p.Cert != "" {
				tls = "mtls"
			}
		}
		tok := "-"
		switch {
		case p.TokenFile != "":
			tok = "file"
		case p.Token != "":
			tok = "inline"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", mark, n, p.Address, p.Company, tls, tok)
	}
	return tw.Flush()
}
