package agent

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

func volumeFiles() map[string][]byte {
	return map[string][]byte{
		KeyToken:      []byte("eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE4MDAwMDAwMDB9.c2ln\n"),
		KeyGriddConf:  []byte("FeatureType=1\n"),
		KeyReportURL:  []byte("http://127.0.0.1:9/v1/reports"),
		KeyNamespace:  []byte("tenant-foo"),
		KeyCredential: []byte("abcdefABCDEF0123456789_-"),
		"empty":       {},
	}
}

func TestReadVolumeAsKubeVirtBuildsIt(t *testing.T) {
	for _, variant := range [][]string{{"-joliet", "-rock"}, {"-rock"}, {"-joliet"}} {
		t.Run(strings.Join(variant, " "), func(t *testing.T) {
			want := volumeFiles()
			f, err := os.Open(buildISO(t, "LICENSECTL", want, variant...))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			label, err := LabelOf(f)
			if err != nil || label != "LICENSECTL" {
				t.Fatalf("label %q, %v", label, err)
			}
			v, err := ReadVolume(f)
			if err != nil {
				t.Fatal(err)
			}
			if v.Label != "LICENSECTL" || len(v.Files) != len(want) {
				t.Fatalf("got label %q files %v", v.Label, keys(v.Files))
			}
			for name, data := range want {
				if !bytes.Equal(v.Files[name], data) {
					t.Errorf("%s: got %q want %q", name, v.Files[name], data)
				}
			}
		})
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestReadVolumeMarksOversizedFiles(t *testing.T) {
	files := volumeFiles()
	files[KeyToken] = bytes.Repeat([]byte("x"), MaxVolumeFile+1)
	f, err := os.Open(buildISO(t, "LICENSECTL", files, "-joliet", "-rock"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := ReadVolume(f)
	if err != nil {
		t.Fatal(err)
	}
	if data, ok := v.Files[KeyToken]; !ok || data != nil {
		t.Fatalf("oversized token: present %v, %d bytes", ok, len(data))
	}
	if _, err := ParseLicense(v.Files); !errors.Is(err, ErrBadContent) {
		t.Fatalf("ParseLicense: %v", err)
	}
}

func TestNotAnISO(t *testing.T) {
	for _, data := range [][]byte{nil, make([]byte, 40*1024), append(make([]byte, 32768), []byte("\x01CD002")...)} {
		if _, err := ReadVolume(bytes.NewReader(data)); !errors.Is(err, ErrNotISO) {
			t.Errorf("%d bytes: %v", len(data), err)
		}
		if _, err := LabelOf(bytes.NewReader(data)); !errors.Is(err, ErrNotISO) {
			t.Errorf("%d bytes: %v", len(data), err)
		}
	}
}

func TestOpenVolumeFromImageAndFolder(t *testing.T) {
	img := buildISO(t, "OTHER", volumeFiles(), "-joliet", "-rock")
	v, err := OpenVolume(img)
	if err != nil || v.Label != "OTHER" || string(v.Files[KeyGriddConf]) != "FeatureType=1\n" {
		t.Fatalf("image: %v %v", v, err)
	}
	dir := t.TempDir()
	for n, d := range volumeFiles() {
		if err := os.WriteFile(dir+"/"+n, d, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	v, err = OpenVolume(dir)
	if err != nil || string(v.Files[KeyNamespace]) != "tenant-foo" {
		t.Fatalf("folder: %v %v", v, err)
	}
	if volumeWithLabel(img, "LICENSECTL") != nil || volumeWithLabel(img, "other") == nil {
		t.Fatal("the label decides (case-insensitively)")
	}
}

// sectorDevice behaves like a raw Windows device: it refuses reads not aligned to its sector size.
type sectorDevice struct {
	data   []byte
	sector int64
	reads  int
}

func (d *sectorDevice) ReadAt(p []byte, off int64) (int, error) {
	d.reads++
	if off%d.sector != 0 || int64(len(p))%d.sector != 0 {
		return 0, errors.New("The parameter is incorrect.")
	}
	if off >= int64(len(d.data)) {
		return 0, io.EOF
	}
	n := copy(p, d.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func TestReadVolumeFromARawDeviceReadsWholeSectors(t *testing.T) {
	img, err := os.ReadFile(buildISO(t, "LICENSECTL", volumeFiles(), "-joliet", "-rock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sector := range []int64{512, 2048} {
		dev := &sectorDevice{data: img, sector: sector}
		if _, err := ReadVolume(dev); err == nil {
			t.Fatalf("sector %d: unaligned reads must fail on the fake device", sector)
		}
		v, err := ReadVolume(alignedReader{dev})
		if err != nil || string(v.Files[KeyGriddConf]) != "FeatureType=1\n" || len(v.Files[KeyToken]) == 0 {
			t.Fatalf("sector %d: %v %v", sector, v, err)
		}
	}
	// A read past the end of the device still says EOF.
	if n, err := (alignedReader{&sectorDevice{data: img, sector: 2048}}).ReadAt(make([]byte, 10), int64(len(img))-4); n != 4 || err != io.EOF {
		t.Fatalf("%d %v", n, err)
	}
}
