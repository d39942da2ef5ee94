// Package placement holds the label language of the fleet (SPEC F1, F2):
// gateways carry labels such as zone=a,gpu=false, and a run's placement
// names the labels its gateway must have.
package placement

import (
	"fmt"
	"sort"
	"strings"
)

// ParseLabels reads "k=v,k2=v2" (spaces around entries ignored) into a map;
// every entry needs a non-empty key, and keys are unique.
func ParseLabels(s string) (map[string]string, error) {
	out := map[string]string{}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		k, v, ok := strings.Cut(entry, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want key=value", entry)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("label %q given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// FormatLabels writes labels as "k=v,k2=v2", keys sorted.
func FormatLabels(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, ",")
}

// Satisfies reports whether a gateway's labels hold every wanted label
// with its value.
func Satisfies(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}
