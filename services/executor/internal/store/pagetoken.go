package store

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// Page tokens of the List calls (ListRuns, ListInteractions, ListGateways).
// A token carries where the next page starts (the last row's sort key) and a
// digest of the filters of the call that issued it, so that a token sent with
// other filters is refused (page_token_filter_mismatch) instead of silently
// paging through another result set (AIP-158). Tokens are opaque to callers:
// base64url of a small JSON object; they are not secrets (a changed cursor
// only moves within what the caller may list anyway).

// pageTokenVersion is the token format's version; another is page_token_invalid.
const pageTokenVersion = 1

// pageCursor is a token's content.
type pageCursor struct {
	V int    `json:"v"`
	F string `json:"f"`
	// The last row's sort key: a sequence, a time (Unix microseconds) and
	// an id, as the list needs.
	Seq int64  `json:"s,omitempty"`
	At  int64  `json:"t,omitempty"`
	ID  string `json:"i,omitempty"`
}

// filterDigest binds a token to a list's name and filter values (in a fixed
// order per list). The caller's readable companies are part of it: a token
// is not carried from one identity's listing to another's.
func filterDigest(list string, companies []string, values ...string) string {
	h := sha256.New()
	h.Write([]byte(list))
	for _, v := range values {
		h.Write([]byte{0})
		h.Write([]byte(v))
	}
	h.Write([]byte{1})
	if companies == nil {
		h.Write([]byte("*"))
	} else {
		cs := slices.Clone(companies)
		slices.Sort(cs)
		h.Write([]byte(strings.Join(cs, "\x00")))
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// encodePageToken returns the token of the page after the row at cursor.
func encodePageToken(filter string, cursor pageCursor) string {
	cursor.V, cursor.F = pageTokenVersion, filter
	b, _ := json.Marshal(cursor)
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodePageToken reads a token issued for filter: page_token_invalid when
// it is not a token of this service, page_token_filter_mismatch when it was
// issued for other filters. The empty token is the first page (zero cursor,
// ok false).
func decodePageToken(token, filter string) (pageCursor, bool, error) {
	if token == "" {
		return pageCursor{}, false, nil
	}
	var t pageCursor
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err == nil {
		err = json.Unmarshal(raw, &t)
	}
	if err != nil || t.V != pageTokenVersion || t.F == "" {
		e := failure.New(codes.InvalidArgument, failure.PageTokenInvalid, "page_token is not one this service issued")
		e.Metadata = map[string]string{failure.MetadataField: "page_token"}
		return pageCursor{}, false, e
	}
	if t.F != filter {
		e := failure.New(codes.InvalidArgument, failure.PageTokenFilterMismatch,
			"page_token was issued for a call with other filters: repeat that call's filters, or start again without a page_token")
		e.Metadata = map[string]string{failure.MetadataField: "page_token"}
		return pageCursor{}, false, e
	}
	return t, true, nil
}

// ScopeCompanies narrows the companies a caller may read (nil: every
// company) to the one a request filters on (""): the filter never widens
// what the caller sees, and a company the caller cannot read lists nothing,
// exactly like a company without rows (SPEC T2).
func ScopeCompanies(readable []string, want string) []string {
	switch {
	case want == "":
		return readable
	case readable == nil, slices.Contains(readable, want):
		return []string{want}
	}
	return []string{}
}
