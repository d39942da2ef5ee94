package store

import "time"

// PreviousInScopeSQL is previousInScopeSQL, for the plan tests.
const PreviousInScopeSQL = previousInScopeSQL

// PriorRunsSQL is priorRunsSQL, for the plan tests.
const PriorRunsSQL = priorRunsSQL

// ClaimedHere is claimedHere, for the allocation test.
var ClaimedHere = claimedHere

// SetBusyScopeMemory sets how long a queued submission marks its scope
// busy (busyScopes), for the tests.
func SetBusyScopeMemory(s *Store, d time.Duration) { s.busy.memory = d }
