package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"testing"
	"time"
)

func snapshotFile(t *testing.T, body []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(body)
	hdr, err := EncodeSnapshotHeader(&SnapshotInfo{Index: 9, Term: 2, CreatedAt: time.Unix(1700000000, 0).UTC(),
		NodeID: "n1", Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

func TestSnapshotFileRoundTrip(t *testing.T) {
	body := []byte("the state machine's bytes")
	info, r, err := ReadSnapshotFile(bytes.NewReader(snapshotFile(t, body)))
	if err != nil {
		t.Fatal(err)
	}
	if info.Format != SnapshotFileFormat || info.Index != 9 || info.Term != 2 || info.NodeID != "n1" || info.Size != int64(len(body)) {
		t.Fatalf("info = %+v", info)
	}
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("body = %q, %v", got, err)
	}
}

func TestSnapshotFileRefusesDamage(t *testing.T) {
	good := snapshotFile(t, []byte("0123456789"))
	corrupt := bytes.Clone(good)
	corrupt[len(corrupt)-1] ^= 1
	for name, file := range map[string][]byte{
		"truncated body": good[:len(good)-3],
		"corrupted body": corrupt,
		"trailing data":  append(bytes.Clone(good), 'x'),
		"bad magic":      append([]byte("NOT"), good...),
		"empty":          nil,
	} {
		_, r, err := ReadSnapshotFile(bytes.NewReader(file))
		if err == nil {
			_, err = io.ReadAll(r)
		}
		if !errors.Is(err, &Error{Code: CodeInvalidArgument}) {
			t.Errorf("%s: err = %v, want INVALID_ARGUMENT", name, err)
		}
	}
}
