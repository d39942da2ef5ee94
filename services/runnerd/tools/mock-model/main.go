// Command mock-model serves the deterministic loopback mock model
// (internal/testing/mockmodel: the OpenAI Responses and Chat Completions APIs, the
// Anthropic Messages API) until
// it is interrupted, so a real provider can be driven offline (tether-demo
// -provider opencode, manual runs). It prints its base URL.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tether-run/tether/services/runnerd/internal/codex"
	"github.com/tether-run/tether/services/runnerd/internal/testing/mockmodel"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	codexHome := flag.String("codex-home", "", "also write an offline codex config.toml for this mock into DIR (model mock-model, key from -codex-env-key; codex and codex-acp)")
	envKey := flag.String("codex-env-key", "MOCK_API_KEY", "the environment variable the written config.toml reads the mock's API key from")
	slowDelay := flag.Duration("slow-delay", 0, "the pause between the deltas of a [slow] reply (0: the mock's default, 250ms)")
	flag.Parse()
	s, err := mockmodel.Start(*addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mock-model:", err)
		os.Exit(1)
	}
	if *slowDelay > 0 {
		s.SlowChunkDelay = *slowDelay
	}
	if *codexHome != "" {
		if err := codex.WriteConfig(*codexHome, codex.ConfigTOML{Model: "mock-model", ProviderID: "mock", ProviderName: "Mock Responses API",
			BaseURL: s.BaseURL(), EnvKey: *envKey, ApprovalPolicy: "on-request", SandboxMode: "workspace-write"}); err != nil {
			fmt.Fprintln(os.Stderr, "mock-model:", err)
			_ = s.Close()
			os.Exit(1)
		}
	}
	fmt.Println(s.BaseURL())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	<-ch
	_ = s.Close()
}
