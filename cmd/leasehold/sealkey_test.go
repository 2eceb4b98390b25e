package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/node"
)

// TestKeygen: keygen prints one line, the base64 of 32 fresh random bytes,
// which --seal-key-file reads back.
func TestKeygen(t *testing.T) {
	var keys []string
	for range 2 {
		a, out, _ := testApp(nil)
		if err := a.run(context.Background(), []string{"keygen"}); err != nil {
			t.Fatal(err)
		}
		if strings.Count(out.String(), "\n") != 1 {
			t.Fatalf("output %q is not one line", out)
		}
		keys = append(keys, out.String())
		path := filepath.Join(t.TempDir(), "seal.key")
		os.WriteFile(path, out.Bytes(), 0o600)
		k, err := loadSealKey(path, slog.New(slog.DiscardHandler))
		if err != nil || len(k) != node.SealKeyBytes {
			t.Fatalf("reading keygen's output back: %v (%d bytes)", err, len(k))
		}
	}
	if keys[0] == keys[1] {
		t.Fatal("keygen printed the same key twice")
	}
	a, _, _ := testApp(nil)
	if err := a.run(context.Background(), []string{"keygen", "extra"}); err == nil {
		t.Fatal("keygen took an argument")
	}
}

// TestSealKeySetup: --seal-key-file (or LEASEHOLD_SEAL_KEY_FILE) is read;
// a bad file is refused naming the file, never the content; without a key
// file a gossip key is used quietly, and without either the server warns
// about backups.
func TestSealKeySetup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seal.key")
	secret := base64.StdEncoding.EncodeToString([]byte("sixteen-byte-key"))
	os.WriteFile(path, []byte(secret+"\n"), 0o600)
	_, err := setupSealKey(path, nil, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "16 bytes") || strings.Contains(err.Error(), secret) {
		t.Fatalf("bad key file: %v", err)
	}
	raw := bytes.Repeat([]byte{7}, node.SealKeyBytes)
	os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(raw)), 0o600)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	k, err := setupSealKey(path, []byte("gossip-key-16byt"), log)
	if err != nil || !bytes.Equal(k, raw) || strings.Contains(logs.String(), "WARN") {
		t.Fatalf("good key file: %v %x; log %s", err, k, logs.String())
	}
	logs.Reset()
	if k, err := setupSealKey("", []byte("gossip-key-16byt"), log); err != nil || k != nil || strings.Contains(logs.String(), "WARN") {
		t.Fatalf("gossip key: %v %x; log %s", err, k, logs.String())
	}
	logs.Reset()
	if k, err := setupSealKey("", nil, log); err != nil || k != nil || !strings.Contains(logs.String(), "WARN") || !strings.Contains(logs.String(), "backups") {
		t.Fatalf("no key: %v %x; log %s", err, k, logs.String())
	}

	// The flag and its environment variable.
	a, _, _ := testApp(map[string]string{"LEASEHOLD_SEAL_KEY_FILE": path, "LEASEHOLD_SEAL_KEY_ROTATE": "true"})
	cfg, err := a.parseServerFlags(nil)
	if err != nil || cfg.sealKeyFile != path || !cfg.node.SealKeyRotate {
		t.Fatalf("from the environment: %v %q %v", err, cfg.sealKeyFile, cfg.node.SealKeyRotate)
	}
	// The server refuses a bad file before it creates its data directory.
	os.WriteFile(path, []byte("not a key"), 0o600)
	data := filepath.Join(dir, "data")
	a, _, _ = testApp(nil)
	err = a.serverCmd(context.Background(), []string{"--data-dir", data, "--http-addr", "127.0.0.1:0",
		"--raft-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0", "--seal-key-file", path})
	if err == nil || !strings.Contains(err.Error(), "--seal-key-file") {
		t.Fatalf("bad seal key file: %v", err)
	}
	if _, serr := os.Stat(data); !os.IsNotExist(serr) {
		t.Fatalf("the refused server created its data directory (%v)", serr)
	}
}
