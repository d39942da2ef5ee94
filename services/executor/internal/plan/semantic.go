package plan

import (
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tether-run/tether/pkg/prp"
)

// DefaultTitle is the heading used when a plan carries no title of its own.
const DefaultTitle = "Plan"

// MaxRefBytes bounds the artifact refs and summaries that are parsed;
// anything longer is not a plan.
const MaxRefBytes = 64 << 10

// Artifact is one semantic result artifact.
type Artifact struct {
	Kind string
	Ref  string
}

// SemanticResult is the part of a semantic run result a plan is read from.
type SemanticResult struct {
	Summary   string
	Artifacts []Artifact
}

// SemanticMarkdown returns the plan carried by r: the first
// native_provider_plan artifact whose ref decodes ([RefMarkdown]); when
// every such artifact is opaque, the result summary if it is an explicitly
// numbered plan ([SummaryMarkdown]). ok is false when r has no
// native_provider_plan artifact or nothing decodes.
func SemanticMarkdown(r SemanticResult) (md string, ok bool) {
	found := false
	for _, a := range r.Artifacts {
		if a.Kind != prp.ArtifactKindPlan {
			continue
		}
		found = true
		if md, ok := RefMarkdown(a.Ref); ok {
			return md, true
		}
	}
	if !found {
		return "", false
	}
	return SummaryMarkdown(r.Summary)
}

// Compact reference prefixes.
const (
	refPrefix = "native-provider-plan:"
	uriPrefix = "native-plan://"
)

// RefMarkdown decodes one native_provider_plan artifact ref. Recognised
// encodings, tried in this order:
//
//  1. A <proposed_plan>…</proposed_plan> block: its trimmed body (the last
//     non-empty block wins).
//  2. A compact reference "native-provider-plan:<slug>[#<steps>]" or a
//     task-scoped URI "native-plan://<TASK>/<slug>[#<steps>]". The title
//     comes from the slug (task key and -vN suffix dropped, words
//     de-hyphenated, first letter capitalised). Markdown lines after the
//     reference line are kept verbatim as the body; otherwise <steps> is
//     "1-step-words;2-more-words" and each step is de-hyphenated, with
//     well-known tokens restored (GET health → GET /health, json → JSON,
//     api → API, ...).
//  3. A Markdown document that starts with a "# " heading, verbatim.
//  4. An inline numbered list, optionally after a label ending in ':':
//     "1. a | 2. b | 3. c", "TASK-1 plan: (1) a; (2) b; (3) c." or
//     "1) a; 2) b". Item text is kept as written, minus list separators.
//
// Results are "# <title>\n\n<body>"; the title is "Plan" when none is
// known. ok is false for anything else (an opaque ref).
func RefMarkdown(ref string) (md string, ok bool) {
	if len(ref) > MaxRefBytes || !utf8.ValidString(ref) {
		return "", false
	}
	ref = normalizeNewlines(ref)
	if body, ok := proposedPlan(ref); ok {
		return body, true
	}
	s := strings.TrimSpace(ref)
	if s == "" {
		return "", false
	}
	if md, ok, matched := compactRef(s); matched {
		return md, ok
	}
	if strings.HasPrefix(s, "# ") && strings.TrimSpace(s[2:]) != "" {
		return s, true
	}
	if items, ok := inlineItems(s); ok {
		return render(DefaultTitle, items), true
	}
	return "", false
}

// SummaryMarkdown decodes a semantic result summary that states the plan
// explicitly: a <proposed_plan> block, or an inline numbered list such as
// "Plan completed: 1) a; 2) b; 3) c." (see [RefMarkdown], encoding 4).
// Numbering must start at 1 and be consecutive.
func SummaryMarkdown(summary string) (md string, ok bool) {
	if len(summary) > MaxRefBytes || !utf8.ValidString(summary) {
		return "", false
	}
	summary = normalizeNewlines(summary)
	if body, ok := proposedPlan(summary); ok {
		return body, true
	}
	if items, ok := inlineItems(strings.TrimSpace(summary)); ok {
		return render(DefaultTitle, items), true
	}
	return "", false
}

