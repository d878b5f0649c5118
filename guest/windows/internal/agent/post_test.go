package agent

import (
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

type server struct {
	mu       sync.Mutex
	statuses []int
	seen     []*http.Request
	bodies   []string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, _ := io.ReadAll(r.Body)
	s.seen = append(s.seen, r)
	s.bodies = append(s.bodies, string(data))
	status := s.statuses[0]
	if len(s.statuses) > 1 {
		s.statuses = s.statuses[1:]
	}
	w.WriteHeader(status)
	reasons := map[int]string{202: "", 401: "unauthorized", 409: "replay", 503: "not_ready", 429: "rate_limited"}
	if reason := reasons[status]; reason != "" {
		_, _ = io.WriteString(w, `{"error": "`+reason+`", "message": "m"}`)
	}
}

func target(url string) *ReportTarget {
	return &ReportTarget{URL: url, Namespace: "tenant-foo", Credential: "c3VwZXItc2VjcmV0LWNyZWRlbnRpYWwtdmFsdWUtMTIzNDU2"}
}

var fast = Retry{Attempts: 4, Backoff: time.Millisecond, Deadline: 10 * time.Second, Request: 5 * time.Second}

func noSleep(context.Context, time.Duration) error { return nil }

func newServer(s *server) *httptest.Server { return httptest.NewServer(s) }

func send(t *testing.T, statuses ...int) (SendResult, *server) {
	t.Helper()
	s := &server{statuses: statuses}
	ts := httptest.NewServer(s)
	defer ts.Close()
	tg := target(ts.URL + "/v1/reports")
	c, err := Client(tg)
	if err != nil {
		t.Fatal(err)
	}
	return Send(context.Background(), c, tg, []byte("body\n"), fast, noSleep), s
}

func TestSendStatuses(t *testing.T) {
	cases := []struct {
		statuses []int
		outcome  Outcome
		requests int
	}{
		{[]int{202}, Accepted, 1},
		{[]int{503, 429, 202}, Accepted, 3},
		{[]int{500, 409}, Accepted, 2}, // an earlier attempt got through
		{[]int{409}, Refused, 1},       // a replay on the first attempt is not ours
		{[]int{401}, Refused, 1},
		{[]int{503}, GaveUp, 4},
		{[]int{408, 408, 408, 408, 202}, GaveUp, 4},
	}
	for _, c := range cases {
		res, s := send(t, c.statuses...)
		if res.Outcome != c.outcome || len(s.seen) != c.requests {
			t.Errorf("%v: outcome %v after %d requests (%v)", c.statuses, res.Outcome, len(s.seen), res.Attempts)
		}
	}
	res, s := send(t, 503, 401)
	if len(res.Attempts) != 2 || res.Attempts[0] != "attempt 1 failed (HTTP 503 not_ready)" ||
		res.Attempts[1] != "report refused (HTTP 401 unauthorized)" {
		t.Fatalf("%q", res.Attempts)
	}
	r := s.seen[0]
	if r.Method != http.MethodPost || r.URL.Path != "/v1/reports" || r.Header.Get("Content-Type") != "text/plain; charset=utf-8" ||
		r.Header.Get("X-Licensectl-Namespace") != "tenant-foo" ||
		r.Header.Get("Authorization") != "Bearer "+target("").Credential || s.bodies[0] != "body\n" {
		t.Fatalf("request %v %v", r.Header, s.bodies)
	}
}

func TestSendGivesUpWithinTheDeadline(t *testing.T) {
	tg := target("http://127.0.0.1:9/v1/reports") // nothing listens on the discard port
	c, _ := Client(tg)
	var slept []time.Duration
	sleep := func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }
	p := Retry{Attempts: 4, Backoff: 2 * time.Second, Deadline: 45 * time.Second, Request: time.Second}
	res := Send(context.Background(), c, tg, []byte("x"), p, sleep)
	if res.Outcome != GaveUp || len(res.Attempts) != 4 || res.Status != 0 {
		t.Fatalf("%+v", res)
	}
	if len(slept) != 3 || slept[0] != 2*time.Second || slept[2] != 8*time.Second {
		t.Fatalf("backoff %v", slept)
	}
	if !strings.HasPrefix(res.Attempts[0], "attempt 1 failed (HTTP 000; ") {
		t.Fatalf("%q", res.Attempts[0])
	}
	p.Deadline = 0
	if res := Send(context.Background(), c, tg, []byte("x"), p, sleep); res.Outcome != GaveUp || len(res.Attempts) != 0 {
		t.Fatalf("no time: %+v", res)
	}
}

func TestSendVerifiesHTTPSWithTheVolumeCA(t *testing.T) {
	s := &server{statuses: []int{202}}
	ts := httptest.NewTLSServer(s)
	defer ts.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	tg := target(ts.URL + "/v1/reports")
	tg.CA = ca
	c, err := Client(tg)
	if err != nil {
		t.Fatal(err)
	}
	if res := Send(context.Background(), c, tg, []byte("x"), fast, noSleep); res.Outcome != Accepted {
		t.Fatalf("%+v", res)
	}
	// Without the CA the system trust store does not know the server: nothing is sent.
	tg.CA = nil
	c, _ = Client(tg)
	res := Send(context.Background(), c, tg, []byte("x"), Retry{Attempts: 1, Deadline: 5 * time.Second, Request: 5 * time.Second}, noSleep)
	if res.Outcome != GaveUp || len(s.seen) != 1 || !strings.Contains(res.Attempts[0], "certificate") {
		t.Fatalf("%+v, %d requests", res, len(s.seen))
	}
	tg.CA = []byte("not pem")
	if _, err := Client(tg); err == nil {
		t.Fatal("a CA file without a certificate is refused")
	}
}

func TestMaskSecrets(t *testing.T) {
	in := "Post \"https://x/\": Authorization: Bearer abc.def dial c3VwZXItc2VjcmV0LWNyZWRlbnRpYWwtdmFsdWUtMTIzNDU2\x07 ok\nsecond line"
	got := MaskSecrets(in)
	if got != `Post "https://x/": Authorization: Bearer *** dial *** ok` {
		t.Fatalf("%q", got)
	}
	if len(MaskSecrets(strings.Repeat("a b ", 200))) != 200 {
		t.Fatal("bounded to 200 characters")
	}
}
