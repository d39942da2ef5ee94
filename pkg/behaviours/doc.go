// Package behaviours holds the check that docs/behaviours.md, the
// project's catalogue of behaviour IDs (E7, R13, …), names every ID a test
// or a comment cites: a test named TestE7_… or a comment citing "SPEC E7"
// must find E7 explained there. It has no code of its own; its test walks
// the repository.
package behaviours
