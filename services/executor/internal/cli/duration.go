package cli

import "time"

func secondsDuration(s int64) time.Duration { return time.Duration(s) * time.Second }
