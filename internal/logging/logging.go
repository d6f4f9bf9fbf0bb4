// Package logging builds batcherd's slog logger: tint's coloured text for humans on a
// terminal, JSON for machines (Kubernetes, journald collectors) otherwise.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"
)

// New returns a logger writing to w. format is "text", "json" or "" (text when w is a
// terminal, else JSON); level is debug, info, warn or error.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("BATCHERD_LOG_LEVEL: %q is not debug, info, warn or error", level)
	}
	switch strings.ToLower(format) {
	case "":
		if isTerminal(w) {
			format = "text"
		} else {
			format = "json"
		}
	case "text", "json":
	default:
		return nil, fmt.Errorf("BATCHERD_LOG_FORMAT: %q is not text or json", format)
	}
	if strings.ToLower(format) == "text" {
		return slog.New(tint.NewHandler(w, &tint.Options{
			Level:      lvl,
			TimeFormat: time.TimeOnly + ".000",
			NoColor:    !isTerminal(w),
		})), nil
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl})), nil
}

// Discard returns a logger that drops everything (tests).
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
