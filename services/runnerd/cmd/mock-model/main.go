// Command mock-model serves the deterministic loopback mock model
// (internal/mockmodel: the OpenAI Responses and Chat Completions APIs) until
// it is interrupted, so a real provider can be driven offline (tether-demo
// -provider opencode, manual runs). It prints its base URL.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tether-run/tether/services/runnerd/internal/mockmodel"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	flag.Parse()
	s, err := mockmodel.Start(*addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mock-model:", err)
		os.Exit(1)
	}
	fmt.Println(s.BaseURL())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	<-ch
	_ = s.Close()
}
