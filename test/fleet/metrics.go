package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Metrics is one scrape of a Prometheus text endpoint: every sample by its
// series (`name{labels}` as exposed).
type Metrics map[string]float64

// maxScrapeBytes bounds one scrape (the server exposes per-cluster series).
const maxScrapeBytes = 256 << 20

// Scrape reads a Prometheus text endpoint with client (nil: a plain one).
func Scrape(ctx context.Context, client *http.Client, url string) (Metrics, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxScrapeBytes))
	if err != nil {
		return nil, err
	}
	return ParseMetrics(string(b)), nil
}

// ParseMetrics parses the Prometheus text format, skipping comments and
// lines it cannot read.
func ParseMetrics(text string) Metrics {
	m := Metrics{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		// The value follows the last space outside the label braces; a
		// timestamp may follow it.
		series, rest := line, ""
		if i := strings.LastIndexByte(line, '}'); i >= 0 {
			series, rest = line[:i+1], strings.TrimSpace(line[i+1:])
		} else if j := strings.IndexByte(line, ' '); j >= 0 {
			series, rest = line[:j], strings.TrimSpace(line[j+1:])
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		m[series] = v
	}
	return m
}

// Sum adds the samples of metric name whose labels contain every one of
// match (each `key="value"`).
func (m Metrics) Sum(name string, match ...string) float64 {
	var sum float64
	for series, v := range m {
		base, labels, _ := strings.Cut(series, "{")
		if base != name {
			continue
		}
		ok := true
		for _, want := range match {
			if !strings.Contains(labels, want) {
				ok = false
				break
			}
		}
		if ok {
			sum += v
		}
	}
	return sum
}

// Sub returns m minus before, series by series (series missing in before
// count from zero).
func (m Metrics) Sub(before Metrics) Metrics {
	out := Metrics{}
	for k, v := range m {
		out[k] = v - before[k]
	}
	return out
}
