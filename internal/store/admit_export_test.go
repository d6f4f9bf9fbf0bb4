package store

import "context"

// SetAdmitAfterRead installs a hook that runs in every admission group after its read
// and before its writes (nil removes it). Tests only; not safe while groups run.
func SetAdmitAfterRead(f func(ctx context.Context)) { admitAfterRead = f }

// SetAutoincStep makes st's admission groups take the ids of a multi-row INSERT as
// first, first+step, … (step > 0) or read them back (0: what a server with interleaved
// auto-increment, such as Galera, needs) instead of asking the server. Tests only.
func SetAutoincStep(st *Store, step int64) {
	a := st.admitter()
	a.autoincOnce.Do(func() {})
	a.autoincStep = step
}
