package grpcx

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// serverMetrics are the grpc-prometheus style server metrics:
// grpc_server_started_total, grpc_server_handled_total,
// grpc_server_msg_received_total, grpc_server_msg_sent_total and
// grpc_server_handling_seconds, labelled grpc_type, grpc_service,
// grpc_method (and grpc_code).
type serverMetrics struct {
	started  *prometheus.CounterVec
	handled  *prometheus.CounterVec
	received *prometheus.CounterVec
	sent     *prometheus.CounterVec
	handling *prometheus.HistogramVec
}

func newServerMetrics(reg prometheus.Registerer) (*serverMetrics, error) {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	m := &serverMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total",
			Help: "Total number of RPCs started on the server.",
		}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total",
			Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, append(labels, "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_received_total",
			Help: "Total number of RPC stream messages received on the server.",
		}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_sent_total",
			Help: "Total number of gRPC stream messages sent by the server.",
		}, labels),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: prometheus.DefBuckets,
		}, labels),
	}
	for _, c := range []prometheus.Collector{m.started, m.handled, m.received, m.sent, m.handling} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// initialize creates the zero-valued series of every registered method so
// dashboards see them before the first call.
func (m *serverMetrics) initialize(gs *grpc.Server) {
	for svc, info := range gs.GetServiceInfo() {
		for _, mi := range info.Methods {
			typ := string(methodType(mi))
			m.started.WithLabelValues(typ, svc, mi.Name)
			m.received.WithLabelValues(typ, svc, mi.Name)
			m.sent.WithLabelValues(typ, svc, mi.Name)
			m.handling.WithLabelValues(typ, svc, mi.Name)
			for _, code := range interceptors.AllCodes {
				m.handled.WithLabelValues(typ, svc, mi.Name, code.String())
			}
		}
	}
}

func methodType(mi grpc.MethodInfo) interceptors.GRPCType {
	switch {
	case !mi.IsClientStream && !mi.IsServerStream:
		return interceptors.Unary
	case mi.IsClientStream && !mi.IsServerStream:
		return interceptors.ClientStream
	case !mi.IsClientStream && mi.IsServerStream:
		return interceptors.ServerStream
	}
	return interceptors.BidiStream
}

// ServerReporter implements interceptors.ServerReportable.
func (m *serverMetrics) ServerReporter(ctx context.Context, c interceptors.CallMeta) (interceptors.Reporter, context.Context) {
	r := &metricsReporter{m: m, labels: []string{string(c.Typ), c.Service, c.Method}, start: time.Now()}
	m.started.WithLabelValues(r.labels...).Inc()
	return r, ctx
}

type metricsReporter struct {
	m      *serverMetrics
	labels []string
	start  time.Time
}

func (r *metricsReporter) PostCall(err error, _ time.Duration) {
	if errors.Is(err, io.EOF) {
		err = nil
	}
	r.m.handled.WithLabelValues(append(r.labels, status.Code(err).String())...).Inc()
	r.m.handling.WithLabelValues(r.labels...).Observe(time.Since(r.start).Seconds())
}

func (r *metricsReporter) PostMsgSend(_ any, err error, _ time.Duration) {
	if err == nil {
		r.m.sent.WithLabelValues(r.labels...).Inc()
	}
}

func (r *metricsReporter) PostMsgReceive(_ any, err error, _ time.Duration) {
	if err == nil {
		r.m.received.WithLabelValues(r.labels...).Inc()
	}
}
