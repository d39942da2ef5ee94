package store

// PreviousInScopeSQL is previousInScopeSQL, for the plan tests.
const PreviousInScopeSQL = previousInScopeSQL

// PriorRunsSQL is priorRunsSQL, for the plan tests.
const PriorRunsSQL = priorRunsSQL

// ClaimedHere is claimedHere, for the allocation test.
var ClaimedHere = claimedHere
