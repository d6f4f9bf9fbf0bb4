// Command batcherd turns approved change requests into one GitLab merge request per
// round per repository. It is a thin shell: it parses the subcommand and the
// environment, builds the logger and hands over to internal/app.
//
// Exit codes: 0 success; 1 failure at run time (database unreachable, verify found
// violations, serve stopped on an error); 2 bad usage or configuration; 3 schema drift
// (check-schema, and serve refusing to start).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/batcherd/batcherd/internal/app"
	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/logging"
)

type command struct {
	name, summary string
	need          config.Need
	run           func(ctx context.Context, cfg *config.Config, env app.Env) error
}

var commands = []command{
	{"serve", "run the HTTP API and every loop (the normal mode of every replica)", config.Need{DB: true, GitLab: true, Serve: true}, app.Serve},
	{"migrate", "apply the embedded schema migrations, then verify the schema", config.Need{DB: true}, app.Migrate},
	{"check-schema", "verify the live schema has every constraint batcherd relies on (I8)", config.Need{DB: true}, app.CheckSchema},
	{"verify", "audit a live database read-only for invariant violations", config.Need{DB: true}, app.Verify},
	{"version", "print the version and the VCS revision it was built from", config.Need{}, nil},
	{"help", "list subcommands and every BATCHERD_* variable", config.Need{}, nil},
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return app.ExitUsage
	}
	name := args[0]
	if name == "-h" || name == "--help" {
		name = "help"
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "batcherd: unknown subcommand %q\n\n", name)
		usage(stderr)
		return app.ExitUsage
	}
	for _, a := range args[1:] {
		if a == "-h" || a == "--help" || a == "help" {
			fmt.Fprintf(stdout, "batcherd %s: %s\n\n", cmd.name, cmd.summary)
			printVars(stdout)
			return app.ExitOK
		}
	}
	if len(args) > 1 {
		fmt.Fprintf(stderr, "batcherd %s takes no arguments (configuration comes from BATCHERD_* variables); got %q\n", cmd.name, strings.Join(args[1:], " "))
		return app.ExitUsage
	}
	switch cmd.name {
	case "version":
		fmt.Fprintln(stdout, currentVersion())
		return app.ExitOK
	case "help":
		usage(stdout)
		return app.ExitOK
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := config.Load(ctx, nil)
	if err == nil {
		err = app.ValidateConfig(cfg, cmd.need)
	}
	if err != nil {
		fmt.Fprintf(stderr, "batcherd %s: invalid configuration:\n  %s\nRun 'batcherd help' for every variable.\n",
			cmd.name, strings.ReplaceAll(err.Error(), "\n", "\n  "))
		return app.ExitUsage
	}
	log, err := logging.New(stderr, cfg.LogFormat, cfg.LogLevel)
	if err != nil {
		fmt.Fprintf(stderr, "batcherd: %v\n", err)
		return app.ExitUsage
	}
	err = cmd.run(ctx, cfg, app.Env{Log: log, Stdout: stdout, Version: currentVersion().Version})
	if err == nil {
		return app.ExitOK
	}
	code := app.ExitCode(err)
	// A schema batcherd refuses is an operator's to fix: plain lines, the fix first, one
	// per problem (in a log record they were one line of 2,000 characters).
	var schema *app.SchemaError
	if errors.As(err, &schema) {
		fmt.Fprintf(stderr, "batcherd %s: %s\n", cmd.name, strings.Join(schema.Lines(), "\n  "))
		return code
	}
	if !errors.Is(err, context.Canceled) {
		log.Error("batcherd "+cmd.name+" failed", "err", err)
	}
	return code
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "batcherd %s — one GitLab merge request per round per repository\n\nUsage: batcherd <subcommand>\n\nSubcommands:\n", currentVersion().Version)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nExit codes: 0 ok, 1 failure, 2 bad usage or configuration, 3 schema drift.")
	fmt.Fprintln(w)
	printVars(w)
}

func printVars(w io.Writer) {
	fmt.Fprintln(w, "Environment (every setting is a BATCHERD_* variable):")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, v := range config.Vars() {
		def := v.Default
		if def == "" {
			def = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", v.Name, def, v.Desc)
	}
	tw.Flush()
}
