package store

import "context"

// SetAdmitAfterRead installs a hook that runs in every admission group after its read
// and before its writes (nil removes it). Tests only; not safe while groups run.
func SetAdmitAfterRead(f func(ctx context.Context)) { admitAfterRead = f }
