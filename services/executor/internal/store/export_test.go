package store

// PreviousInScopeSQL is previousInScopeSQL, for the plan tests.
const PreviousInScopeSQL = previousInScopeSQL
