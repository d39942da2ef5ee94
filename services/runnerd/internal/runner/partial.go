package runner

import "github.com/tether-run/tether/pkg/prp"

// Partial output of a cancelled turn (SPEC R12): every provider reports
// it the same way. A turn that ends interrupted (a cancel, a turn.interrupt)
// has as its finalMessage the text of its newest agent message as it was
// streamed to the caller (the item.delta events of that agentMessage item,
// or the item's text when the provider completed it), whatever the driver
// put in its result (the ACP agents return what they streamed, codex
// returns nothing, OpenCode the text part if it was closed), and its
// run.terminal says partial: true. A turn that streamed no agent text has
// an empty finalMessage.

// streamedText follows the newest agentMessage item of one turn.
type streamedText struct {
	turnID, itemID string
	text           []byte
}

// note takes one journaled event.
func (p *streamedText) note(typ, turnID string, payload map[string]any) {
	if typ == prp.EventTurnStarted {
		*p = streamedText{turnID: turnID}
		return
	}
	if kind, _ := payload["kind"].(string); kind != "agentMessage" || turnID == "" {
		return
	}
	item, _ := payload["itemId"].(string)
	switch typ {
	case "item.started":
		*p = streamedText{turnID: turnID, itemID: item}
	case "item.delta":
		if turnID != p.turnID {
			*p = streamedText{turnID: turnID}
		}
		d, _ := payload["delta"].(string)
		p.text = append(p.text, d...)
	case "item.completed":
		if text, ok := payload["text"].(string); ok {
			*p = streamedText{turnID: turnID, itemID: item, text: []byte(text)}
		}
	}
}

// partialOutput is the finalMessage of turnID ended interrupted: what it
// streamed, or the driver's own message when runnerd saw no stream of it
// (a runnerd restart in between).
func (p *streamedText) partialOutput(turnID, driver string) string {
	if p.turnID == turnID && len(p.text) > 0 {
		return string(p.text)
	}
	if p.turnID == turnID {
		return ""
	}
	return driver
}
