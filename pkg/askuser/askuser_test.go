package askuser

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestE4_ParseValidatesTheToolArguments(t *testing.T) {
	tests := []struct {
		name    string
		args    string
		wantErr bool
		kind    string
		qs      int
	}{
		{"questions", `{"title":"T","questions":[{"id":"q","prompt":"P","options":[{"id":"a","label":"A"}]}]}`, false, KindAskUserQuestions, 1},
		{"free text", `{"title":"T","questions":[{"id":"q","prompt":"P"}]}`, false, KindAskUserQuestions, 1},
		{"confirmation", `{"kind":"request_confirmation","title":"Ship it?"}`, false, KindRequestConfirmation, 1},
		{"item verdicts", `{"kind":"request_item_verdicts","title":"T","items":[{"id":"i1","label":"one"},{"id":"i2","label":"two"}]}`, false, KindRequestItemVerdicts, 2},
		{"no title", `{"questions":[{"id":"q","prompt":"P"}]}`, true, "", 0},
		{"no questions", `{"title":"T"}`, true, "", 0},
		{"duplicate question", `{"title":"T","questions":[{"id":"q","prompt":"P"},{"id":"q","prompt":"P"}]}`, true, "", 0},
		{"duplicate option", `{"title":"T","questions":[{"id":"q","prompt":"P","options":[{"id":"a","label":"A"},{"id":"a","label":"B"}]}]}`, true, "", 0},
		{"bad kind", `{"kind":"other","title":"T"}`, true, "", 0},
		{"not an object", `[1]`, true, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse([]byte(tc.args))
			if tc.wantErr {
				require.True(t, errors.Is(err, ErrInvalid), "%v", err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.kind, r.Kind)
			require.Len(t, r.Questions, tc.qs)
		})
	}
}
