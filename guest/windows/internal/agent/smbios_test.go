package agent

import (
	"encoding/binary"
	"errors"
	"testing"
)

// smbiosBlob builds a RawSMBIOSData blob (a derived sample, laid out as the SMBIOS specification
// says): a type 0 structure with strings, a type 1 with the given UUID bytes, the end marker.
func smbiosBlob(major, minor byte, uuid []byte) []byte {
	var table []byte
	table = append(table, 0, 0x18, 0, 0)
	table = append(table, make([]byte, 0x14)...)
	table = append(table, "SeaBIOS\x00vendor\x00\x00"...)
	t1 := []byte{1, 0x1b, 1, 0, 1, 2, 3, 4}
	t1 = append(t1, uuid...)
	t1 = append(t1, 6, 5, 6)
	table = append(table, t1...)
	table = append(table, "KubeVirt\x00None\x00\x00"...)
	table = append(table, 127, 4, 0xff, 0xfe, 0, 0)
	head := []byte{0, major, minor, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(head[4:], uint32(len(table)))
	return append(head, table...)
}

func TestSMBIOSUUID(t *testing.T) {
	// 5d307ca9-b3f3-428d-... with its first three fields little-endian, as SMBIOS 2.6+ stores them.
	raw := []byte{0xa9, 0x7c, 0x30, 0x5d, 0xf3, 0xb3, 0x8d, 0x42, 0x8b, 0xe6, 0x5b, 0x4c, 0x7e, 0x0a, 0xc3, 0xc2}
	got, err := SMBIOSUUID(smbiosBlob(3, 0, raw))
	if err != nil || got != "5d307ca9-b3f3-428d-8be6-5b4c7e0ac3c2" {
		t.Fatalf("%s %v", got, err)
	}
	// Before SMBIOS 2.6 the bytes are taken in order.
	got, err = SMBIOSUUID(smbiosBlob(2, 5, raw))
	if err != nil || got != "a97c305d-f3b3-8d42-8be6-5b4c7e0ac3c2" {
		t.Fatalf("2.5: %s %v", got, err)
	}
	for name, blob := range map[string][]byte{
		"zero uuid": smbiosBlob(3, 0, make([]byte, 16)),
		"short":     {0, 3, 0},
		"no type 1": smbiosBlob(3, 0, raw)[:8+0x18+17],
	} {
		if _, err := SMBIOSUUID(blob); !errors.Is(err, ErrNoUUID) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
