package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// secretsCmd writes, lists and deletes a company's secrets (SPEC T3):
//
//	secrets put -name N [-company C] [-value-file F]   (the value from F, else stdin)
//	secrets list [-company C] [-json]
//	secrets delete -name N [-company C]
//
// No command ever prints a value: the executor returns none.
func secretsCmd(ctx context.Context, c executorv1.ExecutorServiceClient, args []string, stdin io.Reader, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("secrets: want put, list or delete")
	}
	fs := flag.NewFlagSet("secrets "+args[0], flag.ContinueOnError)
	company := fs.String("company", DefaultCompany, "company id")
	name := fs.String("name", "", "secret name (what runs name in environment.secret_refs, or submit -secret ENV=NAME)")
	valueFile := fs.String("value-file", "", "put: read the value from this file (default: stdin); a trailing newline is dropped")
	asJSON := fs.Bool("json", false, "print raw JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "put":
		if *name == "" {
			return errors.New("secrets put: -name is required")
		}
		var (
			value []byte
			err   error
		)
		if *valueFile != "" {
			value, err = os.ReadFile(*valueFile)
		} else {
			value, err = io.ReadAll(io.LimitReader(stdin, 64<<10))
		}
		if err != nil {
			return err
		}
		value = []byte(strings.TrimRight(string(value), "\r\n"))
		resp, err := c.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: *company, Name: *name, Value: value})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "stored secret %s of %s, version %d\n", resp.GetSecret().GetName(), *company, resp.GetSecret().GetVersion())
	case "list":
		resp, err := c.ListSecrets(ctx, &executorv1.ListSecretsRequest{CompanyId: *company})
		if err != nil {
			return err
		}
		if *asJSON {
			printJSON(resp)
			return nil
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tVERSION\tUPDATED\tBY")
		for _, s := range resp.GetSecrets() {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", s.GetName(), s.GetVersion(), s.GetUpdatedAt().AsTime().Format("2006-01-02T15:04:05Z"), s.GetUpdatedBy())
		}
		return tw.Flush()
	case "delete":
		if *name == "" {
			return errors.New("secrets delete: -name is required")
		}
		resp, err := c.DeleteSecret(ctx, &executorv1.DeleteSecretRequest{CompanyId: *company, Name: *name})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "deleted secret %s of %s (version %d)\n", resp.GetSecret().GetName(), *company, resp.GetSecret().GetVersion())
	default:
		return fmt.Errorf("secrets: unknown command %q (want put, list or delete)", args[0])
	}
	return nil
}

// secretRefs is submit's repeated -secret ENV=NAME.
type secretRefs map[string]string

func (s secretRefs) String() string { return fmt.Sprint(map[string]string(s)) }

func (s secretRefs) Set(v string) error {
	env, name, ok := strings.Cut(v, "=")
	if !ok || env == "" || name == "" {
		return fmt.Errorf("-secret %q: want ENV=SECRET_NAME", v)
	}
	s[env] = name
	return nil
}
