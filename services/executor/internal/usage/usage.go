// Package usage normalises the token usage and cost that providers report
// (SPEC E1).
//
// Two shapes arrive at the executor:
//
//   - runner: {total, runDelta}. total is cumulative for the provider
//     session; runDelta is what this run consumed. runDelta is preferred.
//   - ACPX: {cumulative, cost}. cost is {amount, currency}.
//
// Both are reduced to a [Usage] of input, output and cached-input tokens
// ([Normalize]), and a dollar cost ([CostUSD]). The executor's store applies
// them to a run.terminal event's usage when it records the run's result.
// Cost is reported in US dollars only: runDelta.providerCostUsd when present,
// otherwise cost.amount when, and only when, cost.currency is "USD". An
// amount in any other currency yields no cost; it is never converted.
//
// Everything here is a pure function of its arguments.
package usage

import (
	"encoding/json"
	"math"
	"strings"
)

// Usage is the normalised token usage of one run.
type Usage struct {
	InputTokens       int64 `json:"inputTokens"`
	OutputTokens      int64 `json:"outputTokens"`
	CachedInputTokens int64 `json:"cachedInputTokens"`
}

// Field aliases, in order of preference.
var (
	inputKeys  = []string{"inputTokens", "input", "promptTokens", "input_tokens", "prompt_tokens"}
	outputKeys = []string{"outputTokens", "output", "completionTokens", "output_tokens", "completion_tokens"}
	cachedKeys = []string{
		"cachedInputTokens", "cacheReadInputTokens", "cacheReadTokens", "cachedReadTokens",
		"cached_input_tokens", "cache_read_input_tokens",
	}
	costKeys = []string{"providerCostUsd", "cacheAdjustedCostUsd", "costUsd"}
)

// Normalize reads usage decoded from JSON (objects as map[string]any,
// numbers as float64, json.Number or Go integers). It looks for the first
// object carrying an input or output token count among, in order:
// runDelta, usage.runDelta, total, usage.total, cumulative,
// usage.cumulative, usage, and the root itself. ok is false when none does.
//
// Counts that are missing, negative, non-finite or not numbers read as 0;
// fractions are truncated.
func Normalize(raw map[string]any) (u Usage, ok bool) {
	m := measurement(raw)
	if m == nil {
		return Usage{}, false
	}
	return Usage{
		InputTokens:       firstCount(m, inputKeys),
		OutputTokens:      firstCount(m, outputKeys),
		CachedInputTokens: cachedCount(m),
	}, true
}

// CostUSD returns the dollar cost of usage decoded from JSON: the first of
// providerCostUsd, cacheAdjustedCostUsd, costUsd on the root and then on the
// object [Normalize] measures; otherwise cost.amount (or cost.total) when
// cost.currency is "USD" (case-insensitive). A cost without a currency, or
// in any other currency, gives no cost. Negative or non-finite amounts give
// no cost.
func CostUSD(raw map[string]any) (float64, bool) {
	for _, obj := range []map[string]any{raw, measurement(raw)} {
		if obj == nil {
			continue
		}
		for _, k := range costKeys {
			if v, ok := number(obj[k]); ok {
				return validCost(v)
			}
		}
	}
	for _, obj := range []map[string]any{raw, object(raw, "usage")} {
		cost := object(obj, "cost")
		if cost == nil {
			continue
		}
		cur, _ := cost["currency"].(string)
		if !isUSD(cur) {
			return 0, false
		}
		for _, k := range []string{"amount", "total"} {
			if v, ok := number(cost[k]); ok {
				return validCost(v)
			}
		}
		return 0, false
	}
	return 0, false
}

func measurement(raw map[string]any) map[string]any {
	if raw == nil {
		return nil
	}
	inner := object(raw, "usage")
	candidates := []map[string]any{
		object(raw, "runDelta"),
		object(inner, "runDelta"),
		object(raw, "total"),
		object(inner, "total"),
		object(raw, "cumulative"),
		object(inner, "cumulative"),
		inner,
		raw,
	}
	for _, c := range candidates {
		if c != nil && hasTokens(c) {
			return c
		}
	}
	return nil
}

func hasTokens(m map[string]any) bool {
	for _, keys := range [][]string{inputKeys, outputKeys} {
		for _, k := range keys {
			if _, ok := number(m[k]); ok {
				return true
			}
		}
	}
	return false
}

func cachedCount(m map[string]any) int64 {
	for _, k := range cachedKeys {
		if v, ok := number(m[k]); ok {
			return count(v)
		}
	}
	if v, ok := number(object(m, "cache")["read"]); ok {
		return count(v)
	}
	return 0
}

func firstCount(m map[string]any, keys []string) int64 {
	for _, k := range keys {
		if v, ok := number(m[k]); ok {
			return count(v)
		}
	}
	return 0
}

func object(m map[string]any, key string) map[string]any {
	if m == nil {
		return nil
	}
	o, _ := m[key].(map[string]any)
	return o
}

// number accepts the numeric types encoding/json and hand-built maps use.
func number(v any) (float64, bool) {
	var f float64
	switch n := v.(type) {
	case float64:
		f = n
	case float32:
		f = float64(n)
	case int:
		f = float64(n)
	case int64:
		f = float64(n)
	case int32:
		f = float64(n)
	case uint64:
		f = float64(n)
	case uint32:
		f = float64(n)
	case json.Number:
		p, err := n.Float64()
		if err != nil {
			return 0, false
		}
		f = p
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

func count(f float64) int64 {
	switch {
	case f <= 0:
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(f)
}

func validCost(f float64) (float64, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	return f, true
}

func isUSD(currency string) bool {
	return strings.EqualFold(strings.TrimSpace(currency), "USD")
}
