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
			Help: "Generation of the relay issuing CA this replica issues from: 1, then one more at each renewal, or at each new issuing CA of a --ca-config back end reloaded (a --ca-cert or --ca-secret CA is always 1)."},
			func() float64 {
				switch r := p.signer.(type) {
				case *ca.RelayIssuers:
					return float64(r.Generation())
				case reloadingSigner:
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
	if f, ok := p.signer.(reloadingSigner); ok {
		go p.reloadEvery(ctx, func() { p.reloadFileSigner(ctx, f) })
		return nil
	}
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

// reloadEvery calls reload every --relay-issuer-check-interval until ctx
// ends.
func (p *process) reloadEvery(ctx context.Context, reload func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.cfg.CA.IssuerCheck):
		}
		reload()
	}
}

// reloadFileSigner re-reads --ca-config and the files it names on this
// replica: a new issuing CA of the back end becomes current, the replaced
// one stays accepted until its agent certificates have expired. A file
// that does not build changes nothing.
func (p *process) reloadFileSigner(ctx context.Context, f reloadingSigner) {
	changed, err := f.Reload(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		p.log.Warn("could not reload the relay CA back end; still using the issuing CA loaded before", "flag", "--ca-config", "backend", f.Type(), "error", err)
	case changed:
		cur := f.Chain()[0]
		p.log.Info("issuing agent certificates from a new relay issuing CA of the back end; the replaced one stays accepted until its agent certificates have expired",
			"backend", f.Type(), "generation", f.Generation(), "issuer", cur.Subject.String(), "not_after", cur.NotAfter, "accepted_issuers", len(f.AcceptedIssuers()))
	}
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
			p.warnRenewalDue(now)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.cfg.CA.IssuerCheck):
		}
	}
}

// warnRenewalDue warns, at most hourly, that a CA the server cannot renew
// itself is past its renewal point, and what the operator does.
func (p *process) warnRenewalDue(now time.Time) {
	p.issuer.mu.Lock()
	defer p.issuer.mu.Unlock()
	if now.Sub(p.issuer.warned) < time.Hour {
		return
	}
	p.issuer.warned = now
	notAfter := p.authority.Chain()[0].NotAfter
	if f, ok := p.signer.(reloadingSigner); ok {
		p.log.Warn("the relay issuing CA of the back end is past its renewal point: give the back end a new issuing CA under the same root and update its chain (and key) in --ca-config; every replica picks it up within --relay-issuer-check-interval and keeps accepting the old one until its agent certificates have expired",
			"backend", f.Type(), "not_after", notAfter, "flag", "--ca-config")
		return
	}
	p.log.Warn("the provided relay issuing CA is past its renewal point and the server cannot renew it: replace it (--ca-cert/--ca-key or --ca-secret) before it expires, or every agent is refused",
		"not_after", notAfter, "flag", p.cfg.caFlag())
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
