package usage

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// decode round-trips a literal through encoding/json so the tests see what
// the executor sees on the wire.
func decode(t *testing.T, src string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(src), &m))
	return m
}

func TestE1_ReadsRunnerRunDeltaTokensAndProviderCost(t *testing.T) {
	seed := `{
		"total":    {"inputTokens": 20000, "outputTokens": 500, "cacheReadTokens": 8000, "providerCostUsd": 0.12},
		"runDelta": {"inputTokens": 4200,  "outputTokens": 180, "cacheReadTokens": 1500, "providerCostUsd": 0.031}
	}`
	tests := []struct {
		name     string
		raw      string
		want     Usage
		wantCost float64
		hasCost  bool
	}{
		{"seed", seed, Usage{4200, 180, 1500}, 0.031, true},
		{"total only", `{"total": {"inputTokens": 20000, "outputTokens": 500, "cacheReadTokens": 8000, "providerCostUsd": 0.12}}`,
			Usage{20000, 500, 8000}, 0.12, true},
		{"delta without cost does not borrow the session total's cost",
			`{"total": {"inputTokens": 9, "providerCostUsd": 0.12}, "runDelta": {"inputTokens": 4}}`,
			Usage{InputTokens: 4}, 0, false},
		{"nested under usage", `{"usage": {"runDelta": {"input": 7, "output": 3, "cachedInputTokens": 2}}}`,
			Usage{7, 3, 2}, 0, false},
		{"root cost wins over the measurement", `{"costUsd": 0.5, "runDelta": {"inputTokens": 1, "providerCostUsd": 0.1}}`,
			Usage{InputTokens: 1}, 0.5, true},
		{"prompt/completion aliases and cache.read", `{"promptTokens": 11, "completionTokens": 5, "cache": {"read": 4}}`,
			Usage{11, 5, 4}, 0, false},
		{"negative and fractional counts", `{"runDelta": {"inputTokens": -5, "outputTokens": 2.9}}`,
			Usage{OutputTokens: 2}, 0, false},
		{"negative cost is no cost", `{"runDelta": {"inputTokens": 1, "providerCostUsd": -1}}`,
			Usage{InputTokens: 1}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := decode(t, tc.raw)
			got, ok := Normalize(raw)
			require.True(t, ok)
			require.Equal(t, tc.want, got)
			cost, ok := CostUSD(raw)
			require.Equal(t, tc.hasCost, ok)
			require.Equal(t, tc.wantCost, cost)
		})
	}

	t.Run("no measurement", func(t *testing.T) {
		for _, raw := range []map[string]any{nil, {}, {"runDelta": map[string]any{"inputTokens": "12"}}} {
			_, ok := Normalize(raw)
			require.False(t, ok)
		}
	})
}

func TestE1_ReadsACPXCumulativeUsageAndUSDCostObject(t *testing.T) {
	tests := []struct {
		name     string
		raw      map[string]any
		want     Usage
		wantCost float64
	}{
		{"seed (decoded JSON)", decode(t, `{
			"cumulative": {"inputTokens": 3000, "outputTokens": 240, "cachedReadTokens": 900},
			"cost": {"amount": 0.044, "currency": "USD"}
		}`), Usage{3000, 240, 900}, 0.044},
		{"seed (Go integers)", map[string]any{
			"cumulative": map[string]any{"inputTokens": 3_000, "outputTokens": int64(240), "cachedReadTokens": json.Number("900")},
			"cost":       map[string]any{"amount": 0.044, "currency": "USD"},
		}, Usage{3000, 240, 900}, 0.044},
		{"lower-case usd and cost.total", decode(t, `{
			"cumulative": {"inputTokens": 1, "outputTokens": 2},
			"cost": {"total": 0.5, "currency": " usd "}
		}`), Usage{1, 2, 0}, 0.5},
		{"cost under usage", decode(t, `{
			"usage": {"cumulative": {"inputTokens": 1}, "cost": {"amount": 0.25, "currency": "USD"}}
		}`), Usage{InputTokens: 1}, 0.25},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Normalize(tc.raw)
			require.True(t, ok)
			require.Equal(t, tc.want, got)
			cost, ok := CostUSD(tc.raw)
			require.True(t, ok)
			require.Equal(t, tc.wantCost, cost)
		})
	}

}

func TestE1_NonUSDAmountIsNotTreatedAsDollars(t *testing.T) {
	tests := []struct {
		name string
		raw  string
	}{
		{"seed: EUR", `{"cost": {"amount": 1.25, "currency": "EUR"}}`},
		{"GBP with tokens", `{"cumulative": {"inputTokens": 10}, "cost": {"amount": 3, "currency": "GBP"}}`},
		{"no currency", `{"cost": {"amount": 1.25}}`},
		{"currency not a string", `{"cost": {"amount": 1.25, "currency": 840}}`},
		{"USD without an amount", `{"cost": {"currency": "USD"}}`},
		{"amount not a number", `{"cost": {"amount": "1.25", "currency": "USD"}}`},
		{"nothing", `{}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cost, ok := CostUSD(decode(t, tc.raw))
			require.False(t, ok)
			require.Zero(t, cost)
		})
	}
}
