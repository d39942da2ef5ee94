// Package failure carries tether's stable error codes across service
// boundaries. A code (SPEC.md) is the prefix of the gRPC status message and the
// reason of a google.rpc.ErrorInfo detail with domain "tether", so callers can
// switch on it without parsing prose.
package failure

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of every tether error.
const Domain = "tether"

// Error is an error with a stable code and the gRPC code it maps to.
type Error struct {
	// Code is the stable, documented code (e.g. run_id_conflict).
	Code string
	// GRPC is the gRPC status code the error maps to.
	GRPC codes.Code
	// Message is the human explanation; it never contains secrets.
	Message string
	// Cause is an optional wrapped error (not sent over the wire).
	Cause error
	// Metadata is optional ErrorInfo metadata.
	Metadata map[string]string
}

// New returns an Error with a formatted message.
func New(c codes.Code, code, format string, args ...any) *Error {
	return &Error{Code: code, GRPC: c, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an Error that wraps cause.
func Wrap(cause error, c codes.Code, code, format string, args ...any) *Error {
	return &Error{Code: code, GRPC: c, Message: fmt.Sprintf(format, args...), Cause: cause}
}

// Error implements error as "code: message".
func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// GRPCStatus lets grpc-go send the error with its code and ErrorInfo.
func (e *Error) GRPCStatus() *status.Status {
	st := status.New(e.GRPC, e.Error())
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: e.Code, Domain: Domain, Metadata: e.Metadata}); err == nil {
		return d
	}
	return st
}

// CodeOf returns the stable code of err: an *Error's Code, the ErrorInfo
// reason of a gRPC status, or the leading "code:" token of the message when it
// looks like one. It returns "" when there is none.
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Code
	}
	if st, ok := status.FromError(err); ok {
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
				return info.GetReason()
			}
		}
		return LeadingCode(st.Message())
	}
	return LeadingCode(err.Error())
}

// LeadingCode returns the leading snake_case token of msg when it is followed
// by ':' or is the whole message, else "".
func LeadingCode(msg string) string {
	tok := msg
	if i := strings.IndexByte(msg, ':'); i >= 0 {
		tok = msg[:i]
	}
	if tok == "" || len(tok) > 96 {
		return ""
	}
	for _, r := range tok {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return ""
		}
	}
	if !strings.Contains(tok, "_") {
		return ""
	}
	return tok
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
		return New(codes.Canceled, "canceled", "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return New(codes.DeadlineExceeded, "deadline_exceeded", "%v", err)
	}
	return New(codes.Internal, "internal", "%v", err)
}
