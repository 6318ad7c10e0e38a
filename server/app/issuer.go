package app

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/relaymesh/relaymesh/ca"
)

// Metrics of the relay issuing CA.
const (
	// MetricRelayIssuerNotAfter is the current issuing CA's NotAfter.
	MetricRelayIssuerNotAfter = "relaymesh_relay_issuer_not_after_seconds"
	// MetricRelayIssuerGeneration is the current issuing CA's generation.
	MetricRelayIssuerGeneration = "relaymesh_relay_issuer_generation"
	// MetricRelayIssuersAccepted counts the issuing CAs agent
	// certificates are accepted from.
	MetricRelayIssuersAccepted = "relaymesh_relay_issuers_accepted"
	// MetricRelayIssuerRenewalDue is 1 while the issuing CA is past its
	// renewal point and not renewed.
	MetricRelayIssuerRenewalDue = "relaymesh_relay_issuer_renewal_due"
	// MetricRelayIssuerRenewals counts this replica's renewals.
	MetricRelayIssuerRenewals = "relaymesh_relay_issuer_renewals_total"
)

// issuerWatch is what a replica knows of the relay issuing CA.
type issuerWatch struct {
	renewals prometheus.Counter
	mu       sync.Mutex
	warned   time.Time
}

// watchRelayIssuer registers the issuing CA's metrics and, for the
// generated relay CA, reloads it every --relay-issuer-check-interval so
// that a renewal by the Lease holder reaches this replica: it then issues
// from the new issuing CA and accepts the previous ones.
func (p *process) watchRelayIssuer(ctx context.Context) error {
	w := &issuerWatch{renewals: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricRelayIssuerRenewals,
		Help: "Renewals of the generated relay issuing CA this replica made (as the Lease holder)."})}
	p.issuer = w
	current := func() float64 { return float64(p.authority.Chain()[0].NotAfter.Unix()) }
	p.reg.MustRegister(w.renewals,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricRelayIssuerNotAfter,
			Help: "NotAfter of the relay issuing CA this replica issues agent certificates from, in Unix seconds."}, current),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricRelayIssuerGeneration,
			Help: "Generation of the relay issuing CA this replica issues from: 1, then one more at each renewal (a provided CA is always 1)."},
			func() float64 {
				if r, ok := p.signer.(*ca.RelayIssuers); ok {
					return float64(r.Generation())
				}
				return 1
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricRelayIssuersAccepted,
			Help: "Relay issuing CAs this replica accepts agent certificates from: the current one and the previous ones whose certificates may not have expired yet."},
			func() float64 { return float64(len(p.authority.AcceptedIssuers())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricRelayIssuerRenewalDue,
			Help: "1 while the relay issuing CA is past its renewal point (--relay-issuer-renew-at of its life) and not renewed: always so for a provided CA, which the server cannot renew."},
			func() float64 {
				if p.issuerRenewalDue(time.Now()) {
					return 1
				}
				return 0
			}),
	)
	r, ok := p.signer.(*ca.RelayIssuers)
	if !ok {
		return nil
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(p.cfg.CA.IssuerCheck):
			}
			p.reloadRelayIssuer(ctx, r)
		}
	}()
	return nil
}

// reloadRelayIssuer re-reads the generated relay CA; a bad one changes
// nothing.
func (p *process) reloadRelayIssuer(ctx context.Context, r *ca.RelayIssuers) {
	changed, err := r.Reload(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		p.log.Warn("could not reload the relay CA; still using the issuing CA loaded before", "error", err)
	case changed:
		cur := r.Chain()[0]
		p.log.Info("issuing agent certificates from a new relay issuing CA", "generation", r.Generation(),
			"not_after", cur.NotAfter, "accepted_issuers", len(r.AcceptedIssuers()))
	}
}

// issuerRenewalDue reports whether the current issuing CA is past its
// renewal point at now.
func (p *process) issuerRenewalDue(now time.Time) bool {
	c := p.authority.Chain()[0]
	if _, generated := p.signer.(*ca.RelayIssuers); generated {
		return !now.Before(ca.IssuerRenewalTime(c, p.cfg.CA.IssuerRenewAt))
	}
	return !now.Before(ca.RenewalTime(c.NotBefore, c.NotAfter, p.cfg.CA.IssuerRenewAt))
}

// renewRelayIssuer is the once-only task of the issuing CA. For the
// generated relay CA it renews it past --relay-issuer-renew-at of its life
// and drops replaced issuing CAs once their certificates have expired.
// A provided CA cannot be renewed by the server: past that point it warns
// (hourly, and relaymesh_relay_issuer_renewal_due is 1) so that an
// operator replaces it before it expires.
func (p *process) renewRelayIssuer(ctx context.Context) {
	r, generated := p.signer.(*ca.RelayIssuers)
	for {
		if generated {
			p.renewGenerated(ctx, r)
		} else if now := time.Now(); p.issuerRenewalDue(now) {
			p.issuer.mu.Lock()
			if now.Sub(p.issuer.warned) >= time.Hour {
				p.issuer.warned = now
				p.log.Warn("the provided relay issuing CA is past its renewal point and the server cannot renew it: replace it (--ca-cert/--ca-key or --ca-secret) before it expires, or every agent is refused",
					"not_after", p.authority.Chain()[0].NotAfter, "flag", p.cfg.caFlag())
			}
			p.issuer.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.cfg.CA.IssuerCheck):
		}
	}
}

func (p *process) renewGenerated(ctx context.Context, r *ca.RelayIssuers) {
	res, err := ca.RenewRelayIssuer(ctx, p.kube.Typed, p.cfg.Namespace, ca.RenewConfig{
		CA:      ca.GenerateConfig{IssuerTTL: p.cfg.CA.IssuerTTL},
		RenewAt: p.cfg.CA.IssuerRenewAt,
		Keep:    p.cfg.CA.issuerKeep(p.cfg.AgentCertTTL),
	})
	if err != nil {
		if ctx.Err() == nil {
			p.log.Error("relay issuing CA renewal failed; retrying", "error", err, "retry_in", p.cfg.CA.IssuerCheck)
		}
		return
	}
	if res.Renewed {
		p.issuer.renewals.Inc()
		p.log.Info("renewed the relay issuing CA; the previous one stays accepted until its agent certificates have expired",
			"generation", res.Generation, "not_after", res.Current.NotAfter)
	}
	for _, d := range res.Dropped {
		p.log.Info("dropped a replaced relay issuing CA: every agent certificate it signed has expired", "serial", d.SerialNumber.Text(16), "not_after", d.NotAfter)
	}
	if res.Renewed || len(res.Dropped) > 0 {
		p.reloadRelayIssuer(ctx, r)
	}
}
