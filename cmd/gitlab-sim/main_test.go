package main

import "testing"

// -h prints the flags and exits 0 (it exited 1 with "flag: help requested"); a flag
// the simulator does not know is a usage error, 2; a bad value of a known one, 1.
func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"-h"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"-no-such-flag"}, 2},
		{[]string{"-merge-method", "squash-everything"}, 1},
	} {
		if got := exitCode(run(c.args)); got != c.want {
			t.Errorf("gitlab-sim %v: exit %d, want %d", c.args, got, c.want)
		}
	}
}
