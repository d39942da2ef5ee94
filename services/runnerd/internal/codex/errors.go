package codex

import (
	"errors"
	"fmt"
)

// Stable error codes reported by this package (SPEC R1/R2).
const (
	CodeSpawnFailed              = "provider_spawn_failed"
	CodeInitializeTimeout        = "provider_initialize_timeout"
	CodeInitializeProtocolError  = "provider_initialize_protocol_error"
	CodeRequestTimeout           = "provider_request_timeout"
	CodeTransportFailed          = "provider_transport_failed"
	CodeFrameTooLarge            = "provider_frame_too_large"
	CodeProcessExited            = "provider_process_exited"
	CodeStdoutClosed             = "provider_stdout_closed"
	CodeClosed                   = "provider_closed"
	CodeProtocolError            = "provider_protocol_error"
	CodeThreadNotOpen            = "provider_thread_not_open"
	CodeThreadAlreadyOpen        = "provider_thread_already_open"
	CodeThreadStartFailed        = "provider_thread_start_failed"
	CodeThreadResumeFailed       = "provider_thread_resume_failed"
	CodeThreadResumeMismatch     = "provider_thread_resume_mismatch"
	CodeTurnActive               = "provider_turn_active"
	CodeTurnStartFailed          = "provider_turn_start_failed"
	CodeSteerFailed              = "provider_steer_failed"
	CodeInterruptFailed          = "provider_interrupt_failed"
	CodeTurnFailed               = "provider_turn_failed"
	CodeServerRequestUnsupported = "provider_server_request_unsupported"
	CodeThreadMismatch           = "provider_thread_mismatch"
	CodeUnknownTurn              = "provider_unknown_turn"
	CodeProviderError            = "provider_error"
	CodeInvalidConfig            = "provider_config_invalid"
	CodeToolTimeout              = "semantic_tool_timeout"
)

// Error is a failure with a stable code. Error() is "code: message".
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

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
