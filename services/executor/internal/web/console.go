package web

import (
	"embed"
	"io/fs"
	"net/http"
)

// consoleFiles is the operator console (SPEC U4): static HTML, CSS and
// plain JavaScript with no build step and nothing loaded from elsewhere.
// It calls the API of the same origin with the user's bearer token, so
// the executor's authorization decides what it shows.
//
//go:embed console
var consoleFiles embed.FS

// consoleCSP allows the page only its own files and calls to its own
// origin: API data is rendered as text, never as markup, and this keeps
// anything that slipped through from loading or sending elsewhere.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Console serves the console at /console/ and redirects / there.
func Console() http.Handler {
	sub, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/console/", http.FileServerFS(sub))
	mux := http.NewServeMux()
	mux.Handle("GET /console/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", consoleCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
	mux.Handle("GET /{$}", http.RedirectHandler("/console/", http.StatusFound))
	return mux
}
