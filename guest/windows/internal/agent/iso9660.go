package agent

// A minimal ISO 9660 reader for the license volume. KubeVirt turns a Secret into an ISO 9660 image
// (Joliet and Rock Ridge, one file per key, all in the root directory). Windows mounts such an
// image reliably only from an optical drive, so the agent reads the image itself, from a raw device
// (\\.\CdRomN, \\.\PhysicalDriveN) or from an image file: the same code whatever the bus.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf16"
)

const (
	sectorSize = 2048
	// MaxVolumeFile bounds every file read from the volume (the Linux install script's limit too).
	MaxVolumeFile = 64 * 1024
	maxRootBytes  = 64 * 1024
	maxEntries    = 128
	maxDescriptor = 64 // volume descriptors scanned before giving up
)

// ErrNotISO says the device or file holds no ISO 9660 volume.
var ErrNotISO = errors.New("not an ISO 9660 volume")

// Volume is the root directory of an ISO 9660 image: its label and its files' contents.
type Volume struct {
	Label string
	Files map[string][]byte
}

type dirRecord struct {
	extent, size uint32
	dir          bool
	name         []byte
	systemUse    []byte
}

func readSector(r io.ReaderAt, lba uint32) ([]byte, error) {
	b := make([]byte, sectorSize)
	if _, err := r.ReadAt(b, int64(lba)*sectorSize); err != nil {
		return nil, err
	}
	return b, nil
}

func parseRecord(b []byte) (dirRecord, int) {
	n := int(b[0])
	if n < 34 || n > len(b) {
		return dirRecord{}, n
	}
	nameLen := int(b[32])
	if 33+nameLen > n {
		return dirRecord{}, -1
	}
	suStart := 33 + nameLen
	if nameLen%2 == 0 {
		suStart++ // padding byte after an even-length name
	}
	rec := dirRecord{
		extent: binary.LittleEndian.Uint32(b[2:6]),
		size:   binary.LittleEndian.Uint32(b[10:14]),
		dir:    b[25]&0x02 != 0,
		name:   b[33 : 33+nameLen],
	}
	if suStart < n {
		rec.systemUse = b[suStart:n]
	}
	return rec, n
}

// LabelOf reads only the primary volume descriptor: cheap enough to probe every candidate device.
func LabelOf(r io.ReaderAt) (string, error) {
	pvd, _, err := descriptors(r)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(pvd[40:72]), " \x00"), nil
}

// descriptors returns the primary volume descriptor and the Joliet one (nil when absent).
func descriptors(r io.ReaderAt) (pvd, joliet []byte, err error) {
	for i := uint32(0); i < maxDescriptor; i++ {
		s, err := readSector(r, 16+i)
		if err != nil {
			if pvd != nil {
				return pvd, joliet, nil
			}
			return nil, nil, ErrNotISO
		}
		if !bytes.Equal(s[1:6], []byte("CD001")) {
			break
		}
		switch s[0] {
		case 1:
			if pvd == nil {
				pvd = s
			}
		case 2:
			esc := s[88:91]
			if esc[0] == '%' && esc[1] == '/' && (esc[2] == '@' || esc[2] == 'C' || esc[2] == 'E') {
				joliet = s
			}
		case 255:
			i = maxDescriptor
		}
	}
	if pvd == nil {
		return nil, nil, ErrNotISO
	}
	return pvd, joliet, nil
}

func ucs2(b []byte) string {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		u = append(u, binary.BigEndian.Uint16(b[i:]))
	}
	return string(utf16.Decode(u))
}

// rockRidgeName is the NM entry of a record's System Use area ("" when there is none).
func rockRidgeName(su []byte) string {
	var name []byte
	for len(su) >= 4 {
		l := int(su[2])
		if l < 4 || l > len(su) {
			break
		}
		if su[0] == 'N' && su[1] == 'M' && l >= 5 {
			name = append(name, su[5:l]...)
		}
		su = su[l:]
	}
	return string(name)
}

func cleanName(name string) string {
	if i := strings.LastIndexByte(name, ';'); i >= 0 {
		name = name[:i]
	}
	return strings.TrimSuffix(name, ".")
}

// ReadVolume reads the label and every regular file of the root directory (each at most
// MaxVolumeFile bytes; larger files are listed with a nil content, so the caller can say why).
func ReadVolume(r io.ReaderAt) (*Volume, error) {
	pvd, joliet, err := descriptors(r)
	if err != nil {
		return nil, err
	}
	v := &Volume{Label: strings.TrimRight(string(pvd[40:72]), " \x00"), Files: map[string][]byte{}}
	desc := pvd
	if joliet != nil {
		desc = joliet
	}
	root, _ := parseRecord(desc[156 : 156+34])
	if root.size == 0 || root.size > maxRootBytes {
		return nil, fmt.Errorf("%w: root directory size %d", ErrNotISO, root.size)
	}
	dir := make([]byte, root.size)
	if _, err := r.ReadAt(dir, int64(root.extent)*sectorSize); err != nil {
		return nil, fmt.Errorf("reading the root directory: %w", err)
	}
	entries := 0
	for off := 0; off < len(dir); {
		if dir[off] == 0 { // records never cross a sector: skip to the next one
			off = (off/sectorSize + 1) * sectorSize
			continue
		}
		rec, n := parseRecord(dir[off:])
		if n <= 0 || n < 34 {
			return nil, fmt.Errorf("%w: bad directory record", ErrNotISO)
		}
		off += n
		if entries++; entries > maxEntries {
			return nil, fmt.Errorf("%w: too many directory entries", ErrNotISO)
		}
		if rec.dir || len(rec.name) == 1 && rec.name[0] <= 1 {
			continue
		}
		var name string
		switch {
		case joliet != nil:
			name = cleanName(ucs2(rec.name))
		case rockRidgeName(rec.systemUse) != "":
			name = rockRidgeName(rec.systemUse)
		default:
			name = strings.ToLower(cleanName(string(rec.name)))
		}
		if rec.size > MaxVolumeFile {
			v.Files[name] = nil
			continue
		}
		data := make([]byte, rec.size)
		if _, err := r.ReadAt(data, int64(rec.extent)*sectorSize); err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		v.Files[name] = data
	}
	return v, nil
}
