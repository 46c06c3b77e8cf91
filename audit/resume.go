package audit

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
)

// maxResumeLine bounds how far back Resume looks for the start of the last
// line: a line longer than this is not one a trail wrote.
const maxResumeLine = 64 << 20

// Resume finds where the chain in a trail file ends, for
// TrailOptions.Resume, so that a restarted capsnap appending to the file
// continues its chain: the Link of the file's last line if that line is
// chained, and the zero Link (a new chain) if the file is empty or its
// last line is not chained (written before the trail was).
//
// A file that does not end in a newline ends in a line torn by a crash.
// Resume ends it with one, so that the next line starts whole, and the
// chain resumes from the last whole line: the torn line stays in the file,
// outside the chain, and Verify reports it. f must be open for reading
// and for appending.
func Resume(f *os.File) (Link, error) {
	fi, err := f.Stat()
	if err != nil {
		return Link{}, fmt.Errorf("audit: resume: %w", err)
	}
	size := fi.Size()
	if size == 0 {
		return Link{}, nil
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], size-1); err != nil {
		return Link{}, fmt.Errorf("audit: resume: %w", err)
	}
	end := size // just past the last whole line's newline
	if last[0] != '\n' {
		if end, err = lastNewline(f, size); err != nil {
			return Link{}, err
		}
		end++ // past it; 0 if there is none
		if _, err := f.Write([]byte("\n")); err != nil {
			return Link{}, fmt.Errorf("audit: resume: end the torn last line: %w", err)
		}
	}
	if end == 0 {
		return Link{}, nil
	}
	start, err := lastNewline(f, end-1)
	if err != nil {
		return Link{}, err
	}
	start++
	if end-1-start > maxResumeLine {
		return Link{}, nil
	}
	line := make([]byte, end-1-start)
	if _, err := f.ReadAt(line, start); err != nil {
		return Link{}, fmt.Errorf("audit: resume: %w", err)
	}
	seq, _, ok := parseLink(line)
	if !ok {
		return Link{}, nil
	}
	return Link{Seq: seq, Hash: sha256.Sum256(line)}, nil
}

// lastNewline is the offset of the last '\n' in f before offset before, or
// -1 if there is none within maxResumeLine of it.
func lastNewline(f io.ReaderAt, before int64) (int64, error) {
	buf := make([]byte, 64<<10)
	for end := before; end > 0 && before-end <= maxResumeLine; {
		n := min(int64(len(buf)), end)
		chunk := buf[:n]
		if _, err := f.ReadAt(chunk, end-n); err != nil {
			return 0, fmt.Errorf("audit: resume: %w", err)
		}
		if i := bytes.LastIndexByte(chunk, '\n'); i >= 0 {
			return end - n + int64(i), nil
		}
		end -= n
	}
	return -1, nil
}
