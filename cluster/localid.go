package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
)

// What a server keeps of its identity in its data directory, beside Raft's
// files: the cluster id it belongs to (cluster-id), so that it is known at
// the next start before any entry is applied, and the random id of the
// data directory itself (incarnation), which is how the cluster tells a
// server that lost its state from the one it added.

// LocalID is this server's copy of the cluster id, kept in the data
// directory's cluster-id file (or only in memory).
type LocalID struct {
	id      atomic.Pointer[string]
	path    string // "" in memory
	persist atomic.Pointer[string]
}

// OpenLocalID reads dir's cluster-id file ("" dir: in memory, no file); a
// missing file is no id yet. valid checks the file's content: a file that
// does not hold a cluster id is refused, with what to do.
func OpenLocalID(dir string, valid func(string) error) (*LocalID, error) {
	l := &LocalID{}
	empty := ""
	l.id.Store(&empty)
	if dir == "" {
		return l, nil
	}
	l.path = filepath.Join(dir, "cluster-id")
	b, err := os.ReadFile(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", l.path, err)
	}
	s := strings.TrimSpace(string(b))
	if valid != nil && valid(s) != nil {
		return nil, fmt.Errorf("%s does not hold a cluster id; if the data directory is otherwise intact, delete the file (the leader sets it again)", l.path)
	}
	l.id.Store(&s)
	l.persist.Store(&s)
	return l, nil
}

// Get is the id; "" while there is none.
func (l *LocalID) Get() string { return *l.id.Load() }

// Set makes id the server's cluster id and writes it to the data directory
// (once per change).
func (l *LocalID) Set(id string) error {
	l.id.Store(&id)
	if l.path == "" {
		return nil
	}
	if p := l.persist.Load(); p != nil && *p == id {
		return nil
	}
	if err := writeFileSync(l.path, id+"\n"); err != nil {
		return err
	}
	l.persist.Store(&id)
	return nil
}

// NewClusterID is a new random cluster id.
func NewClusterID() string { return randomHex(16) }

// LoadIncarnation returns the random id of data directory dir, creating it
// when missing ("" dir: in memory, a new one each time). A wiped data
// directory gets a new one.
func LoadIncarnation(dir string) (string, error) {
	if dir == "" {
		return randomHex(8), nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(dir, "incarnation")
	b, err := os.ReadFile(path)
	if err == nil {
		s := strings.TrimSpace(string(b))
		if s != "" && len(s) <= 64 {
			return s, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	inc := randomHex(8)
	if err := writeFileSync(path, inc+"\n"); err != nil {
		return "", err
	}
	return inc, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// writeFileSync replaces path with content durably (temporary file, sync,
// rename, directory sync).
func writeFileSync(path, content string) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.WriteString(content)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
