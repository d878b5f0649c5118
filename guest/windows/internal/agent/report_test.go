package agent

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf16"
)

func TestUTCOffset(t *testing.T) {
	for secs, want := range map[int]string{0: "+00:00", 3600: "+01:00", -19800: "-05:30", 20700: "+05:45", 50400: "+14:00"} {
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("z", secs))
		if got := UTCOffset(at); got != want {
			t.Errorf("%d: %s want %s", secs, got, want)
		}
	}
}

func TestBodyIsTheEnvelope(t *testing.T) {
	xml := fixture(t, "smi-qx-licensed-l40s-2q-trimmed.xml")
	log := strings.Split(strings.TrimSpace(string(fixture(t, "gridd-log-renew-return-windows-format.txt"))), "\n")
	r := &Report{UUID: "5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2", Hostname: "WIN-1 (desk)",
		Clock: time.Unix(1777000000, 0).In(time.FixedZone("CET", 3600)), TokenSHA256: "none",
		SMIStatus: SMIOK, SMIXML: append(xml, []byte("--- end\n\x00\xff caf\xc3\xa9\n")...),
		LogLines: append(log, strings.Repeat("y", 3000))}
	body := string(r.Body())
	head := "licensectl-report: 2\nuuid: 5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2\nhostname: WIN-1desk\nclock: 1777000000\n" +
		"token-sha256: none\nprobe-version: " + Version + "\nnvidia-smi: ok\nos: windows\nutc-offset: +01:00\n--- nvidia-smi-xml\n"
	if !strings.HasPrefix(body, head) {
		t.Fatalf("header:\n%s", body[:300])
	}
	if !strings.HasSuffix(body, "\n--- end\n") || strings.Count(body, "\n--- ") != 3 {
		t.Fatalf("sections: %q", body)
	}
	if !strings.Contains(body, "\n ---- end\n") && !strings.Contains(body, "\n --- end\n") {
		t.Fatal("a content line that reads as a marker is shifted")
	}
	if !strings.Contains(body, "\n caf\n") || strings.ContainsAny(body, "\x00\r") {
		t.Fatal("content is printable ASCII")
	}
	if !strings.Contains(body, "\nTue Dec 20 05:56:54 2022:<1>:License renewed successfully.") {
		t.Fatal("log lines verbatim")
	}
	if !strings.Contains(body, "\n"+strings.Repeat("y", logLineChars)+"\n") {
		t.Fatal("log lines bounded")
	}
	r.SMIStatus, r.SMIXML, r.LogLines = SMIMissing, nil, nil
	if body := string(r.Body()); !strings.Contains(body, "nvidia-smi: missing\nos: windows\nutc-offset: +01:00\n--- end\n") {
		t.Fatalf("missing: %q", body)
	}
}

func utf16le(s string) []byte {
	var b bytes.Buffer
	b.Write([]byte{0xff, 0xfe})
	for _, u := range utf16.Encode([]rune(s)) {
		_ = binary.Write(&b, binary.LittleEndian, u)
	}
	return b.Bytes()
}

func TestTailLog(t *testing.T) {
	text := strings.ReplaceAll(string(fixture(t, "gridd-log-renew-return-windows-format.txt")), "\n", "\r\n")
	dir := t.TempDir()
	for name, data := range map[string][]byte{"ascii.log": []byte(text), "utf16.log": utf16le(text),
		"bom8.log": append([]byte{0xef, 0xbb, 0xbf}, text...)} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		lines, err := TailLog(p, 2)
		if err != nil || len(lines) != 2 || !strings.HasPrefix(lines[0], "Tue Dec 20 05:56:54 2022:<1>:License renewed") ||
			strings.ContainsAny(lines[1], "\r\ufeff") {
			t.Errorf("%s: %q %v", name, lines, err)
		}
	}
	// A large log: only its end is read, and the cut first line is dropped.
	big := strings.Repeat("Tue Dec 20 05:00:00 2022:<1>:filler line\r\n", 20000) + "Tue Dec 20 06:00:00 2022:<1>:last\r\n"
	for name, data := range map[string][]byte{"big.log": []byte(big), "big16.log": utf16le(big)} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		lines, err := TailLog(p, 50)
		if err != nil || len(lines) != 50 || lines[49] != "Tue Dec 20 06:00:00 2022:<1>:last" ||
			lines[0] != "Tue Dec 20 05:00:00 2022:<1>:filler line" {
			t.Errorf("%s: %d lines, last %q, first %q, %v", name, len(lines), lines[len(lines)-1], lines[0], err)
		}
	}
	if _, err := TailLog(filepath.Join(dir, "none.log"), 5); err == nil {
		t.Error("a missing log is an error (the report goes without it)")
	}
}
