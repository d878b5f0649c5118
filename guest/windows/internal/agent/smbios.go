package agent

// The SMBIOS system UUID (KubeVirt sets it to the VMI's spec.domain.firmware.uuid), parsed from the
// raw table Windows returns for GetSystemFirmwareTable('RSMB').

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrNoUUID says the table has no usable system UUID.
var ErrNoUUID = errors.New("no SMBIOS system UUID")

// SMBIOSUUID finds the type 1 structure in a RawSMBIOSData blob and formats its UUID in lowercase
// 8-4-4-4-12 form. Since SMBIOS 2.6 the first three fields are little-endian (as Windows and Linux
// print them); older tables are taken as big-endian.
func SMBIOSUUID(raw []byte) (string, error) {
	if len(raw) < 8 {
		return "", ErrNoUUID
	}
	major, minor := raw[1], raw[2]
	n := int(binary.LittleEndian.Uint32(raw[4:8]))
	table := raw[8:]
	if n < len(table) {
		table = table[:n]
	}
	for off := 0; off+4 <= len(table); {
		typ, length := table[off], int(table[off+1])
		if length < 4 || off+length > len(table) {
			break
		}
		if typ == 1 && length >= 0x19 {
			u := make([]byte, 16)
			copy(u, table[off+8:off+24])
			if allBytes(u, 0) || allBytes(u, 0xff) {
				return "", ErrNoUUID
			}
			if major > 2 || major == 2 && minor >= 6 {
				u[0], u[1], u[2], u[3] = u[3], u[2], u[1], u[0]
				u[4], u[5] = u[5], u[4]
				u[6], u[7] = u[7], u[6]
			}
			return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
		}
		if typ == 127 {
			break
		}
		// skip the formatted area, then the string set (ends with two NULs)
		p := off + length
		for p+1 < len(table) && !(table[p] == 0 && table[p+1] == 0) {
			p++
		}
		off = p + 2
	}
	return "", ErrNoUUID
}

func allBytes(b []byte, v byte) bool {
	for _, c := range b {
		if c != v {
			return false
		}
	}
	return true
}