func render(title string, items []string) string {
	var b strings.Builder
	b.WriteString("# ")
	b.WriteString(title)
	b.WriteString("\n\n")
	for i, it := range items {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(strconv.Itoa(i + 1))
		b.WriteString(". ")
		b.WriteString(it)
	}
	return b.String()
}

// proposedPlan returns the trimmed body of the last non-empty, closed
// <proposed_plan> block in s.
func proposedPlan(s string) (string, bool) {
	const open, closing = "<proposed_plan>", "</proposed_plan>"
	var last string
	for {
		i := strings.Index(s, open)
		if i < 0 {
			break
		}
		rest := s[i+len(open):]
		j := strings.Index(rest, closing)
		if j < 0 {
			break
		}
		if body := strings.TrimSpace(rest[:j]); body != "" {
			last = body
		}
		s = rest[j+len(closing):]
	}
	return last, last != ""
}

// compactRef decodes encoding 2. matched reports whether s is a compact
// reference at all; ok is false for an opaque one.
func compactRef(s string) (md string, ok, matched bool) {
	head, rest, _ := strings.Cut(s, "\n")
	head = strings.TrimSpace(head)
	var locator string
	uri := false
	switch {
	case hasPrefixFold(head, refPrefix):
		locator = head[len(refPrefix):]
	case hasPrefixFold(head, uriPrefix):
		locator, uri = head[len(uriPrefix):], true
	default:
		return "", false, false
	}
	slug, frag, _ := strings.Cut(locator, "#")
	if uri {
		slug, _, _ = strings.Cut(slug, "?")
		segs := strings.FieldsFunc(slug, func(r rune) bool { return r == '/' })
		slug = ""
		if len(segs) > 0 {
			slug = segs[len(segs)-1]
		}
	}
	title := slugTitle(unescape(slug))
	if body := strings.TrimSpace(rest); body != "" {
		if strings.HasPrefix(body, "# ") {
			return body, true, true
		}
		return "# " + title + "\n\n" + body, true, true
	}
	steps := fragmentSteps(unescape(frag))
	if len(steps) == 0 {
		return "", false, true
	}
	return render(title, steps), true, true
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	u, err := url.PathUnescape(s)
	if err != nil || !utf8.ValidString(u) {
		return s
	}
	return u
}

var (
	// An issue key such as DOT-14, followed by a separator or the end.
	taskKeyPrefix = regexp.MustCompile(`^[A-Z][A-Z0-9]*-[0-9]+(?:[-:/_.]+|$)`)
	// A version suffix such as -v1.
	versionSuffix = regexp.MustCompile(`(?i)[-_]v[0-9]+$`)
	// A step's leading number in a compact fragment: "1-", "2.", "3)".
	stepNumber = regexp.MustCompile(`^[0-9]{1,4}[-.)_ ]+`)
)

// slugTitle turns "DOT-14-health-check-v1" into "Health check".
func slugTitle(slug string) string {
	s := strings.TrimSpace(slug)
	s = taskKeyPrefix.ReplaceAllString(s, "")
	if i := strings.LastIndexAny(s, ":/"); i >= 0 {
		s = s[i+1:]
	}
	s = versionSuffix.ReplaceAllString(s, "")
	if t := phrase(splitWords(s)); t != "" {
		return truncateRunes(t, MaxStepRunes)
	}
	return DefaultTitle
}

// fragmentSteps decodes "1-step-words;2-more-words".
func fragmentSteps(frag string) []string {
	var steps []string
	for _, part := range strings.Split(frag, ";") {
		part = stepNumber.ReplaceAllString(strings.TrimSpace(part), "")
		if p := phrase(splitWords(part)); p != "" {
			steps = append(steps, truncateRunes(p, MaxStepRunes))
			if len(steps) == MaxSteps {
				break
			}
		}
	}
	return steps
}

func splitWords(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool {
		return r == '-' || r == '_' || r == '+' || unicode.IsSpace(r)
	})
}

// httpMethods are restored with the next word as a path: GET health →
// GET /health.
var httpMethods = map[string]bool{
	"GET": true, "POST": true, "PUT": true, "PATCH": true, "DELETE": true, "HEAD": true, "OPTIONS": true,
}

