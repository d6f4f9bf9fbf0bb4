// Package logging builds batcherd's slog logger: tint's coloured text for humans on a
// terminal, JSON for machines (Kubernetes, journald collectors) otherwise. Logs go to
// stderr (cmd/batcherd); stdout carries only what a subcommand prints as its result.
//
// Two rules hold for every line, whichever component writes it: a key appears once
// (components add their own context, e.g. the app and the scanner both add replica,
// and the inner value wins), and durations are strings such as "20s" (slog's JSON
// handler writes them as integer nanoseconds).
package logging

import (
	"context"
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
	var h slog.Handler
	if strings.ToLower(format) == "text" {
		h = tint.NewHandler(w, &tint.Options{
			Level:       lvl,
			TimeFormat:  time.TimeOnly + ".000",
			NoColor:     !isTerminal(w),
			ReplaceAttr: durationAsString,
		})
	} else {
		h = slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationAsString})
	}
	return slog.New(UniqueKeys(h)), nil
}

// durationAsString writes a duration as Go writes it ("20s", "1.5ms"): readable, and
// parseable by time.ParseDuration.
func durationAsString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// Discard returns a logger that drops everything (tests).
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// UniqueKeys wraps h so that a line never carries a key twice: of the attributes added
// with Logger.With and those of the record, the latest value of a key is written, at
// the place the key first appeared. Keys inside a group (Logger.WithGroup) are apart
// from those outside it.
func UniqueKeys(h slog.Handler) slog.Handler { return &uniqueKeys{next: h} }

type uniqueKeys struct {
	next  slog.Handler // with the attributes of enclosing groups already applied
	attrs []slog.Attr  // added since the innermost group, each key once
}

func (h *uniqueKeys) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *uniqueKeys) WithAttrs(as []slog.Attr) slog.Handler {
	return &uniqueKeys{next: h.next, attrs: mergeAttrs(h.attrs, as)}
}

func (h *uniqueKeys) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &uniqueKeys{next: h.next.WithAttrs(h.attrs).WithGroup(name)}
}

func (h *uniqueKeys) Handle(ctx context.Context, r slog.Record) error {
	own := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		own = append(own, a)
		return true
	})
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(mergeAttrs(h.attrs, own)...)
	return h.next.Handle(ctx, out)
}

// mergeAttrs returns base with add applied: a key already present takes the new value
// in place, a new key is appended. Attributes without a key (an inlined group) are
// kept as they are.
func mergeAttrs(base, add []slog.Attr) []slog.Attr {
	out := make([]slog.Attr, len(base), len(base)+len(add))
	copy(out, base)
	for _, a := range add {
		i := -1
		if a.Key != "" {
			for j := range out {
				if out[j].Key == a.Key {
					i = j
					break
				}
			}
		}
		if i >= 0 {
			out[i] = a
		} else {
			out = append(out, a)
		}
	}
	return out
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
