package agent

// Sending the report: the Linux probe's retry policy (4 attempts, 2 s backoff doubling, 45 s in
// all, 20 s per request), its status handling and its honest, credential-free error messages.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// Retry is the send policy.
type Retry struct {
	Attempts int
	Backoff  time.Duration
	Deadline time.Duration
	Request  time.Duration
}

// DefaultRetry is the Linux probe's policy.
var DefaultRetry = Retry{Attempts: 4, Backoff: 2 * time.Second, Deadline: 45 * time.Second, Request: 20 * time.Second}

// Outcome of Send.
type Outcome int

const (
	Accepted Outcome = iota
	Refused          // a 4xx other than 408/429: retrying will not help
	GaveUp           // the retry budget ran out
)

// SendResult carries the outcome, the last HTTP status (0: no answer) and one log line per failed attempt.
type SendResult struct {
	Outcome  Outcome
	Status   int
	Attempts []string
}

var (
	bearerRE = regexp.MustCompile(`[Bb]earer \S*`)
	longRE   = regexp.MustCompile(`[A-Za-z0-9_-]{32,}`)
	ctrlRE   = regexp.MustCompile(`[\x00-\x1f\x7f]`)
)

// MaskSecrets bounds an error text to one line of 200 characters and masks anything that looks like
// a credential (a Bearer value, a run of 32+ base64url characters).
func MaskSecrets(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	s = bearerRE.ReplaceAllString(s, "Bearer ***")
	s = longRE.ReplaceAllString(s, "***")
	s = ctrlRE.ReplaceAllString(s, "")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

func errorReason(body []byte) string {
	var v struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil || !regexp.MustCompile(`^[a-z_]{1,40}$`).MatchString(v.Error) {
		return ""
	}
	return v.Error
}

// Client builds the HTTP client for a target: an https URL is verified against the volume's CA when
// it has one, else the system trust store; redirects are not followed (the credential stays put).
func Client(t *ReportTarget) (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	if strings.HasPrefix(t.URL, "https://") && t.CA != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(t.CA) {
			return nil, errors.New("report-ca.crt holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}, nil
}

// Send POSTs body with the policy; sleep is injectable for tests.
func Send(ctx context.Context, client *http.Client, t *ReportTarget, body []byte, p Retry,
	sleep func(context.Context, time.Duration) error) SendResult {
	var res SendResult
	start := time.Now()
	delay := p.Backoff
	for attempt := 1; attempt <= p.Attempts; attempt++ {
		left := p.Deadline - time.Since(start)
		if left <= 0 {
			break
		}
		limit := min(left, p.Request)
		status, detail := postOnce(ctx, client, t, body, limit)
		res.Status = status
		switch {
		case status >= 200 && status < 300:
			res.Outcome = Accepted
			return res
		case status == http.StatusConflict && attempt > 1:
			res.Outcome = Accepted // an earlier attempt got through
			return res
		case status == 0 || status == 408 || status == 429 || status >= 500:
			res.Attempts = append(res.Attempts, fmt.Sprintf("attempt %d failed (%s)", attempt, detail))
		case status >= 400:
			res.Outcome = Refused
			res.Attempts = append(res.Attempts, fmt.Sprintf("report refused (%s)", detail))
			return res
		default:
			res.Attempts = append(res.Attempts, fmt.Sprintf("attempt %d failed (unexpected status; %s)", attempt, detail))
		}
		if attempt == p.Attempts || delay >= p.Deadline-time.Since(start) {
			break
		}
		if sleep(ctx, delay) != nil {
			break
		}
		delay *= 2
	}
	res.Outcome = GaveUp
	return res
}

func postOnce(ctx context.Context, client *http.Client, t *ReportTarget, body []byte, limit time.Duration) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return 0, "HTTP 000; " + MaskSecrets(err.Error())
	}
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	req.Header.Set("X-Licensectl-Namespace", t.Namespace)
	req.Header.Set("Authorization", "Bearer "+t.Credential)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "HTTP 000; " + MaskSecrets(err.Error())
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	detail := fmt.Sprintf("HTTP %03d", resp.StatusCode)
	if reason := errorReason(data); reason != "" {
		detail += " " + reason
	}
	return resp.StatusCode, detail
}

// SleepCtx waits d or until ctx ends.
func SleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
