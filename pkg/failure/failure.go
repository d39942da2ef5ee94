// Package failure carries tether's stable error codes across service
// boundaries. A code (SPEC.md) is a Reason of the one registry in
// reasons.go; it is the prefix of the gRPC status message and the reason of a
// google.rpc.ErrorInfo detail with domain "tether", so callers switch on the
// reason value and never parse prose.
package failure

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of every tether error.
const Domain = "tether"

// MetadataField is the ErrorInfo metadata key that names the request field an
// InvalidArgument error refuses (dotted proto field names, e.g.
// "input.provider.kind"); the server edge reports it as a
// google.rpc.BadRequest field violation too (AIP-193).
const MetadataField = "field"

// Reason is a stable failure code: one of the constants in reasons.go.
type Reason string

// Retry is how a failure with a given reason may be retried.
type Retry uint8

// Retry classes.
const (
	// Permanent: the same request fails the same way until something else
	// changes.
	Permanent Retry = iota
	// Transient: the caller may send the same request again.
	Transient
	// AttemptRetry: a failure source of bounded recovery (SPEC E11); the
	// run's attempt fails and the run is retried up to its attempt limit.
	AttemptRetry
	// AttemptTerminal: a failure source of bounded recovery that ends the run
	// at once under its own code (replaying would diverge from history, or
	// the provider artifact can never be launched).
	AttemptTerminal
)

// Info is what the registry knows of a reason.
type Info struct {
	// GRPC is the reason's usual gRPC code (a call site may choose another
	// when the same reason means a different thing there).
	GRPC codes.Code
	// Retry is the reason's retry class.
	Retry Retry
}

// Lookup returns the registry entry of r (of its base reason when r is
// qualified, see Qualified).
func Lookup(r Reason) (Info, bool) {
	i, ok := registry[r.Base()]
	return i, ok
}

// Qualified returns r qualified by q ("reason:q"), for the few reasons whose
// wire form names what is missing (e.g. the transport mode).
func Qualified(r Reason, q string) Reason { return r + ":" + Reason(q) }

// Base returns r without its qualifier.
func (r Reason) Base() Reason {
	if i := strings.IndexByte(string(r), ':'); i >= 0 {
		return r[:i]
	}
	return r
}

// Registered returns every reason of the registry, sorted.
func Registered() []Reason {
	out := make([]Reason, 0, len(registry))
	for r := range registry {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// GRPC returns r's registered gRPC code (Unknown for an unregistered reason).
func (r Reason) GRPC() codes.Code {
	if i, ok := Lookup(r); ok {
		return i.GRPC
	}
	return codes.Unknown
}

// Retry returns r's retry class (Permanent for an unregistered reason).
func (r Reason) Retry() Retry {
	i, _ := Lookup(r)
	return i.Retry
}

// Error is an error with a stable code and the gRPC code it maps to.
type Error struct {
	// Code is the stable, documented reason (e.g. RunIDConflict).
	Code Reason
	// GRPC is the gRPC status code the error maps to.
	GRPC codes.Code
	// Message is the human explanation; it never contains secrets.
	Message string
	// Cause is an optional wrapped error (not sent over the wire).
	Cause error
	// Metadata is optional ErrorInfo metadata.
	Metadata map[string]string
}

// New returns an Error with a formatted message and an explicit gRPC code.
func New(c codes.Code, code Reason, format string, args ...any) *Error {
	return &Error{Code: code, GRPC: c, Message: fmt.Sprintf(format, args...)}
}

// Newf returns an Error with code's registered gRPC code.
func Newf(code Reason, format string, args ...any) *Error {
	return New(code.GRPC(), code, format, args...)
}

// Wrap returns an Error that wraps cause.
func Wrap(cause error, c codes.Code, code Reason, format string, args ...any) *Error {
	return &Error{Code: code, GRPC: c, Message: fmt.Sprintf(format, args...), Cause: cause}
}

// Error implements error as "code: message". The prefix is written here
// only: a message that already starts with it (a runner's result relayed
// as it came) does not get it twice.
func (e *Error) Error() string {
	return Message(e.Code, e.Message)
}

// Message returns the one rendering of a coded message: "code: msg", or the
// code alone when msg is empty. A msg that already carries the prefix is not
// prefixed again.
func Message(code Reason, msg string) string {
	p := string(code)
	msg = strings.TrimPrefix(msg, p+": ")
	if msg == "" || msg == p {
		return p
	}
	return p + ": " + msg
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// GRPCStatus lets grpc-go send the error with its code and ErrorInfo.
func (e *Error) GRPCStatus() *status.Status {
	st := status.New(e.GRPC, e.Error())
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: string(e.Code), Domain: Domain, Metadata: e.Metadata}); err == nil {
		return d
	}
	return st
}

// Reasoned is implemented by the coded errors of packages that cannot carry
// an *Error (the runner protocol's and the provider driver's), so CodeOf
// finds their reason without reading their message.
type Reasoned interface {
	error
	FailureReason() Reason
}

// CodeOf returns the stable code of err: an *Error's Code, a Reasoned
// error's reason, or the ErrorInfo reason of a gRPC status. It returns ""
// when there is none; it never parses a message.
func CodeOf(err error) Reason {
	if err == nil {
		return ""
	}
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	var re Reasoned
	if errors.As(err, &re) {
		return re.FailureReason()
	}
	if st, ok := status.FromError(err); ok {
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
				return Reason(info.GetReason())
			}
		}
	}
	return ""
}

// ToStatus converts any error into one that grpc-go sends faithfully: tether
// errors keep their code, context errors map to Canceled/DeadlineExceeded,
// existing status errors pass through, anything else becomes Internal with
// code "internal".
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	var fe *Error
	if errors.As(err, &fe) {
		return fe
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return New(codes.Canceled, Canceled, "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return New(codes.DeadlineExceeded, DeadlineExceeded, "%v", err)
	}
	return New(codes.Internal, Internal, "%v", err)
}
