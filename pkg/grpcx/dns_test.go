package grpcx_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tether-run/tether/pkg/grpcx"
)

// silentTXTResolver is a DNS server on loopback UDP that answers A queries
// for every name with 127.0.0.1 and never answers a TXT query, as Docker's
// embedded resolver does off-network for _grpc_config.<host>. It records
// the questions it was asked.
type silentTXTResolver struct {
	conn *net.UDPConn
	mu   sync.Mutex
	asks []dnsmessage.Question
}

func startSilentTXTResolver(t *testing.T) *silentTXTResolver {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	r := &silentTXTResolver{conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			r.answer(buf[:n], from)
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return r
}

func (r *silentTXTResolver) answer(query []byte, from *net.UDPAddr) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return
	}
	q, err := p.Question()
	if err != nil {
		return
	}
	r.mu.Lock()
	r.asks = append(r.asks, q)
	r.mu.Unlock()
	if q.Type == dnsmessage.TypeTXT {
		return // never answered
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if q.Type == dnsmessage.TypeA {
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60},
			dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}})
	}
	msg, err := b.Finish()
	if err == nil {
		_, _ = r.conn.WriteToUDP(msg, from)
	}
}

func (r *silentTXTResolver) txtQuestions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, q := range r.asks {
		if q.Type == dnsmessage.TypeTXT {
			out = append(out, q.Name.String())
		}
	}
	return out
}

// TestD5_DiallingThroughDNSNeverWaitsOnAServiceConfigLookup: a gateway
// reached by a DNS name (as in compose or Kubernetes) through a resolver
// that never answers TXT. grpc-go's dns resolver asks for
// _grpc_config.<host> before the first connection unless service configs
// are disabled, and the first call then waited for that query to time out
// (10 s, on every newly dialled gateway). grpcx.Dial disables them: the
// resolver is never asked for a TXT record and the first call succeeds.
func TestD5_DiallingThroughDNSNeverWaitsOnAServiceConfigLookup(t *testing.T) {
	dns := startSilentTXTResolver(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	port := lis.Addr().(*net.TCPAddr).Port
	target := "dns://" + dns.conn.LocalAddr().String() + "/gateway.tether.test:" + strconv.Itoa(port)
	// The name is not loopback, so Dial would choose TLS: plaintext is
	// passed explicitly, as a caller that knows its network would.
	cc, err := grpcx.Dial(target, "", grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Empty(t, dns.txtQuestions(), "no service config lookup")
}
