package codex

import (
	"errors"
	"fmt"

	"github.com/tether-run/tether/pkg/failure"
)

// Error is a failure with a stable code. Error() is "code: message".
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return failure.Message(failure.Reason(e.Code), e.Message) }

// FailureReason implements failure.Reasoned.
func (e *Error) FailureReason() failure.Reason { return failure.Reason(e.Code) }

// Is reports whether target is an *Error with the same code (and the same
// message when target's message is non-empty), so callers can write
// errors.Is(err, &codex.Error{Code: codex.CodeProcessExited}).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t == nil {
		return false
	}
	return t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of err when it is (or wraps) an *Error, else "".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
