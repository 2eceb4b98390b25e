package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// snapshotFileOf returns a snapshot file of body, its header true to it.
func snapshotFileOf(t *testing.T, body []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(body)
	hdr, err := wire.EncodeSnapshotHeader(&wire.SnapshotInfo{Index: 3, Term: 1, CreatedAt: time.Unix(1, 0).UTC(),
		NodeID: "n1", Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// writeSnapshotFile with check decodes the bytes while they are written:
// a good file is renamed into place with its state's summary; a file that
// does not check, or a write that fails, leaves neither the file nor its
// temporary behind, and says which of the two went wrong.
func TestWriteSnapshotFileChecksWhileWriting(t *testing.T) {
	var body bytes.Buffer
	if _, err := fsm.New().Snapshot().WriteTo(&body); err != nil {
		t.Fatal(err)
	}
	good := snapshotFileOf(t, body.Bytes())
	undecodable := snapshotFileOf(t, append([]byte("LHSNAP"), bytes.Repeat([]byte{0xff}, 1<<20)...))
	boom := errors.New("connection reset")
	for _, tc := range []struct {
		name  string
		write func(w io.Writer) error
		want  string // in the error; "" for none
	}{
		{"good", func(w io.Writer) error { return writeInPieces(w, good) }, ""},
		{"undecodable", func(w io.Writer) error { return writeInPieces(w, undecodable) }, "does not check"},
		{"bad magic", func(w io.Writer) error { return writeInPieces(w, bytes.Repeat([]byte("x"), 1<<20)) }, "does not check"},
		{"trailing bytes", func(w io.Writer) error { return writeInPieces(w, append(slices.Clone(good), 'x')) }, "does not check"},
		{"truncated", func(w io.Writer) error { return writeInPieces(w, good[:len(good)-1]) }, "does not check"},
		{"write fails", func(w io.Writer) error {
			if err := writeInPieces(w, good[:len(good)/2]); err != nil {
				return err
			}
			return boom
		}, boom.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "snap")
			info, err := writeSnapshotFile(file, func(w io.Writer) (*node.SnapshotInfo, error) {
				if err := tc.write(w); err != nil {
					return nil, err
				}
				return &node.SnapshotInfo{}, nil
			}, true)
			_, statErr := os.Stat(file)
			if _, tmpErr := os.Stat(file + ".tmp"); !os.IsNotExist(tmpErr) {
				t.Errorf("temporary file left behind: %v", tmpErr)
			}
			if tc.want == "" {
				if err != nil || info == nil || info.State == nil || info.Index != 3 || statErr != nil {
					t.Fatalf("info %+v, err %v, file %v", info, err, statErr)
				}
				if got, _ := os.ReadFile(file); !bytes.Equal(got, good) {
					t.Fatalf("file holds %d bytes, not the %d written", len(got), len(good))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || tc.want == boom.Error() && strings.Contains(err.Error(), "does not check") {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
			if !os.IsNotExist(statErr) {
				t.Fatalf("file written: %v", statErr)
			}
		})
	}
}

// writeInPieces writes p in pieces of 4 KiB, as a download does.
func writeInPieces(w io.Writer, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), 4096)
		if _, err := w.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}
