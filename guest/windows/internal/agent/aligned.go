package agent

import (
	"io"
	"unsafe"
)

// Raw Windows devices (\\.\CdRomN, \\.\PhysicalDriveN) accept only reads whose offset and length are
// multiples of the sector size, into sector-aligned memory. alignedReader turns any ReadAt into such
// reads: whole 2048-byte blocks (a multiple of 512- and 2048-byte sectors) into a 4096-aligned buffer.
type alignedReader struct{ r io.ReaderAt }

const alignBlock = 2048

func alignedBuffer(n int) []byte {
	raw := make([]byte, n+4096)
	shift := (4096 - int(uintptr(unsafe.Pointer(&raw[0]))%4096)) % 4096
	return raw[shift : shift+n]
}

// ReadAt reads the blocks covering [off, off+len(p)) and copies the requested part.
func (a alignedReader) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	start := off / alignBlock * alignBlock
	end := (off + int64(len(p)) + alignBlock - 1) / alignBlock * alignBlock
	buf := alignedBuffer(int(end - start))
	n, err := a.r.ReadAt(buf, start)
	got := n - int(off-start)
	if got < 0 {
		got = 0
	}
	copied := copy(p, buf[off-start:off-start+int64(got)])
	if copied < len(p) {
		if err == nil {
			err = io.EOF
		}
		return copied, err
	}
	return copied, nil
}
