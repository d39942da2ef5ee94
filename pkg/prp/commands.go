package prp

import (
	"fmt"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// A command's body is typed (prpv1.Command.body, one message per command
// type). A peer of the previous release (v0.1.0) sends the same fields as
// a Struct payload instead, named as the body's protojson form names them
// ({"input": ExecutionInput} for run.attach, {"text": ...} for turn.start,
// ...). The readers below accept both forms; LegacyPayload gives the Struct
// form of either (the command's fingerprint and runners of the previous
// release use it).

// FeatureTypedCommands is the Hello feature of a runner that reads typed
// command bodies; a gateway relays commands to a runner without it in the
// Struct payload form (Downgrade).
const FeatureTypedCommands = "typed_commands"

// NewCommand returns a command carrying body, its type named by the
// body's message (RunAttach: run.attach, ...).
func NewCommand(body proto.Message) *prpv1.Command {
	c := &prpv1.Command{}
	switch b := body.(type) {
	case *prpv1.RunAttach:
		c.Type, c.Body = CommandRunAttach, &prpv1.Command_RunAttach{RunAttach: b}
	case *prpv1.TurnStart:
		c.Type, c.Body = CommandTurnStart, &prpv1.Command_TurnStart{TurnStart: b}
	case *prpv1.TurnSteer:
		c.Type, c.Body = CommandTurnSteer, &prpv1.Command_TurnSteer{TurnSteer: b}
	case *prpv1.TurnInterrupt:
		c.Type, c.Body = CommandTurnInterrupt, &prpv1.Command_TurnInterrupt{TurnInterrupt: b}
	case *prpv1.SessionClose:
		c.Type, c.Body = CommandSessionClose, &prpv1.Command_SessionClose{SessionClose: b}
	case *prpv1.RunnerSuspend:
		c.Type, c.Body = CommandRunnerSuspend, &prpv1.Command_RunnerSuspend{RunnerSuspend: b}
	case *prpv1.RunnerCheckpoint:
		c.Type, c.Body = CommandRunnerCheckpoint, &prpv1.Command_RunnerCheckpoint{RunnerCheckpoint: b}
	case *prpv1.RequestResolve:
		c.Type, c.Body = CommandRequestResolve, &prpv1.Command_RequestResolve{RequestResolve: b}
	case *prpv1.ToolResult:
		c.Type, c.Body = CommandToolResult, &prpv1.Command_ToolResult{ToolResult: b}
	default:
		panic(fmt.Sprintf("prp.NewCommand: %T is no command body", body))
	}
	return c
}

// bodyOf returns c's body of type T: the typed body when c carries one,
// else its Struct payload read as T (an older peer's form). A payload
// that does not read as T is an error.
func bodyOf[T proto.Message](c *prpv1.Command, typed T, fix func(*structpb.Struct) *structpb.Struct) (T, error) {
	if typed.ProtoReflect().IsValid() {
		return typed, nil
	}
	out := typed.ProtoReflect().Type().New().Interface().(T)
	p := c.GetPayload()
	if len(p.GetFields()) == 0 || c.GetBody() != nil {
		return out, nil
	}
	if fix != nil {
		p = fix(p)
	}
	raw, err := protojson.Marshal(p)
	if err != nil {
		return out, err
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, out); err != nil {
		return out, fmt.Errorf("%s payload: %w", c.GetType(), err)
	}
	return out, nil
}

// RunAttachOf returns the body of a run.attach.
func RunAttachOf(c *prpv1.Command) (*prpv1.RunAttach, error) {
	return bodyOf(c, c.GetRunAttach(), nil)
}

// TurnStartOf returns the body of a turn.start.
func TurnStartOf(c *prpv1.Command) (*prpv1.TurnStart, error) {
	return bodyOf(c, c.GetTurnStart(), nil)
}

// TurnSteerOf returns the body of a turn.steer.
func TurnSteerOf(c *prpv1.Command) (*prpv1.TurnSteer, error) {
	return bodyOf(c, c.GetTurnSteer(), nil)
}

// TurnInterruptOf returns the body of a turn.interrupt.
func TurnInterruptOf(c *prpv1.Command) (*prpv1.TurnInterrupt, error) {
	return bodyOf(c, c.GetTurnInterrupt(), nil)
}

// SessionCloseOf returns the body of a session.close.
func SessionCloseOf(c *prpv1.Command) (*prpv1.SessionClose, error) {
	return bodyOf(c, c.GetSessionClose(), nil)
}

// RunnerSuspendOf returns the body of a runner.suspend.
func RunnerSuspendOf(c *prpv1.Command) (*prpv1.RunnerSuspend, error) {
	return bodyOf(c, c.GetRunnerSuspend(), nil)
}

// RunnerCheckpointOf returns the body of a runner.checkpoint.
func RunnerCheckpointOf(c *prpv1.Command) (*prpv1.RunnerCheckpoint, error) {
	return bodyOf(c, c.GetRunnerCheckpoint(), nil)
}

// RequestResolveOf returns the body of a request.resolve. An older peer's
// payload may name the request by a number (a provider's JSON-RPC id); it
// reads as its decimal form.
func RequestResolveOf(c *prpv1.Command) (*prpv1.RequestResolve, error) {
	return bodyOf(c, c.GetRequestResolve(), func(p *structpb.Struct) *structpb.Struct {
		n, ok := p.GetFields()["requestId"].GetKind().(*structpb.Value_NumberValue)
		if !ok {
			return p
		}
		p = proto.CloneOf(p)
		p.Fields["requestId"] = structpb.NewStringValue(strconv.FormatFloat(n.NumberValue, 'f', -1, 64))
		return p
	})
}

// ToolResultOf returns the body of a tool.result.
func ToolResultOf(c *prpv1.Command) (*prpv1.ToolResult, error) {
	return bodyOf(c, c.GetToolResult(), nil)
}

// typedBody returns the message c's body holds, or nil.
func typedBody(c *prpv1.Command) proto.Message {
	switch b := c.GetBody().(type) {
	case *prpv1.Command_RunAttach:
		return b.RunAttach
	case *prpv1.Command_TurnStart:
		return b.TurnStart
	case *prpv1.Command_TurnSteer:
		return b.TurnSteer
	case *prpv1.Command_TurnInterrupt:
		return b.TurnInterrupt
	case *prpv1.Command_SessionClose:
		return b.SessionClose
	case *prpv1.Command_RunnerSuspend:
		return b.RunnerSuspend
	case *prpv1.Command_RunnerCheckpoint:
		return b.RunnerCheckpoint
	case *prpv1.Command_RequestResolve:
		return b.RequestResolve
	case *prpv1.Command_ToolResult:
		return b.ToolResult
	}
	return nil
}

// LegacyPayload returns c's body in the Struct payload form of the
// previous release: the typed body's protojson form, or c's payload when
// it carries no typed body.
func LegacyPayload(c *prpv1.Command) (*structpb.Struct, error) {
	b := typedBody(c)
	if b == nil {
		return c.GetPayload(), nil
	}
	return Payload(b)
}

// LegacyPayloadJSON is LegacyPayload's protojson form, written without
// the Struct in between: the typed body's protojson, or that of c's
// payload (nil without one). Parsed as JSON, it is the same value as
// LegacyPayload's protojson (only the keys' order and the numbers'
// spelling may differ).
func LegacyPayloadJSON(c *prpv1.Command) ([]byte, error) {
	if b := typedBody(c); b != nil {
		return protojson.Marshal(b)
	}
	if p := c.GetPayload(); p != nil {
		return protojson.Marshal(p)
	}
	return nil, nil
}

// Downgrade returns c in the form a runner of the previous release reads
// (its body moved into payload); c itself when it has no typed body.
func Downgrade(c *prpv1.Command) (*prpv1.Command, error) {
	if typedBody(c) == nil {
		return c, nil
	}
	p, err := LegacyPayload(c)
	if err != nil {
		return nil, err
	}
	out := proto.CloneOf(c)
	out.Body, out.Payload = nil, p
	return out, nil
}