// acronyms are restored to their conventional spelling whatever the case in
// the slug.
var acronyms = map[string]string{}

func init() {
	for _, a := range []string{
		"API", "JSON", "HTTP", "HTTPS", "URL", "URI", "SQL", "CLI", "YAML", "HTML",
		"CSS", "XML", "TLS", "JWT", "UUID", "CI", "UI", "ID", "SDK", "gRPC",
	} {
		acronyms[strings.ToLower(a)] = a
	}
}

// phrase joins slug words into text: well-known tokens restored and the
// first letter capitalised.
func phrase(words []string) string {
	out := make([]string, 0, len(words))
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case httpMethods[w] && i+1 < len(words):
			out = append(out, w, "/"+strings.TrimLeft(words[i+1], "/"))
			i++
		case acronyms[strings.ToLower(w)] != "":
			out = append(out, acronyms[strings.ToLower(w)])
		default:
			out = append(out, w)
		}
	}
	s := strings.Join(out, " ")
	if r, size := utf8.DecodeRuneInString(s); size > 0 && unicode.IsLower(r) {
		s = string(unicode.ToUpper(r)) + s[size:]
	}
	return s
}

// Inline numbered list markers.
const (
	styleParen   = 'p' // (1)
	styleClose   = ')' // 1)
	styleDot     = '.' // 1.
	maxMarkerLen = 3   // digits
)

type marker struct {
	start, end int
	n          int
	style      byte
}

// inlineItems parses encoding 4: an optional label ending in ':' and items
// introduced by consecutive markers of one style starting at 1. A marker
// must follow the start of the text, whitespace or one of ":;|,", and be
// followed by whitespace. Markers with another number or style are text.
func inlineItems(s string) ([]string, bool) {
	var ms []marker
	for i := 0; i < len(s); i++ {
		if i > 0 && !markerBoundary(s[i-1]) {
			continue
		}
		m, ok := markerAt(s, i)
		if !ok || m.n != len(ms)+1 || (len(ms) > 0 && m.style != ms[0].style) {
			continue
		}
		ms = append(ms, m)
		i = m.end - 1
		if len(ms) > MaxSteps {
			return nil, false
		}
	}
	if len(ms) == 0 {
		return nil, false
	}
	label := strings.TrimSpace(s[:ms[0].start])
	if label != "" && !strings.HasSuffix(label, ":") {
		return nil, false
	}
	items := make([]string, len(ms))
	for k, m := range ms {
		end := len(s)
		if k+1 < len(ms) {
			end = ms[k+1].start
		}
		it := trimSeparators(oneLine(s[m.end:end]))
		if it == "" {
			return nil, false
		}
		items[k] = truncateRunes(it, MaxStepRunes)
	}
	return items, true
}

func markerBoundary(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\v', '\f', ':', ';', '|', ',':
		return true
	}
	return false
}

func markerAt(s string, i int) (marker, bool) {
	m := marker{start: i}
	j := i
	if s[j] == '(' {
		m.style = styleParen
		j++
	}
	k := j
	for k < len(s) && k-j < maxMarkerLen+1 && s[k] >= '0' && s[k] <= '9' {
		k++
	}
	if k == j || k-j > maxMarkerLen || k >= len(s) || s[j] == '0' {
		return m, false
	}
	n, _ := strconv.Atoi(s[j:k])
	switch {
	case m.style == styleParen && s[k] == ')':
	case m.style == 0 && (s[k] == ')' || s[k] == '.'):
		m.style = s[k]
	default:
		return m, false
	}
	k++
	if k >= len(s) || !isSpace(s[k]) {
		return m, false
	}
	m.n, m.end = n, k
	return m, true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' }

// trimSeparators drops what joins one inline item to the next: trailing
// ";", ",", "|" and a dangling "and"/"then".
func trimSeparators(s string) string {
	for {
		t := strings.TrimRight(s, " ;,|")
		for _, conj := range []string{" and", " then"} {
			if len(t) >= len(conj) && strings.EqualFold(t[len(t)-len(conj):], conj) {
				t = t[:len(t)-len(conj)]
			}
		}
		if t == s {
			return t
		}
		s = t
	}
}
