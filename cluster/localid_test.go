package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The cluster id survives a restart in cluster-id, a file that does not
// hold an id is refused, and the incarnation is kept once made.
func TestLocalIDPersists(t *testing.T) {
	dir := t.TempDir()
	valid := func(s string) error {
		if s == "" || strings.ContainsAny(s, " \t") {
			return errors.New("bad")
		}
		return nil
	}
	l, err := OpenLocalID(dir, valid)
	if err != nil || l.Get() != "" {
		t.Fatalf("new directory: %q, %v", l.Get(), err)
	}
	if err := l.Set("c1"); err != nil {
		t.Fatal(err)
	}
	l2, err := OpenLocalID(dir, valid)
	if err != nil || l2.Get() != "c1" {
		t.Fatalf("after a restart: %q, %v", l2.Get(), err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cluster-id"), []byte("not an id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenLocalID(dir, valid); err == nil || !strings.Contains(err.Error(), "delete the file") {
		t.Fatalf("a damaged file: %v", err)
	}
	mem, err := OpenLocalID("", valid)
	if err != nil || mem.Set("c2") != nil || mem.Get() != "c2" {
		t.Fatalf("in memory: %v", err)
	}
	inc, err := LoadIncarnation(dir)
	if err != nil || inc == "" {
		t.Fatalf("incarnation: %q, %v", inc, err)
	}
	if again, err := LoadIncarnation(dir); err != nil || again != inc {
		t.Fatalf("incarnation changed across a restart: %q then %q (%v)", inc, again, err)
	}
	if a, b := NewClusterID(), NewClusterID(); a == b || len(a) != 32 {
		t.Fatalf("new cluster ids %q, %q", a, b)
	}
}
