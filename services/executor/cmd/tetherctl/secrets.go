package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// A company's secrets (SPEC T3): put, list, delete. No command ever prints
// a value: the executor returns none.

func secretsPutCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("secrets put")
	company := companyFlag(fs, "the secret's company (required)")
	name := fs.String("name", "", "secret name (what runs name in environment.secret_refs, or submit -secret ENV=NAME)")
	valueFile := fs.String("value-file", "", "read the value from this file (default: stdin); a trailing newline is dropped")
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" {
		return errors.New("secrets put: -name is required")
	}
	comp, err := c.requireCompany("secrets put", *company)
	if err != nil {
		return err
	}
	var value []byte
	if *valueFile != "" {
		value, err = os.ReadFile(*valueFile)
	} else {
		value, err = io.ReadAll(io.LimitReader(c.in, 64<<10))
	}
	if err != nil {
		return err
	}
	value = []byte(strings.TrimRight(string(value), "\r\n"))
	resp, err := c.exec.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: comp, Name: *name, Value: value})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "stored secret %s of %s, version %d\n", resp.GetSecret().GetName(), comp, resp.GetSecret().GetVersion())
		return nil
	})
}

func secretsListCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("secrets list")
	company := companyFlag(fs, "the company (required)")
	page := pagingFlags(fs, 100)
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	comp, err := c.requireCompany("secrets list", *company)
	if err != nil {
		return err
	}
	req := &executorv1.ListSecretsRequest{CompanyId: comp, PageSize: int32(*page.size), PageToken: *page.token}
	resp := &executorv1.ListSecretsResponse{}
	for {
		p, err := c.exec.ListSecrets(ctx, req)
		if err != nil {
			return err
		}
		resp.Secrets = append(resp.Secrets, p.GetSecrets()...)
		resp.NextPageToken = p.GetNextPageToken()
		if !*page.all || resp.NextPageToken == "" {
			break
		}
		req.PageToken = resp.NextPageToken
	}
	return emit(c.out, out, resp, func() error {
		defer moreHint(resp.GetNextPageToken())
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tVERSION\tUPDATED\tBY")
		for _, s := range resp.GetSecrets() {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", s.GetName(), s.GetVersion(), s.GetUpdatedAt().AsTime().Format("2006-01-02T15:04:05Z"), s.GetUpdatedBy())
		}
		return tw.Flush()
	})
}

func secretsDeleteCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("secrets delete")
	company := companyFlag(fs, "the secret's company (required)")
	name := fs.String("name", "", "secret name")
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" {
		return errors.New("secrets delete: -name is required")
	}
	comp, err := c.requireCompany("secrets delete", *company)
	if err != nil {
		return err
	}
	resp, err := c.exec.DeleteSecret(ctx, &executorv1.DeleteSecretRequest{CompanyId: comp, Name: *name})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		fmt.Fprintf(c.out, "deleted secret %s of %s (version %d)\n", resp.GetSecret().GetName(), comp, resp.GetSecret().GetVersion())
		return nil
	})
}
