package main

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// version, when set at build time (-ldflags "-X main.version=v1.2.3", as the Dockerfile's
// VERSION does), names the release; otherwise the main module's version from the build
// info is used (Go derives it from the VCS tag or pseudo-version, "(devel)" without one).
var version = ""

// buildVersion is what `batcherd version` prints: the version and the VCS revision the
// go command stamped into the binary (absent when built outside a checkout, e.g. from
// a source tree without .git).
type buildVersion struct {
	Version  string
	Revision string
	Time     string
	Modified bool
	Go       string
}

func currentVersion() buildVersion {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return readBuildVersion(info, version)
}

// readBuildVersion reads info (nil when the binary has none) under the version stamped
// with -ldflags ("" when none).
func readBuildVersion(info *debug.BuildInfo, stamped string) buildVersion {
	b := buildVersion{Version: stamped}
	if info == nil {
		if b.Version == "" {
			b.Version = "unknown"
		}
		return b
	}
	b.Go = info.GoVersion
	if b.Version == "" {
		b.Version = info.Main.Version
	}
	if b.Version == "" || b.Version == "(devel)" {
		b.Version = "devel"
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// String is the one line `batcherd version` prints.
func (b buildVersion) String() string {
	rev := "revision unknown (built outside a VCS checkout)"
	if b.Revision != "" {
		rev = "revision " + b.Revision
		if b.Modified {
			rev += " with uncommitted changes"
		}
		if b.Time != "" {
			rev += ", committed " + b.Time
		}
	}
	parts := []string{rev}
	if b.Go != "" {
		parts = append(parts, b.Go)
	}
	return fmt.Sprintf("batcherd %s (%s)", b.Version, strings.Join(parts, "; "))
}
